"""The run config → component settings map (``skyrl_train.wiring``): every key reaches the component it names."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.algorithms import AdvantageConfig, FixedKLController, PolicyLossConfig
from skyrl_train.backends import LoraConfig, TorchBackend
from skyrl_train.config import load_config, resolve
from skyrl_train.inference.base import SamplingParams
from skyrl_train.inference.factory import create_engine
from skyrl_train.inference.local import LocalEngine
from skyrl_train.inference.remote import Timeouts
from skyrl_train.trainer import LoopSettings
from skyrl_train.wiring import RunComponents, components_of, training_steps


def _parts(*overrides: str, total_steps: int = 1) -> RunComponents:
    return components_of(resolve(load_config(None, list(overrides))), total_steps=total_steps)


def _disagreements(settings: Any, exempt: frozenset[str], path: str = "") -> list[str]:
    """Fields of a settings dataclass (recursively) whose value differs from the class's own default."""
    found = []
    for f in dataclasses.fields(settings):
        name, value = f"{path}{f.name}", getattr(settings, f.name)
        if name in exempt:
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found += _disagreements(value, exempt, f"{name}.")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        if value != default:
            found.append(f"{type(settings).__name__}.{f.name}: class default {default!r}, config gives {value!r}")
    return found


def test_component_defaults_agree_with_the_config_defaults() -> None:
    # A settings class that keeps its own defaults must keep the config's: a run and a test that builds the
    # component by hand then mean the same thing. Derived values are exempt.
    parts = _parts()
    assert parts.loop == LoopSettings()
    assert _disagreements(parts.loop, frozenset()) == []
    assert _disagreements(parts.objective, frozenset({"policy_loss.max_seq_len"})) == []
    assert _disagreements(parts.policy, frozenset({"optimizer.total_steps"})) == []
    assert _disagreements(parts.generator, frozenset({"max_input_length"})) == []


def test_components_map_sections() -> None:
    parts = _parts(
        "generator.temperature=0.6",
        "generator.max_generate_length=64",
        "generator.stop=[</a>]",
        "generator.eval_temperature=0",
        "algorithm.eps_clip_high=0.28",
        "algorithm.loss_reduction=seq_mean_token_sum_norm",
        "algorithm.grpo_norm_by_std=false",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_coef=0.05",
        "off_policy.tis_ratio_type=token",
        "trainer.seed=7",
    )
    assert parts.sampling_params == SamplingParams(max_tokens=64, temperature=0.6, stop=("</a>",))
    assert parts.eval_sampling_params.temperature == 0.0
    assert parts.eval_sampling_params.max_tokens == 64
    assert parts.loop.advantage == AdvantageConfig(grpo_norm_by_std=False)
    assert parts.loop.logprob_temperature == pytest.approx(0.6)
    assert parts.loop.seed == 7
    assert isinstance(parts.objective.policy_loss, PolicyLossConfig)
    assert parts.objective.policy_loss.eps_clip_high == pytest.approx(0.28)
    assert parts.objective.policy_loss.max_seq_len == 64
    assert parts.objective.policy_loss.off_policy_correction.tis_ratio_type == "token"
    assert isinstance(parts.kl_controller, FixedKLController)
    assert parts.kl_controller.value == pytest.approx(0.05)
    assert parts.ref is not None  # KL in the reward needs the reference model
    assert _parts().kl_controller is None
    assert _parts().ref is None
    assert _parts().critic is None


def test_lora_target_modules_reach_the_lora_config() -> None:
    parts = _parts("model.lora_rank=4", "model.lora_target_modules=q_proj, v_proj", "model.critic_path=m")
    assert parts.policy.lora == LoraConfig(rank=4, alpha=16, target_modules=["q_proj", "v_proj"])
    assert parts.critic is not None
    assert parts.critic.lora.target_modules == ["q_proj", "v_proj"]
    assert _parts("model.lora_rank=4").policy.lora.target_modules == "all-linear"


def test_lora_target_modules_choose_the_adapted_layers(tiny_model_dir: Path) -> None:
    parts = _parts(f"model.path={tiny_model_dir}", "model.lora_rank=2", "model.lora_target_modules=q_proj,v_proj")
    backend = TorchBackend(parts.policy)
    adapted = {name.rsplit(".", 1)[-1] for name, module in backend.model.named_modules() if hasattr(module, "lora_A")}
    assert adapted == {"q_proj", "v_proj"}


@pytest.mark.parametrize("scheduler", ["linear", "cosine"])
def test_decaying_schedulers_get_the_runs_optimizer_steps(scheduler: str) -> None:
    parts = _parts(
        f"optim.scheduler={scheduler}",
        "model.critic_path=m",
        "trainer.train_batch_size=8",
        "trainer.policy_mini_batch_size=4",
        "trainer.update_epochs_per_batch=2",
        total_steps=3,
    )
    # 3 training steps x 2 update epochs x 2 mini-batches per epoch
    assert parts.policy.optimizer.total_steps == 12
    assert parts.critic is not None
    assert parts.critic.optimizer.total_steps == 12


def test_training_steps_of_a_run() -> None:
    trainer = load_config(None, ["trainer.epochs=3"]).trainer
    assert training_steps(trainer, steps_per_epoch=5) == 15
    limited = dataclasses.replace(trainer, max_training_steps=4)
    assert training_steps(limited, steps_per_epoch=5) == 4


def test_engine_settings_follow_the_inference_section() -> None:
    local = _parts("model.path=m", "model.dtype=bfloat16", "trainer.seed=5").engine
    assert (local.kind, local.model_path) == ("local", "m")
    assert local.options == {"dtype": "bfloat16", "seed": 5, "device": "cpu"}  # trainer.device, resolved here
    vllm = _parts(
        "inference.engine=vllm",
        "model.dtype=bfloat16",
        "inference.max_num_seqs=8",
        "inference.max_num_batched_tokens=512",
        "inference.enable_prefix_caching=false",
        "inference.enforce_eager=true",
        "inference.engine_kwargs={max_model_len: 256}",
    ).engine
    expected = {
        "dtype": "bfloat16",
        "seed": 42,
        "tensor_parallel_size": 1,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 512,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "max_model_len": 256,
    }
    assert {k: v for k, v in vllm.options.items() if k != "gpu_memory_utilization"} == expected
    assert ("gpu_memory_utilization" in vllm.options) == torch.cuda.is_available()
    unset = _parts("inference.engine=vllm").engine.options
    assert unset["max_num_seqs"] is None  # None: vLLM's own default
    remote = _parts(
        "inference.engine=remote", "inference.remote_urls=[http://h:1]", "inference.request_timeout_s=30"
    ).engine
    assert remote.options["base_url"] == "http://h:1"
    assert remote.options["timeouts"] == Timeouts(connect=Timeouts().connect, read=None, total=30.0)
    overridden = _parts("inference.engine_kwargs={dtype: float16}").engine
    assert overridden.options["dtype"] == "float16"  # explicit engine options win


@pytest.mark.parametrize("kind", ["local", "vllm", "remote"])
def test_engine_options_are_fields_of_the_engine_config(kind: str) -> None:
    from skyrl_train.inference.local import LocalEngineConfig
    from skyrl_train.inference.remote import RemoteEngineConfig
    from skyrl_train.inference.vllm_engine import VLLMEngineConfig

    settings = _parts(f"inference.engine={kind}", "inference.remote_urls=[http://h:1]").engine
    options = dict(settings.options)
    options.pop("base_url", None)  # create_engine's own argument for "remote"
    engine_config = {"local": LocalEngineConfig, "vllm": VLLMEngineConfig, "remote": RemoteEngineConfig}[kind]
    engine_config(**options)  # an option the engine does not know would raise TypeError


def test_local_engine_dtype_follows_model_dtype(tiny_model_dir: Path) -> None:
    settings = _parts(f"model.path={tiny_model_dir}", "model.dtype=bfloat16").engine
    engine = create_engine(settings.kind, settings.model_path, **settings.options)
    assert isinstance(engine, LocalEngine)
    try:
        assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    finally:
        asyncio.run(engine.close())
