"""End to end: the real loop on the tiny model (local engine, torch backend, gsm8k env), resume, bad input."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import skyrl_gym
from skyrl_gym.datasets import make_demo_dataset, write_dataset
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_train import cli
from skyrl_train.backends import TorchBackend
from skyrl_train.backends.critic import CriticBackend
from skyrl_train.config import Config, ConfigError, load_config, resolve, to_yaml, validate
from skyrl_train.inference.local import LocalEngine
from skyrl_train.run import _Session, critic_backend_config, run

pytestmark = pytest.mark.slow


class DistinctCharsEnv(BaseTextEnv):
    """Reward = distinct characters in the answer: varies across samples, so GRPO has a signal on the tiny model."""

    def __init__(self, env_config: object = None, extras: dict[str, object] | None = None) -> None:
        super().__init__()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        reward = min(len(set(action)), 20) / 20
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})


class FlatEnv(BaseTextEnv):
    """Reward 1 whatever the answer: every group of this env has zero reward variance."""

    def __init__(self, env_config: object = None, extras: dict[str, object] | None = None) -> None:
        super().__init__()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(observations=[], reward=1.0, done=True, metadata={})


@pytest.fixture(autouse=True)
def distinct_chars_env() -> Iterator[None]:
    skyrl_gym.register("test_distinct_chars", entry_point=DistinctCharsEnv)
    skyrl_gym.register("test_flat", entry_point=FlatEnv)
    yield
    skyrl_gym.deregister("test_distinct_chars")
    skyrl_gym.deregister("test_flat")


PPO = (
    "algorithm.advantage_estimator=gae",
    "algorithm.lambd=0.95",
    "optim.critic_lr=1e-3",
)


def _config(
    model: Path, data: Path, run_dir: Path, *extra: str, flat_rows: int = 0, env_class: str = "test_distinct_chars"
) -> Config:
    """The tiny run; the first ``flat_rows`` training prompts use :class:`FlatEnv` (no reward variance)."""
    rows = [
        {**row, "env_class": "test_flat" if index < flat_rows else env_class}
        for index, row in enumerate(make_demo_dataset("gsm8k", 8))
    ]
    train = write_dataset(rows, data / "train", ["jsonl"])[0]
    val = write_dataset(make_demo_dataset("gsm8k", 4, split="test"), data / "val", ["jsonl"])[0]
    return load_config(
        None,
        [
            f"model.path={model}",
            "model.gradient_checkpointing=false",
            f"data.train_data=[{train}]",
            f"data.val_data=[{val}]",
            f"trainer.run_dir={run_dir}",
            "trainer.train_batch_size=4",
            "trainer.policy_mini_batch_size=2",
            "trainer.micro_train_batch_size=4",
            "trainer.micro_forward_batch_size=8",
            "trainer.eval_interval=2",
            "trainer.logger=[jsonl]",
            "generator.n_samples_per_prompt=2",
            "generator.max_generate_length=8",
            "optim.lr=1e-3",
            "optim.scheduler=constant",
            *extra,
        ],
    )


def _metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "reward/mean" in row:  # training steps, not evaluations
            rows[row["step"]] = {
                k: v for k, v in row.items() if not k.startswith(("timing/", "generate/")) and k != "time"
            }
    return rows


# The engine's float noise: rollouts are batched (left-padded) as they arrive, and a batch's shape changes the
# last bits of each log-prob. Every other metric of a resumed step must match to the bit.
_NOISE_FLOORS = {"policy/rollout_logprob_gap": 1e-6}


def _assert_same_step(got: dict[str, float], expected: dict[str, float], step: int) -> None:
    assert got.keys() == expected.keys(), f"step {step} logs other metrics after resume"
    for key, value in expected.items():
        floor = _NOISE_FLOORS.get(key)
        if floor is None:
            assert got[key] == value, f"step {step}: {key} differs after resume"
        else:
            assert got[key] == pytest.approx(value, abs=floor), f"step {step}: {key} is beyond its noise floor"


def test_training_run_writes_checkpoint_export_and_plot(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = run(_config(tiny_model_dir, tmp_path / "data", tmp_path / "run", "trainer.max_training_steps=3"))
    assert result.global_step == 3
    assert [step for step, _ in result.eval_history] == [0, 2, 3]
    assert (result.run_dir / "config.yaml").exists()
    assert result.checkpoint is not None
    assert (result.checkpoint / "trainer_state.json").exists()
    assert result.plot is not None
    assert result.plot.exists()
    metrics = _metrics(result.run_dir)
    assert sorted(metrics) == [1, 2, 3]
    # On-policy: the trainer recomputes the engine's log-probabilities almost exactly.
    assert all(m["policy/rollout_logprob_gap"] < 1e-3 for m in metrics.values())
    # The reward has signal, so the policy actually moved.
    assert all(m["policy/grad_norm"] > 0 for m in metrics.values())
    # The timeline: busy fractions every step, a Chrome trace with every role's lane, and its picture.
    logged = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    for m in (row for row in logged if "reward/mean" in row):
        assert 0 < m["timing/engine_busy_fraction"] <= 1
        assert 0 < m["timing/trainer_busy_fraction"] <= 1
    assert result.timeline is not None
    assert result.timeline.stat().st_size > 0
    trace = json.loads((result.run_dir / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"trainer", "sync", "engine", "env"} <= lanes
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"prepare", "update", "weight sync", "generate", "step"} <= names
    from transformers import AutoModelForCausalLM

    assert result.export is not None
    AutoModelForCausalLM.from_pretrained(result.export)


def test_resumed_run_reproduces_the_uninterrupted_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    full = run(_config(tiny_model_dir, tmp_path / "d1", tmp_path / "full", "trainer.max_training_steps=4"))
    interrupted = _config(tiny_model_dir, tmp_path / "d2", tmp_path / "split", "trainer.max_training_steps=2")
    run(interrupted)
    resumed = run(_config(tiny_model_dir, tmp_path / "d2", tmp_path / "split", "trainer.max_training_steps=4"))
    assert resumed.global_step == 4
    expected, got = _metrics(full.run_dir), _metrics(resumed.run_dir)
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        _assert_same_step(got[step], expected[step], step)


def test_ppo_with_a_critic_trains_the_value_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    critic = f"model.critic_path={tiny_model_dir}"
    result = run(
        _config(tiny_model_dir, tmp_path / "data", tmp_path / "run", critic, *PPO, "trainer.max_training_steps=2")
    )
    assert result.global_step == 2
    metrics = _metrics(result.run_dir)
    assert sorted(metrics) == [1, 2]
    for step in metrics.values():
        assert step["critic/grad_norm"] > 0
        assert step["policy/grad_norm"] > 0
        assert 0.0 <= step["critic/vf_clip_frac"] <= 1.0
        assert step["critic/explained_variance"] <= 1.0
    assert metrics[1]["critic/value_loss"] != metrics[2]["critic/value_loss"]
    assert metrics[1]["critic/values_mean"] != metrics[2]["critic/values_mean"]
    # The critic was checkpointed next to the policy, and its weights moved away from their initial values.
    assert result.checkpoint is not None
    saved = load_file(result.checkpoint / "critic" / "model.safetensors")
    initial = CriticBackend(
        critic_backend_config(resolve(_config(tiny_model_dir, tmp_path / "d0", tmp_path / "r0", critic)))
    )
    assert not torch.equal(saved["score.weight"], initial.model.state_dict()["score.weight"])


@pytest.mark.parametrize(
    ("extra", "flat_rows", "metric"),
    [
        (("model.critic_path={model}", *PPO), 0, "critic/value_loss"),
        (("algorithm.dynamic_sampling=filter",), 4, "dynamic_sampling/sample_batches"),
    ],
    ids=["ppo_critic", "dynamic_sampling_filter"],
)
def test_resumed_run_reproduces_the_uninterrupted_metrics_with(
    extra: tuple[str, ...], flat_rows: int, metric: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The critic's model and optimizer, and the prompts dynamic sampling drew past the step's own batch, are
    # part of the checkpoint: resuming must continue exactly where the uninterrupted run was.
    overrides = [o.format(model=tiny_model_dir) for o in extra]

    def config(data: str, run_dir: str, steps: int) -> Config:
        limit = f"trainer.max_training_steps={steps}"
        return _config(tiny_model_dir, tmp_path / data, tmp_path / run_dir, *overrides, limit, flat_rows=flat_rows)

    full = run(config("d1", "full", 4))
    run(config("d2", "split", 2))
    resumed = run(config("d2", "split", 4))
    assert resumed.global_step == 4
    expected, got = _metrics(full.run_dir), _metrics(resumed.run_dir)
    assert sorted(got) == [1, 2, 3, 4]
    assert metric in got[3]
    for step in (3, 4):
        _assert_same_step(got[step], expected[step], step)


def test_dynamic_sampling_filter_draws_more_prompts(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Half the prompts never vary in reward, so filling a step's 4 groups needs more than one batch of 4 prompts.
    config = _config(
        tiny_model_dir,
        tmp_path / "data",
        tmp_path / "run",
        "algorithm.dynamic_sampling=filter",
        "trainer.max_training_steps=2",
        "trainer.eval_before_train=false",
        flat_rows=4,
    )
    result = run(config)
    assert result.global_step == 2
    for step in _metrics(result.run_dir).values():
        assert step["dynamic_sampling/sample_batches"] >= 2
        assert step["dynamic_sampling/groups_kept"] == 4
        assert step["dynamic_sampling/groups_informative"] <= step["dynamic_sampling/groups_sampled"] - 2
        assert step["policy/optimizer_steps"] == 2  # 4 groups in mini-batches of 2: a full step


def test_bad_input_fails_before_any_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"did you mean trainer\.train_batch_size"):
        load_config(None, ["trainer.train_batch_sise=4"])
    assert (
        cli.main(["model.path=/nonexistent/model", "trainer.train_batch_size=3", "trainer.policy_mini_batch_size=2"])
        == 2
    )
    err = capsys.readouterr().err
    assert "/nonexistent/model" in err
    assert "policy_mini_batch_size" in err
    assert cli.main(["environment.env_class=gsm9k", "model.path=/nonexistent"]) == 2
    assert "gsm9k" in capsys.readouterr().err


def test_prompts_all_too_long_are_an_error_line_not_a_traceback(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tiny_model_dir, tmp_path / "data", tmp_path / "run", "data.max_prompt_length=8")
    config_file = tmp_path / "run.yaml"
    config_file.write_text(to_yaml(config))
    assert cli.main(["--config", str(config_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no prompts left")
    assert "raise data.max_prompt_length" in err


def test_the_entropy_bonus_logs_the_entropy(tiny_model_dir: Path, tmp_path: Path) -> None:
    steps = ("trainer.max_training_steps=1", "algorithm.entropy_loss_coef=0.01")
    result = run(_config(tiny_model_dir, tmp_path / "data", tmp_path / "run", *steps))
    assert _metrics(result.run_dir)[1]["policy/entropy"] > 0


def test_one_mini_batch_step_reuses_the_update_forward_on_one_compute_thread(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    extra = ("trainer.policy_mini_batch_size=4", "trainer.eval_before_train=false")  # one mini-batch per step
    config = resolve(_config(tiny_model_dir, tmp_path / "data", tmp_path / "run", *extra))
    validate(config)

    async def one_step() -> tuple[dict[str, float], int]:
        session = await _Session.open(config)
        try:
            policy = session.trainer.policy
            assert isinstance(policy, TorchBackend)
            assert isinstance(session.engine, LocalEngine)
            assert session.compute is not None
            assert policy.compute is session.compute
            assert session.engine._compute is session.compute
            forwards = 0
            forward = policy.forward

            def counting_forward(*args: Any, **kwargs: Any) -> Any:
                nonlocal forwards
                forwards += 1
                return forward(*args, **kwargs)

            policy.forward = counting_forward  # type: ignore[method-assign]
            metrics = await session.trainer.train_step(next(session.loader.stream()))
        finally:
            await session.close()
        return metrics, forwards

    metrics, forwards = asyncio.run(one_step())
    assert forwards == 0  # the old log-probs came from the update's forward pass
    assert metrics["policy/optimizer_steps"] == 1.0
    assert metrics["policy/rollout_logprob_gap"] < 1e-3  # engine and training forward agree


def test_session_start_seeds_python_numpy_and_torch(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = resolve(_config(tiny_model_dir, tmp_path / "data", tmp_path / "run", "trainer.seed=1234"))
    draws = []
    for _ in range(2):
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        _Session(config)
        draws.append((random.random(), np.random.random(), torch.rand(1).item()))
    assert draws[0] == draws[1]
    assert draws[0][0] == random.Random(1234).random()
    assert draws[0][1] == np.random.RandomState(1234).random_sample()
    assert draws[0][2] == torch.rand(1, generator=torch.Generator().manual_seed(1234)).item()


@pytest.mark.parametrize("scheduler", ["linear", "cosine"])
def test_decaying_lr_schedules_reach_zero_at_the_end_of_the_run(
    scheduler: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # 2 steps x 2 mini-batches = 4 optimizer steps; each step logs the mean lr of its two optimizer steps.
    extra = (f"optim.scheduler={scheduler}", "trainer.max_training_steps=2", "trainer.eval_before_train=false")
    result = run(_config(tiny_model_dir, tmp_path / "data", tmp_path / "run", *extra))
    assert result.global_step == 2
    metrics = _metrics(result.run_dir)
    if scheduler == "linear":
        factors = [1.0, 0.75, 0.5, 0.25]
    else:
        factors = [0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(4)]
    for step, pair in ((1, factors[:2]), (2, factors[2:])):
        assert metrics[step]["policy/lr"] == pytest.approx(1e-3 * sum(pair) / 2)


def test_export_interval_exports_every_n_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    extra = ("trainer.export_interval=2", "trainer.max_training_steps=3", "trainer.eval_before_train=false")
    result = run(_config(tiny_model_dir, tmp_path / "data", tmp_path / "run", *extra))
    exports = result.run_dir / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["global_step_2", "global_step_3"]  # step 2, then the end
    assert result.export == exports / "global_step_3"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(exports / "global_step_2")


# -- FSDP2 worker groups on Ray ---------------------------------------------------------------------------------

FSDP = (
    "trainer.backend=fsdp",
    "trainer.num_training_workers=2",
    "trainer.num_cpus_per_worker=0.25",
    "trainer.micro_train_batch_size=2",  # per rank: 2 of a mini-batch's 4 rows
)


@pytest.mark.ray
def test_fsdp_worker_groups_train_as_the_in_process_backend_does(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two gloo ranks per model, policy and critic: the first step's losses and norms are the one-process ones."""
    critic = (f"model.critic_path={tiny_model_dir}", *PPO, "trainer.max_training_steps=2")
    local = run(_config(tiny_model_dir, tmp_path / "d1", tmp_path / "local", *critic))
    group = run(_config(tiny_model_dir, tmp_path / "d2", tmp_path / "fsdp", *critic, *FSDP))
    assert group.global_step == 2
    expected, got = _metrics(local.run_dir), _metrics(group.run_dir)
    assert got[1]["system/num_policy_workers"] == 2.0
    assert expected[1]["system/num_policy_workers"] == 1.0
    for key in ("reward/mean", "policy/loss", "policy/pg_loss", "policy/grad_norm", "critic/value_loss"):
        assert got[1][key] == pytest.approx(expected[1][key], rel=1e-4, abs=1e-6), key
    assert group.checkpoint is not None
    assert (group.checkpoint / "dcp").is_dir()  # the sharded checkpoint, the critic's beside it
    assert (group.checkpoint / "critic" / "dcp").is_dir()
    from transformers import AutoModelForCausalLM

    assert group.export is not None
    AutoModelForCausalLM.from_pretrained(group.export)


@pytest.mark.ray
def test_reference_and_critic_groups_take_their_own_rank_counts(tiny_model_dir: Path, tmp_path: Path) -> None:
    """trainer.ref_num_workers=1 and trainer.critic_num_workers=1 beside a policy group of 2 ranks (KL loss, PPO)."""
    sizes = ("trainer.ref_num_workers=1", "trainer.critic_num_workers=1")
    extra = (*FSDP, *sizes, "algorithm.use_kl_loss=true", f"model.critic_path={tiny_model_dir}", *PPO)
    steps = ("trainer.max_training_steps=2", "trainer.eval_before_train=false")
    config = resolve(_config(tiny_model_dir, tmp_path / "data", tmp_path / "run", *extra, *steps))
    validate(config)

    async def train() -> tuple[dict[str, int], int]:
        session = await _Session.open(config)
        try:
            models = {name: getattr(session.trainer, name) for name in ("policy", "ref", "critic")}
            assert list(models.values()) == session.worker_groups  # every model is one of the run's worker groups
            ranks = {name: model.num_workers for name, model in models.items()}
            return ranks, (await session.train()).global_step
        finally:
            await session.close()

    ranks, global_step = asyncio.run(train())
    assert ranks == {"policy": 2, "ref": 1, "critic": 1}
    assert global_step == 2
    metrics = _metrics(Path(config.trainer.run_dir))
    assert sorted(metrics) == [1, 2]
    for step in metrics.values():
        assert all(math.isfinite(value) for value in step.values()), step
        assert step["system/num_policy_workers"] == 2.0
        assert step["policy/grad_norm"] > 0
        assert step["critic/grad_norm"] > 0
    assert metrics[2]["policy/kl"] > 0  # the reference's log-probs, against a policy that has moved


@pytest.mark.ray
def test_two_engine_actors_serve_the_rollouts_one_engine_would(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Seeded sampling does not depend on which engine answers: step 1's rollouts are the one-engine rollouts."""
    steps = "trainer.max_training_steps=2"
    local = run(_config(tiny_model_dir, tmp_path / "d1", tmp_path / "one", steps))
    engines = ("inference.num_engines=2", "inference.num_cpus_per_engine=0.5")
    grouped = run(_config(tiny_model_dir, tmp_path / "d2", tmp_path / "two", steps, *engines))
    assert grouped.global_step == 2
    expected, got = _metrics(local.run_dir), _metrics(grouped.run_dir)
    assert got[1]["system/num_engines"] == 2.0
    assert expected[1]["system/num_engines"] == 1.0
    for key in ("reward/mean", "policy/loss", "policy/grad_norm"):
        assert got[1][key] == pytest.approx(expected[1][key], rel=1e-5, abs=1e-7), key
    assert got[2]["policy/rollout_logprob_gap"] < 1e-3  # the engines got step 1's weights


@pytest.mark.ray
def test_fsdp_groups_bigger_than_the_cluster_fail_before_any_model_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tiny_model_dir, tmp_path / "d", tmp_path / "run", *FSDP, "trainer.num_cpus_per_worker=64")
    with pytest.raises(RuntimeError, match=r"ask Ray for 128 CPUs .* lower trainer\.num_cpus_per_worker"):
        run(config)
    import ray

    assert not ray.is_initialized()  # the run started Ray, and stopped it on the way out


@pytest.mark.ray
@pytest.mark.vllm
def test_tensor_parallel_engines_ask_the_cluster_for_all_their_gpus(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two vLLM engines of tensor_parallel_size=2 need 4 GPUs; a CPU-only cluster is refused before vLLM starts."""
    tp = ("inference.engine=vllm", "inference.num_engines=2", "inference.tensor_parallel_size=2")
    config = _config(tiny_model_dir, tmp_path / "d", tmp_path / "run", *tp, "inference.num_gpus_per_engine=2")
    expected = r"ask Ray for 4 GPUs \(inference\.num_engines=2 of inference\.tensor_parallel_size=2 GPUs each × "
    with pytest.raises(RuntimeError, match=expected + r"inference\.num_gpus_per_engine=2\) but the cluster has 0"):
        run(config)
    import ray

    assert not ray.is_initialized()


@pytest.mark.ray
def test_a_sigkilled_fsdp_run_resumes_to_the_uninterrupted_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Killed without warning after its step-2 checkpoint, the run resumes from it and logs what it would have."""
    steps = ("trainer.max_training_steps=4", "trainer.ckpt_interval=2", *FSDP)
    full = run(_config(tiny_model_dir, tmp_path / "d1", tmp_path / "full", *steps))
    split = tmp_path / "split"
    config = _config(tiny_model_dir, tmp_path / "d2", split, *steps)
    config_file = tmp_path / "split.yaml"
    config_file.write_text(to_yaml(config))
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLABLE_RUN, str(config_file), str(Path(__file__).parent)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    checkpoint = split / "checkpoints" / "global_step_2" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not checkpoint.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert checkpoint.exists(), "the child run never wrote its step-2 checkpoint"
    os.killpg(child.pid, signal.SIGKILL)  # the driver and everything it started, without warning
    assert child.wait() == -signal.SIGKILL  # killed mid-run, not finished
    resumed = run(_config(tiny_model_dir, tmp_path / "d2", split, *steps))
    assert resumed.global_step == 4
    expected, got = _metrics(full.run_dir), _metrics(resumed.run_dir)
    for step in (3, 4):
        _assert_same_step(got[step], expected[step], step)


_KILLABLE_RUN = """
import sys
import skyrl_gym
from skyrl_train.config import load_config
from skyrl_train.run import run
sys.path.insert(0, sys.argv[2])
from test_run import DistinctCharsEnv, FlatEnv  # the run's envs, registered as this test module does
skyrl_gym.register("test_distinct_chars", entry_point=DistinctCharsEnv)
skyrl_gym.register("test_flat", entry_point=FlatEnv)
run(load_config(sys.argv[1], []), echo_config=False)
"""


@pytest.mark.ray
def test_env_workers_hold_the_runs_envs(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """environment.num_env_workers=2: every env of the run is made in a worker actor, and none fails there."""
    from skyrl_train.generators.env_workers import EnvWorkers

    made: list[str] = []
    make = EnvWorkers.make

    async def counting_make(self: EnvWorkers, env_class: str, *args: Any) -> Any:
        made.append(env_class)
        return await make(self, env_class, *args)

    monkeypatch.setattr(EnvWorkers, "make", counting_make)
    workers = ("environment.num_env_workers=2", "environment.num_cpus_per_env_worker=0.5")
    # gsm8k: built in, so registered in the workers too (the test's own envs exist only in this process)
    config = _config(
        tiny_model_dir, tmp_path / "d", tmp_path / "run", "trainer.max_training_steps=1", *workers, env_class="gsm8k"
    )
    result = run(config)
    assert result.global_step == 1
    step = _metrics(result.run_dir)[1]
    assert not [key for key in step if key in ("rollout/stop_env_error", "rollout/stop_timeout")]  # no env failed
    # 4 prompts × 2 samples for the step, and the 4 eval prompts evaluated before training and after the step
    assert made.count("gsm8k") == 4 * 2 + 2 * 4


@pytest.mark.ray
def test_ray_address_joins_a_running_cluster(tiny_model_dir: Path, tmp_path: Path) -> None:
    """6 CPUs of worker groups fit only the 8-CPU cluster started here, never a new local one of this machine."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8})
    try:
        big = ("trainer.num_cpus_per_worker=3", f"ray.address={cluster.address}", "trainer.max_training_steps=1")
        result = run(_config(tiny_model_dir, tmp_path / "d", tmp_path / "run", *FSDP, *big))
        assert result.global_step == 1
    finally:
        cluster.shutdown()
