"""The one place a run config is read: it becomes the typed settings of everything the run builds and does.

Components take their own settings, never the root :class:`~skyrl_train.config.Config`; this module is the map
between the two, so each config key is read here and nowhere else. :mod:`skyrl_train.compose` then builds the live
objects from these settings alone, and :mod:`skyrl_train.run` runs them::

    run = run_settings(config)                             # data, outputs: needed before the datasets load
    parts = components_of(config, total_steps=training_steps(config.trainer, len(loader)))
    policy = TorchBackend(parts.policy, compute)          # parts.ref and parts.critic alike; None: not built
    engine = create_engine(parts.engine.kind, parts.engine.model_path, compute=compute, **parts.engine.options)
    generator = SkyRLGymGenerator(engine, tokenizer, parts.generator)  # or parts.factory (generators.factory)
    trainer = Trainer(settings=parts.loop, objective=parts.objective, sampling_params=parts.sampling_params, ...)

The config is resolved once, by :func:`components_of` and :func:`run_settings`; every other function here takes a
resolved config (:func:`skyrl_train.config.resolve`). Nothing here loads a model, opens a file or starts a thread.
Every value is a frozen settings object except the KL controller, the small stateful object that adapts ``beta``
during the run (a fresh one per call).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from skyrl_train.actor_specs import ActorDemand, PlacementMode, RoleSpec
from skyrl_train.algorithms import AdvantageConfig, KLController, make_kl_controller
from skyrl_train.algorithms.policy_losses import CISPOConfig, ClipCovConfig, KLCovConfig, PolicyLossConfig, SAPOConfig
from skyrl_train.async_buffer import StreamSettings
from skyrl_train.backends.config import BackendConfig, LoraConfig, OptimizerConfig
from skyrl_train.config import (
    Config,
    TrainerConfig,
    WorkerGroupRole,
    lora_target_modules,
    resolve,
    to_dict,
    worker_group_size,
)
from skyrl_train.generators.factory import FactorySettings
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig
from skyrl_train.inference.base import SamplingParams
from skyrl_train.inference.factory import EngineKind
from skyrl_train.inference.remote import Timeouts
from skyrl_train.loop_settings import LoopSettings
from skyrl_train.modes.base import Schedule
from skyrl_train.objective import Objective

__all__ = [
    "ActorSettings",
    "DataSettings",
    "EngineSettings",
    "EnvWorkerSettings",
    "OutputSettings",
    "RunComponents",
    "RunSettings",
    "actor_settings",
    "backend_config",
    "components_of",
    "critic_backend_config",
    "engine_settings",
    "generator_config",
    "generator_factory",
    "kl_controller",
    "loop_settings",
    "objective_of",
    "optimizer_steps",
    "run_settings",
    "sampling_params",
    "stream_settings",
    "training_actors",
    "training_steps",
]


@dataclass(frozen=True)
class EngineSettings:
    """What :func:`~skyrl_train.inference.factory.create_engine` is called with."""

    kind: EngineKind  # "local", "vllm" or "remote"
    model_path: str  # the weights it serves; for "remote", the served model's name
    options: Mapping[str, Any]  # fields of that engine's config class (``base_url`` too, for "remote")
    replicas: int = 1  # > 1: an EngineGroup of that many Ray actors (skyrl_train.inference.ray_engines)
    cpus_per_replica: float = 1.0  # Ray resources of each replica's actor
    gpus_per_replica: float = 0.0


@dataclass(frozen=True)
class EnvWorkerSettings:
    """``environment.num_env_workers > 0``: Ray actors that hold the run's envs (any node with free CPUs)."""

    count: int
    cpus_per_worker: float
    concurrency: int  # env calls each actor runs at once


@dataclass(frozen=True)
class ActorSettings:
    """Which roles leave this process as Ray actors, how much each asks for, and how they share machines."""

    backend: Literal["torch", "fsdp"]  # models in this process, or FSDP2 worker groups on Ray actors
    worker_groups: tuple[RoleSpec, ...]  # fsdp: the policy's (reference's, critic's) ranks, in that order
    placed: tuple[RoleSpec, ...]  # the roles given placement-group bundles: the worker groups, then the engines
    demands: tuple[ActorDemand, ...]  # every actor the cluster must hold: checked before any model loads
    placement: PlacementMode  # colocate: roles share placement-group bundles; disaggregate: each has its own
    ray_address: str | None  # the cluster to join; None: RAY_ADDRESS or a new local one
    dist_backend: Literal["nccl", "gloo"]  # the worker groups' collectives (nccl on cuda)
    weight_broadcast: Literal["nccl", "gloo"]  # rank 0 → engine actors: nccl when all have GPUs of their own
    env_workers: EnvWorkerSettings | None = None

    @property
    def needs_ray(self) -> bool:
        """Whether any role runs in a Ray actor."""
        return bool(self.demands)


@dataclass(frozen=True)
class RunComponents:
    """The settings of every component of one run, from one resolved config."""

    policy: BackendConfig
    ref: BackendConfig | None  # the frozen reference model; None unless a KL term needs it
    critic: BackendConfig | None  # the value model; None unless model.critic_path is set
    engine: EngineSettings
    generator: GeneratorConfig
    loop: LoopSettings
    objective: Objective
    sampling_params: SamplingParams  # training rollouts
    eval_sampling_params: SamplingParams  # evaluation rollouts
    kl_controller: KLController | None  # beta of the KL penalty in the reward; None unless use_kl_in_reward
    stream: StreamSettings  # fully_async: the rollout stream (batch size, staleness bound, groups in flight)
    factory: FactorySettings | None = None  # the function that builds the generator; None: SkyRLGymGenerator
    actors: ActorSettings | None = None  # None: every role in this process (no Ray)
    schedule: Schedule = field(default_factory=lambda: Schedule(total_steps=0))


@dataclass(frozen=True)
class DataSettings:
    """The prompt datasets, their tokenizer and their loader (``data`` section, ``model.path``)."""

    tokenizer_path: str
    train_data: tuple[str, ...]
    val_data: tuple[str, ...]  # empty: no evaluation
    default_env_class: str  # env id for rows without an env_class column
    max_prompt_length: int  # longer chat-templated prompts are dropped
    chat_template_kwargs: Mapping[str, Any]
    batch_size: int  # prompts per training step
    seed: int  # the per-epoch shuffle
    shuffle: bool
    drop_last: bool


@dataclass(frozen=True)
class OutputSettings:
    """What a run writes and when: tracking, evaluations, checkpoints, exports; and where it resumes from."""

    run_dir: Path
    run_name: str
    seed: int  # python, numpy and torch at start
    config: Mapping[str, Any]  # the resolved config as plain data: stored with the tracker and every checkpoint
    loggers: tuple[str, ...]
    project_name: str
    log_samples_per_step: int
    eval_interval: int  # <= 0: no periodic evaluation
    eval_before_train: bool
    ckpt_path: str
    ckpt_interval: int  # <= 0: only at the end
    max_ckpts_to_keep: int  # -1: all
    export_path: str
    export_interval: int  # <= 0: only at the end
    base_model: str  # what an export's config and tokenizer files come from (model.path)
    resume_mode: Literal["none", "latest", "from_path"]
    resume_path: str | None
    groups_per_step: int  # a checkpoint without a group count: groups started = steps · this (fully_async)


@dataclass(frozen=True)
class RunSettings:
    """What the run itself needs before its components are built."""

    data: DataSettings
    outputs: OutputSettings
    epochs: int  # passes over the training prompts
    max_training_steps: int | None  # None: epochs · steps per epoch

    def total_steps(self, steps_per_epoch: int) -> int:
        """Training steps of the run: ``max_training_steps``, else ``epochs`` passes of ``steps_per_epoch``."""
        return self.max_training_steps if self.max_training_steps is not None else self.epochs * steps_per_epoch


def run_settings(config: Config) -> RunSettings:
    """The data and output settings of ``config`` (resolved here)."""
    config = resolve(config)
    d, t = config.data, config.trainer
    assert t.ckpt_path is not None  # derived by resolve()
    assert t.export_path is not None
    data = DataSettings(
        tokenizer_path=config.model.path,
        train_data=tuple(d.train_data),
        val_data=tuple(d.val_data),
        default_env_class=config.environment.env_class,
        max_prompt_length=d.max_prompt_length,
        chat_template_kwargs=config.generator.chat_template_kwargs,
        batch_size=t.train_batch_size,
        seed=d.seed,
        shuffle=d.shuffle,
        drop_last=d.drop_last,
    )
    outputs = OutputSettings(
        run_dir=Path(t.run_dir),
        run_name=t.run_name or Path(t.run_dir).name,
        seed=t.seed,
        config=to_dict(config),
        loggers=tuple(t.logger),
        project_name=t.project_name,
        log_samples_per_step=t.log_samples_per_step,
        eval_interval=t.eval_interval,
        eval_before_train=t.eval_before_train,
        ckpt_path=t.ckpt_path,
        ckpt_interval=t.ckpt_interval,
        max_ckpts_to_keep=t.max_ckpts_to_keep,
        export_path=t.export_path,
        export_interval=t.export_interval,
        base_model=config.model.path,
        resume_mode=t.resume_mode,
        resume_path=t.resume_path,
        groups_per_step=t.train_batch_size,
    )
    return RunSettings(data=data, outputs=outputs, epochs=t.epochs, max_training_steps=t.max_training_steps)


def components_of(config: Config, *, total_steps: int) -> RunComponents:
    """Every component's settings for ``config``; ``total_steps`` is the run's training steps (:func:`training_steps`).

    The config is resolved first (a no-op on a resolved one); it is not validated here.
    """
    config = resolve(config)
    alg = config.algorithm
    sampling, eval_sampling = sampling_params(config)
    needs_ref = alg.use_kl_loss or alg.use_kl_in_reward
    ref = backend_config(config, path=config.model.ref_path, trainable=False, total_steps=total_steps)
    critic = critic_backend_config(config, total_steps=total_steps) if config.model.critic_path else None
    engine = engine_settings(config)
    return RunComponents(
        policy=backend_config(config, total_steps=total_steps),
        ref=ref if needs_ref else None,
        critic=critic,
        engine=engine,
        generator=generator_config(config),
        loop=loop_settings(config),
        objective=objective_of(config),
        sampling_params=sampling,
        eval_sampling_params=eval_sampling,
        kl_controller=kl_controller(config),
        stream=stream_settings(config),
        factory=generator_factory(config),
        actors=actor_settings(config, engine, with_ref=needs_ref, with_critic=critic is not None),
        schedule=Schedule(total_steps=total_steps, ckpt_interval=config.trainer.ckpt_interval),
    )


def actor_settings(
    config: Config, engine: EngineSettings, *, with_ref: bool, with_critic: bool
) -> ActorSettings | None:
    """The run's Ray actors (training worker groups, engine replicas, env workers); None when it has none."""
    t, env = config.trainer, config.environment
    demands: list[ActorDemand] = []
    groups: list[RoleSpec] = []
    if t.backend == "fsdp":
        models: list[WorkerGroupRole] = ["policy"]
        models += ["ref"] if with_ref else []
        models += ["critic"] if with_critic else []
        roles, demand = training_actors(t, models)
        groups, demands = list(roles), [demand]
    placed = list(groups)
    if engine.replicas > 1:
        demands.append(_engine_demand(config, engine))
        placed.append(RoleSpec("engines", engine.replicas, engine.cpus_per_replica, engine.gpus_per_replica))
    env_workers = None
    if env.num_env_workers > 0:
        env_workers = EnvWorkerSettings(env.num_env_workers, env.num_cpus_per_env_worker, max(env.max_env_workers, 1))
        demands.append(_env_worker_demand(env_workers))
    if not demands:
        return None
    gpus = t.device == "cuda" and engine.replicas > 1 and engine.gpus_per_replica > 0
    return ActorSettings(
        backend=t.backend,
        worker_groups=tuple(groups),
        placed=tuple(placed),
        demands=tuple(demands),
        placement=t.placement,
        ray_address=config.ray.address,
        dist_backend="nccl" if t.device == "cuda" else "gloo",
        # Two ranks on one GPU cannot share a NCCL group: colocated engines get the weights through gloo.
        weight_broadcast="nccl" if gpus and t.placement == "disaggregate" else "gloo",
        env_workers=env_workers,
    )


def training_actors(trainer: TrainerConfig, models: list[WorkerGroupRole]) -> tuple[list[RoleSpec], ActorDemand]:
    """The placement roles of ``models``' worker groups, each with its own rank count, and their cluster-check row."""
    cpus, gpus = trainer.num_cpus_per_worker, trainer.num_gpus_per_worker or 0.0
    roles = [RoleSpec(model, worker_group_size(trainer, model), cpus, gpus) for model in models]
    total = sum(role.count for role in roles)
    what = f"{total} training workers ({', '.join(f'{role.name} {role.count}' for role in roles)})"
    return roles, ActorDemand(total, cpus, gpus, what, "trainer.num_cpus_per_worker", "trainer.num_gpus_per_worker")


def _engine_demand(config: Config, engine: EngineSettings) -> ActorDemand:
    """The engine replicas' cluster-check row (an engine's GPUs are all its tensor-parallel ranks')."""
    tp = config.inference.tensor_parallel_size
    tp_note = f" of inference.tensor_parallel_size={tp} GPUs each" if tp > 1 else ""
    return ActorDemand(
        engine.replicas,
        engine.cpus_per_replica,
        engine.gpus_per_replica,
        f"inference.num_engines={engine.replicas}{tp_note}",
        "inference.num_cpus_per_engine",
        "inference.num_gpus_per_engine",
    )


def _env_worker_demand(env_workers: EnvWorkerSettings) -> ActorDemand:
    """The env workers' cluster-check row: CPUs only."""
    return ActorDemand(
        env_workers.count,
        env_workers.cpus_per_worker,
        0.0,
        f"environment.num_env_workers={env_workers.count}",
        "environment.num_cpus_per_env_worker",
        "environment.num_cpus_per_env_worker",
    )


def training_steps(trainer: TrainerConfig, steps_per_epoch: int) -> int:
    """Training steps of the run: ``max_training_steps``, else ``epochs`` passes of ``steps_per_epoch``."""
    if trainer.max_training_steps is not None:
        return trainer.max_training_steps
    return trainer.epochs * steps_per_epoch


def optimizer_steps(config: Config, total_steps: int) -> int:
    """Optimizer steps of a run of ``total_steps`` training steps: one per mini-batch and update epoch.

    This is what the ``linear`` and ``cosine`` schedules decay to 0 over (policy and critic step together).
    """
    t = config.trainer
    mini_batches = math.ceil(t.train_batch_size / t.policy_mini_batch_size)
    return total_steps * t.update_epochs_per_batch * mini_batches


def backend_config(
    config: Config, *, path: str | None = None, trainable: bool = True, total_steps: int | None = None
) -> BackendConfig:
    """The policy's (or, with ``path``, another model's) :class:`BackendConfig`, on ``trainer.device``.

    ``trainable=False`` (the reference model) turns off gradient checkpointing and LoRA. ``total_steps`` (training
    steps) sizes the learning-rate schedule; the ``linear`` and ``cosine`` schedules need it.
    """
    m, o, t = config.model, config.optim, config.trainer
    lora = LoraConfig(
        rank=m.lora_rank,
        alpha=m.lora_alpha,
        dropout=m.lora_dropout,
        target_modules=lora_target_modules(m.lora_target_modules),
    )
    return BackendConfig(
        model_path=path or m.path,
        device=t.device,
        dtype=m.dtype,
        compute_dtype=m.compute_dtype,
        logprob_chunk_size=t.logprob_chunk_size,
        micro_train_batch_size=t.micro_train_batch_size,
        micro_forward_batch_size=t.micro_forward_batch_size,
        max_tokens_per_microbatch=t.max_tokens_per_microbatch,
        remove_padding=t.remove_padding,
        gradient_checkpointing=m.gradient_checkpointing and trainable,
        seed=t.seed,
        optimizer=OptimizerConfig(
            lr=o.lr,
            betas=(o.adam_betas[0], o.adam_betas[1]),
            weight_decay=o.weight_decay,
            eps=o.eps,
            max_grad_norm=o.max_grad_norm,
            scheduler=o.scheduler,
            num_warmup_steps=o.num_warmup_steps,
            total_steps=None if total_steps is None else optimizer_steps(config, total_steps),
        ),
        lora=lora if trainable else LoraConfig(),
    )


def critic_backend_config(config: Config, *, total_steps: int | None = None) -> BackendConfig:
    """The critic's :class:`BackendConfig`: the policy's settings with ``model.critic_path`` and ``optim.critic_lr``."""
    if not config.model.critic_path:
        raise ValueError("no critic is configured: set model.critic_path")
    policy = backend_config(config, path=config.model.critic_path, total_steps=total_steps)
    return dataclasses.replace(policy, optimizer=dataclasses.replace(policy.optimizer, lr=config.optim.critic_lr))


def engine_settings(config: Config) -> EngineSettings:
    """The engine kind and its options; ``inference.engine_kwargs`` are added last, so they win."""
    inf, model = config.inference, config.model
    options: dict[str, Any]
    if inf.engine == "local":
        options = {"dtype": model.dtype, "seed": config.trainer.seed, "device": _local_engine_device(config)}
    elif inf.engine == "vllm":
        options = _vllm_options(config)
    else:
        # One deadline for a whole attempt: a completion answers only when it is done, so no read timeout.
        options = {"timeouts": Timeouts(read=None, total=inf.request_timeout_s)}
        if inf.remote_urls:
            options["base_url"] = inf.remote_urls[0]
    if inf.engine != "remote" and config.trainer.async_mode == "fully_async":
        # Weight syncs then pause rollouts between two tokens instead of waiting for them to finish; each engine
        # (replicas behind Ray too) records the version of each token.
        options["pause_at"] = "token"
    options.update(inf.engine_kwargs)
    return EngineSettings(
        kind=inf.engine,
        model_path=model.path,
        options=options,
        replicas=inf.num_engines,
        cpus_per_replica=inf.num_cpus_per_engine,
        gpus_per_replica=inf.num_gpus_per_engine,
    )


def _local_engine_device(config: Config) -> str:
    """The trainer's device for an engine in this process; engine actors compute where Ray gave them GPUs."""
    inf = config.inference
    if inf.num_engines > 1:
        return "cuda" if inf.num_gpus_per_engine > 0 else "cpu"
    return config.trainer.device


def _vllm_options(config: Config) -> dict[str, Any]:
    import torch

    inf = config.inference
    options: dict[str, Any] = {
        "dtype": config.model.dtype,
        "seed": config.trainer.seed,
        "tensor_parallel_size": inf.tensor_parallel_size,
        "max_num_seqs": inf.max_num_seqs,
        "max_num_batched_tokens": inf.max_num_batched_tokens,
        "enable_prefix_caching": inf.enable_prefix_caching,
    }
    # The section's memory share is for GPUs; on a CPU the engine picks its own (a RAM share). Engine actors given
    # GPUs run on GPU nodes even when this process sees none.
    if torch.cuda.is_available() or inf.num_gpus_per_engine > 0:
        options["gpu_memory_utilization"] = inf.gpu_memory_utilization
    if inf.enforce_eager:  # False leaves the platform's choice (eager on CPU, CUDA graphs on GPU)
        options["enforce_eager"] = True
    if config.trainer.placement == "colocate":  # the engines sleep while their bundle's trainer trains (GPU)
        options["sleep_mode"] = True
    return options


def generator_config(config: Config) -> GeneratorConfig:
    """The generator's settings from the ``generator`` and ``environment`` sections."""
    g, env = config.generator, config.environment
    assert g.max_input_length is not None  # derived by resolve()
    return GeneratorConfig(
        max_turns=g.max_turns,
        max_input_length=g.max_input_length,
        max_generate_length=g.max_generate_length,
        max_response_length=g.max_response_length,
        batched=g.batched,
        env_configs=env.env_configs,
        max_concurrent_trajectories=g.max_concurrent_trajectories,
        timeout_s=g.timeout_s,
        max_env_workers=env.max_env_workers,
        zero_reward_on_non_stop=g.zero_reward_on_non_stop,
        apply_overlong_filtering=g.apply_overlong_filtering,
        on_failure=g.on_failure,
        chat_template_kwargs=g.chat_template_kwargs,
    )


def generator_factory(config: Config) -> FactorySettings | None:
    """``generator.factory`` and its ``factory_kwargs``; None when the run uses the SkyRLGymGenerator."""
    g = config.generator
    if g.factory is None:
        return None
    return FactorySettings(path=g.factory, kwargs=dict(g.factory_kwargs))


def loop_settings(config: Config) -> LoopSettings:
    """The loop's own settings."""
    a, g, t = config.algorithm, config.generator, config.trainer
    return LoopSettings(
        n_samples_per_prompt=g.n_samples_per_prompt,
        policy_mini_batch_size=t.policy_mini_batch_size,
        update_epochs_per_batch=t.update_epochs_per_batch,
        advantage_estimator=a.advantage_estimator,
        advantage=AdvantageConfig(gamma=a.gamma, lambd=a.lambd, grpo_norm_by_std=a.grpo_norm_by_std),
        use_kl_in_reward=a.use_kl_in_reward,
        kl_estimator_type=a.kl_estimator_type,
        zero_variance_filter=a.zero_variance_filter,
        dynamic_sampling=a.dynamic_sampling,
        max_sample_batches=a.max_sample_batches,
        min_replace_ratio=a.min_replace_ratio,
        value_clip=a.value_clip,
        logprob_temperature=g.temperature,  # log-probs are taken at the temperature the tokens were sampled at
        eval_n_samples_per_prompt=g.eval_n_samples_per_prompt,
        seed=t.seed,
        async_mode=t.async_mode,
        device=t.device,
    )


def stream_settings(config: Config) -> StreamSettings:
    """``trainer.async_mode=fully_async``: how the rollout stream schedules prompt groups."""
    t = config.trainer
    return StreamSettings(
        batch_size=t.train_batch_size,
        max_staleness=t.max_staleness,
        max_inflight_groups=t.max_inflight_groups,
    )


def objective_of(config: Config) -> Objective:
    """The loss terms from the ``algorithm`` and ``off_policy`` sections."""
    a = config.algorithm
    policy_loss = PolicyLossConfig(
        eps_clip_low=a.eps_clip_low,
        eps_clip_high=a.eps_clip_high,
        clip_ratio_c=a.clip_ratio_c,
        loss_reduction=a.loss_reduction,
        max_seq_len=a.max_seq_len,
        cispo=CISPOConfig(a.cispo_eps_clip_low, a.cispo_eps_clip_high, a.cispo_anchor),
        sapo=SAPOConfig(a.sapo_tau_pos, a.sapo_tau_neg),
        clip_cov=ClipCovConfig(a.clip_cov_ratio, a.clip_cov_lb, a.clip_cov_ub),
        kl_cov=KLCovConfig(a.kl_cov_frac, a.kl_cov_coef),
        off_policy_correction=config.off_policy,
    )
    return Objective(
        policy_loss_type=a.policy_loss_type,
        policy_loss=policy_loss,
        use_kl_loss=a.use_kl_loss,
        kl_loss_coef=a.kl_loss_coef,
        kl_estimator_type=a.kl_estimator_type,
        entropy_coef=a.entropy_loss_coef,
    )


def sampling_params(config: Config) -> tuple[SamplingParams, SamplingParams]:
    """``(training, evaluation)`` sampling params of a resolved config; evaluation may be greedy (temperature 0)."""
    g = config.generator
    training = SamplingParams(
        max_tokens=g.max_generate_length,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        min_p=g.min_p,
        stop=tuple(g.stop),
    )
    evaluation = dataclasses.replace(
        training,
        max_tokens=g.eval_max_generate_length if g.eval_max_generate_length is not None else g.max_generate_length,
        temperature=g.eval_temperature,
        top_p=g.eval_top_p,
    )
    return training, evaluation


def kl_controller(config: Config) -> KLController | None:
    """A fresh controller of the KL penalty in the reward (fixed or adaptive beta); None when there is none."""
    a = config.algorithm
    if not a.use_kl_in_reward:
        return None
    return make_kl_controller(a.kl_ctrl, a.kl_coef, a.kl_target, a.kl_horizon)
