"""The run config's keys: one frozen dataclass per section, every field with a comment saying what it does.

This module is the schema only: keys, types, defaults, and the removed keys that fail to load. Reading YAML and
``a.b=c`` overrides into it is :mod:`skyrl_train.config.loading`, which parses a command-line string by the
field's annotation (so annotations stay within what it parses: scalars, ``Literal``, ``X | None``, lists and
string-keyed mappings). A field whose comment says "derived" is filled by
:func:`skyrl_train.config.derived.resolve`; values are checked by :mod:`skyrl_train.config.validation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from skyrl_train.algorithms.filtering import DynamicSamplingType
from skyrl_train.algorithms.kl import KLEstimatorName
from skyrl_train.algorithms.off_policy import OffPolicyCorrectionConfig
from skyrl_train.algorithms.reductions import LossReduction

__all__ = [
    "REMOVED_KEYS",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvironmentConfig",
    "GeneratorSection",
    "InferenceConfig",
    "LoggerName",
    "ModelConfig",
    "OptimConfig",
    "RayConfig",
    "TrainerConfig",
    "WorkerGroupRole",
    "lora_target_modules",
    "worker_group_size",
]

LoggerName = Literal["console", "jsonl", "tensorboard", "wandb"]
WorkerGroupRole = Literal["policy", "ref", "critic"]  # the models a trainer.backend=fsdp run puts in worker groups

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
    """A whole run. Sections are documented in the :mod:`skyrl_train.config` docstring."""

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
