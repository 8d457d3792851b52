"""Build a run's components and drive the training loop; what ``skyrl-train`` (the CLI) calls.

Order: resolve and validate the config (every bad input fails here, before any model loads) → record it in the
run directory → seed python, numpy and torch → tokenizer, datasets → the components' settings
(:func:`skyrl_train.wiring.components_of`) → policy (reference, critic) backends → inference engine → generator →
tracker → resume from the latest checkpoint when there is one → evaluate → train steps with periodic evaluation,
checkpoints and Hugging Face exports → final checkpoint, export and the metrics plot. Returns a :class:`RunResult`.

The generator is the :class:`~skyrl_train.generators.SkyRLGymGenerator`, or the one ``generator.factory`` builds
(:mod:`skyrl_train.generators.factory`): that one gets the engine through a
:class:`~skyrl_train.generators.factory.GeneratorPauseLink`, so a generator with ``pause``/``resume`` is paused
around every weight sync. At the end (or when the build fails after it was made) the generator is closed first,
then the engine, then the worker actors.

``trainer.async_mode=fully_async`` trains from a :class:`~skyrl_train.async_buffer.RolloutStream` that draws
prompts one at a time from the loader and generates until the next checkpoint's step (or the last step), so nothing
is in flight when a checkpoint is written; the checkpoint also records how many groups were started (their index
seeds each group's sampling).

The settings of every model, engine, generator and loss come from :mod:`skyrl_train.wiring`; this module only
constructs the objects and runs the outer loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from skyrl_train import checkpoint
from skyrl_train.async_buffer import RolloutStream
from skyrl_train.backends import BackendConfig, TorchBackend, TrainingBackend
from skyrl_train.backends.critic import CriticBackend
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.config import (
    Config,
    TrainerConfig,
    WorkerGroupRole,
    record_config,
    resolve,
    to_dict,
    validate,
    worker_group_size,
)
from skyrl_train.data.dataset import PromptDataset, PromptRecord
from skyrl_train.data.loader import PromptLoader
from skyrl_train.generators import Generator, SkyRLGymGenerator
from skyrl_train.generators.factory import GeneratorContext, GeneratorPauseLink, build_generator
from skyrl_train.inference.base import InferenceEngine
from skyrl_train.inference.factory import create_engine
from skyrl_train.inference.versioned import VersionedEngine
from skyrl_train.timeline import PNG_FILE, TRACE_FILE, Timeline
from skyrl_train.tracking import Tracker
from skyrl_train.trainer import Metrics, Trainer, state_for_checkpoint
from skyrl_train.wiring import (
    EngineSettings,
    RunComponents,
    backend_config,
    components_of,
    critic_backend_config,
    generator_config,
    loop_settings,
    objective_of,
    training_steps,
)

__all__ = [
    "RunResult",
    "arun",
    "backend_config",
    "critic_backend_config",
    "generator_config",
    "loop_settings",
    "objective_of",
    "run",
    "seed_everything",
    "training_actors",
]

if TYPE_CHECKING:
    from skyrl_train.backends.ray_group import FSDPBackend
    from skyrl_train.generators.env_workers import EnvWorkers
    from skyrl_train.handover import ColocatedHandover
    from skyrl_train.inference.broadcast_sync import BroadcastSync
    from skyrl_train.ray_cluster import ActorDemand, Placement, RoleSpec

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a finished run produced."""

    run_dir: Path
    global_step: int
    eval_history: list[tuple[int, Metrics]] = field(default_factory=list)  # (step, eval metrics)
    last_metrics: Metrics = field(default_factory=dict)
    checkpoint: Path | None = None
    export: Path | None = None
    plot: Path | None = None
    timeline: Path | None = None  # timeline.png (beside trace.json)
    wall_seconds: float = 0.0


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's and torch's global generators (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(config: Config, *, echo_config: bool = True) -> RunResult:
    """Train as ``config`` says (synchronous wrapper around :func:`arun`)."""
    return asyncio.run(arun(config, echo_config=echo_config))


async def arun(config: Config, *, echo_config: bool = True) -> RunResult:
    """Train as ``config`` says; see the module docstring for the order of work."""
    started = time.monotonic()
    config = resolve(config)
    validate(config)
    run_dir = Path(config.trainer.run_dir)
    record_config(config, run_dir, echo=print if echo_config else None)
    session = await _Session.open(config)
    try:
        result = await session.train()
    finally:
        await session.close()
    result.wall_seconds = time.monotonic() - started
    return result


class _Session:
    """The live components of one run, and the outer loop over steps."""

    def __init__(self, config: Config) -> None:
        from transformers import AutoTokenizer

        seed_everything(config.trainer.seed)
        self.config = config
        self.run_dir = Path(config.trainer.run_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model.path)
        self.train_set = self._dataset(config.data.train_data)
        self.eval_prompts: list[PromptRecord] = (
            list(self._dataset(config.data.val_data)) if config.data.val_data else []
        )
        self.worker_groups: list[FSDPBackend] = []  # trainer.backend=fsdp: the Ray actor groups to stop
        self.started_ray = False  # whether this run started Ray (and so shuts it down)
        self.placement: Placement | None = None  # the placement groups of the run's actors
        self.env_workers: EnvWorkers | None = None  # environment.num_env_workers > 0: the env actors
        self.broadcast: BroadcastSync | None = None  # trainer.backend=fsdp: how weights reach the engines
        self.handover: ColocatedHandover | None = None  # trainer.placement=colocate: roles taking turns with memory
        self.timeline = Timeline()  # every role's spans: trace.json and timeline.png at the end
        self.stream: RolloutStream | None = None  # fully_async: the groups generating while the trainer trains
        self.groups_started = 0  # fully_async: groups started before this session (a resumed run's count)
        self.compute: ComputeThread | None = None  # the thread every in-process model computes on
        self.engine: InferenceEngine | None = None  # the run's engine (or engine group), closed at the end
        self.generator: Generator | None = None  # closed at the end, before the engine
        self.loader = PromptLoader(
            self.train_set,
            config.trainer.train_batch_size,
            seed=config.data.seed,
            shuffle=config.data.shuffle,
            drop_last=config.data.drop_last,
        )

    def _dataset(self, paths: list[str]) -> PromptDataset:
        return PromptDataset(
            paths,
            default_env_class=self.config.environment.env_class,
            tokenizer=self.tokenizer,
            max_prompt_length=self.config.data.max_prompt_length,
            chat_template_kwargs=self.config.generator.chat_template_kwargs,
        )

    @classmethod
    async def open(cls, config: Config) -> _Session:
        session = cls(config)
        try:
            session._build()
        except BaseException:
            # A build that failed half-way must not leave sandboxes, engine threads, actors or a cluster behind.
            await session.close()
            raise
        return session

    def _build(self) -> None:
        config = self.config
        parts = components_of(config, total_steps=self.total_steps())
        self._start_ray(parts)
        # With the local engine in this process, every model of the run computes on one thread
        # (skyrl_train.compute_thread says why).
        in_process = parts.engine.kind == "local" and parts.engine.replicas == 1
        self.compute = ComputeThread() if in_process else None
        compute = self.compute
        policy, ref, critic = self._backends(parts, compute)
        engine = parts.engine
        self.engine = built = self._engine(engine, compute)
        self.stream_settings = parts.stream
        # A factory's generator may have work to pause during weight syncs: the link pauses it with the engine.
        link = GeneratorPauseLink(built) if parts.factory is not None else None
        synced: InferenceEngine = link if link is not None else built
        # fully_async loads weights under running rollouts: the versioned engine records which policy made each turn.
        serving = VersionedEngine(synced) if config.trainer.async_mode == "fully_async" else synced
        generator = self._generator(parts, serving)
        if link is not None:
            link.attach(generator)
        self.tracker = Tracker.create(
            config.trainer.logger,
            self.run_dir,
            project_name=config.trainer.project_name,
            run_name=config.trainer.run_name,
            config=to_dict(config),
            total_steps=self.total_steps(),
            samples_per_step=config.trainer.log_samples_per_step,
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.trainer = Trainer(
            settings=parts.loop,
            objective=parts.objective,
            policy=policy,
            engine=serving,
            generator=generator,
            sampling_params=parts.sampling_params,
            eval_sampling_params=parts.eval_sampling_params,
            pad_token_id=int(pad),
            ref=ref,
            critic=critic,
            kl_controller=parts.kl_controller,
            sink=self.tracker,
            compute=compute,
            weight_sync=self._weight_sync(policy, built, engine),
            # set by _weight_sync just above: a catch-up push waits for the policy's update to end
            update_guard=self.broadcast.updating if self.broadcast is not None else None,
            handover=self._handover(built, policy, critic),
            timeline=self.timeline,
        )
        if hasattr(generator, "timeline"):  # a generator that records spans (the SkyRLGymGenerator does)
            generator.timeline = self.timeline
        if hasattr(built, "timeline"):  # an EngineGroup: a lane per engine
            built.timeline = self.timeline

    def _generator(self, parts: RunComponents, engine: InferenceEngine) -> Generator:
        """The SkyRLGymGenerator, or the one ``generator.factory`` builds; kept in ``self.generator`` to close."""
        if parts.factory is None:
            self.generator = SkyRLGymGenerator(engine, self.tokenizer, parts.generator, env_workers=self._env_workers())
        else:
            self.generator = build_generator(parts.factory, self._factory_context(parts, engine))
        return self.generator

    def _factory_context(self, parts: RunComponents, engine: InferenceEngine) -> GeneratorContext:
        t = self.config.trainer
        return GeneratorContext(
            engine=engine,
            tokenizer=self.tokenizer,
            config=parts.generator,
            run_dir=self.run_dir,
            run_name=t.run_name or self.run_dir.name,
            seed=t.seed,
        )

    def _weight_sync(
        self, policy: TrainingBackend, built: InferenceEngine, engine: EngineSettings
    ) -> Callable[[], Awaitable[object]] | None:
        """With Ray workers, rank 0 broadcasts the weights straight to the engines (``inference.broadcast_sync``).

        NCCL when the policy ranks and the engine actors all have GPUs of their own (disaggregated); otherwise
        gloo over host memory (two ranks on one GPU cannot share a NCCL group). Remote servers keep the default
        sync: they load from a file.
        """
        from skyrl_train.backends.ray_group import FSDPBackend

        if not isinstance(policy, FSDPBackend) or engine.kind == "remote":
            return None
        from skyrl_train.inference.broadcast_sync import BroadcastReceiver, BroadcastSync, LocalReceiver
        from skyrl_train.inference.ray_engines import EngineGroup

        receiver: BroadcastReceiver
        receiver = built if isinstance(built, EngineGroup) else LocalReceiver(built)
        t = self.config.trainer
        gpus = t.device == "cuda" and engine.replicas > 1 and engine.gpus_per_replica > 0
        nccl = gpus and t.placement == "disaggregate"
        self.broadcast = BroadcastSync(policy, receiver, backend="nccl" if nccl else "gloo")
        return self.broadcast.push

    def _handover(
        self, engine: InferenceEngine, policy: TrainingBackend, critic: TrainingBackend | None
    ) -> ColocatedHandover | None:
        """Colocated actors take turns with their bundles' memory (``skyrl_train.handover``); else None."""
        if self.placement is None or self.config.trainer.placement != "colocate":
            return None
        from skyrl_train.handover import ColocatedHandover

        self.handover = ColocatedHandover(engine, [b for b in (policy, critic) if b is not None])
        return self.handover

    def _start_ray(self, parts: RunComponents) -> None:
        """Join or start Ray when some role runs in actors; check the cluster holds them; reserve their bundles."""
        from skyrl_train.ray_cluster import ActorDemand, Placement, RoleSpec, ensure_ray

        t, engine = self.config.trainer, parts.engine
        roles: list[RoleSpec] = []
        demands: list[ActorDemand] = []
        if t.backend == "fsdp":
            models: list[WorkerGroupRole] = ["policy"]
            if parts.ref is not None:
                models.append("ref")
            if parts.critic is not None:
                models.append("critic")
            group_roles, group_demand = training_actors(t, models)
            roles += group_roles
            demands.append(group_demand)
        if engine.replicas > 1:
            # An engine's GPUs are all its tensor-parallel ranks' (validate() holds num_gpus_per_engine to tp).
            tp = self.config.inference.tensor_parallel_size
            roles.append(RoleSpec("engines", engine.replicas, engine.cpus_per_replica, engine.gpus_per_replica))
            demands.append(
                ActorDemand(
                    engine.replicas,
                    engine.cpus_per_replica,
                    engine.gpus_per_replica,
                    f"inference.num_engines={engine.replicas}"
                    + (f" of inference.tensor_parallel_size={tp} GPUs each" if tp > 1 else ""),
                    "inference.num_cpus_per_engine",
                    "inference.num_gpus_per_engine",
                )
            )
        env = self.config.environment
        if env.num_env_workers > 0:  # any node with free CPUs: no placement group
            demands.append(
                ActorDemand(
                    env.num_env_workers,
                    env.num_cpus_per_env_worker,
                    0.0,
                    f"environment.num_env_workers={env.num_env_workers}",
                    "environment.num_cpus_per_env_worker",
                    "environment.num_cpus_per_env_worker",
                )
            )
        if not demands:
            return
        self.started_ray = ensure_ray(demands, self.config.ray.address)
        if roles:
            self.placement = Placement(roles, t.placement)

    def _actor_options(self, role: str, count: int) -> list[dict[str, Any]]:
        """Each actor's placement-group options for ``role``."""
        assert self.placement is not None
        return [self.placement.options(role, index) for index in range(count)]

    def _env_workers(self) -> EnvWorkers | None:
        """``environment.num_env_workers`` actors holding the run's envs, or None (envs in this process)."""
        env = self.config.environment
        if env.num_env_workers == 0:
            return None
        from skyrl_train.generators.env_workers import EnvWorkers

        self.env_workers = EnvWorkers(
            env.num_env_workers,
            num_cpus_per_worker=env.num_cpus_per_env_worker,
            concurrency=max(env.max_env_workers, 1),
        )
        return self.env_workers

    def _engine(self, engine: EngineSettings, compute: ComputeThread | None) -> InferenceEngine:
        """The engine in this process, or (``inference.num_engines > 1``) a routed group of engine actors."""
        if engine.replicas == 1:
            return create_engine(engine.kind, engine.model_path, compute=compute, **engine.options)
        from skyrl_train.inference.ray_engines import EngineGroup

        return EngineGroup(
            engine.kind,
            engine.model_path,
            engine.replicas,
            options=dict(engine.options),
            num_cpus_per_engine=engine.cpus_per_replica,
            num_gpus_per_engine=engine.gpus_per_replica,
            actor_options=self._actor_options("engines", engine.replicas),
        )

    def _backends(
        self, parts: RunComponents, compute: ComputeThread | None
    ) -> tuple[TrainingBackend, TrainingBackend | None, TrainingBackend | None]:
        """Policy, reference and critic: in this process, or (``trainer.backend=fsdp``) as Ray worker groups."""
        t = self.config.trainer
        if t.backend == "torch":
            local_ref = TorchBackend(parts.ref, compute) if parts.ref is not None else None
            local_critic = CriticBackend(parts.critic, compute) if parts.critic is not None else None
            return TorchBackend(parts.policy, compute), local_ref, local_critic
        policy = self._worker_group(parts.policy, "policy")
        ref = self._worker_group(parts.ref, "ref") if parts.ref is not None else None
        critic = self._worker_group(parts.critic, "critic") if parts.critic is not None else None
        return policy, ref, critic

    def _worker_group(self, settings: BackendConfig, role: WorkerGroupRole) -> FSDPBackend:
        """Start ``role``'s worker group (its own rank count, in its placement bundles); kept for :meth:`close`."""
        from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig

        t = self.config.trainer
        n = worker_group_size(t, role)
        group = WorkerGroupConfig(
            num_workers=n,
            num_cpus_per_worker=t.num_cpus_per_worker,
            num_gpus_per_worker=t.num_gpus_per_worker or 0.0,
            dist_backend="nccl" if t.device == "cuda" else "gloo",
        )
        options = self._actor_options(role, n)
        # A reference is a policy model that only runs forward passes.
        backend = FSDPBackend(settings, group, role="critic" if role == "critic" else "policy", actor_options=options)
        self.worker_groups.append(backend)  # at once: a later group that fails to start must not leak this one
        return backend

    def _generates_ahead(self) -> bool:
        """one_step_off: whether this step also starts the next one's rollouts.

        Not when a checkpoint follows this step: nothing may be in flight when it is written, so a resumed run
        draws and generates the next batch exactly as the uninterrupted one did.
        """
        t = self.config.trainer
        after = self.trainer.global_step + 1  # the step this call trains
        checkpoint_follows = t.ckpt_interval > 0 and after % t.ckpt_interval == 0
        return t.async_mode == "one_step_off" and after < self.total_steps() and not checkpoint_follows

    def total_steps(self) -> int:
        return training_steps(self.config.trainer, steps_per_epoch=len(self.loader))

    async def train(self) -> RunResult:
        t = self.config.trainer
        result = RunResult(run_dir=self.run_dir, global_step=0)
        await self._resume()
        if t.eval_before_train and self.trainer.global_step == 0:
            await self._evaluate(result)
        if t.async_mode == "fully_async":
            await self._train_streamed(result)
        else:
            await self._train_stepped(result)
        if self.eval_prompts and (not result.eval_history or result.eval_history[-1][0] != self.trainer.global_step):
            await self._evaluate(result)
        result.global_step = self.trainer.global_step
        result.checkpoint = self._save(result.last_metrics)
        if result.export != self._export_dir():  # the last step's export may have been written in the loop
            result.export = self._export()
        result.plot = self.tracker.finish()
        result.timeline = self._write_timeline()
        return result

    async def _train_stepped(self, result: RunResult) -> None:
        """Steps of ``sync`` and ``one_step_off``: each gets its batch of prompts (one_step_off: the next one's too)."""
        batches = self.loader.stream()
        ahead: list[PromptRecord] | None = None  # one_step_off: the next step's prompts, generating already
        while self.trainer.global_step < self.total_steps():
            batch = ahead if ahead is not None else next(batches)
            ahead = next(batches) if self._generates_ahead() else None
            # Dynamic sampling draws its refills from the same stream, so they advance the saved loader state.
            result.last_metrics = await self.trainer.train_step(batch, lambda: next(batches), upcoming=ahead)
            await self._after_step(result)

    async def _train_streamed(self, result: RunResult) -> None:
        """fully_async: steps take their groups from one stream, which generates up to the next checkpoint's step."""
        self.stream = RolloutStream(
            self.stream_settings,
            self.trainer.rollout_group,
            self.loader.items(),
            version=self.trainer.global_step,
            started=self.groups_started,
        )
        try:
            while self.trainer.global_step < self.total_steps():
                self.stream.generate_until(self._horizon())
                result.last_metrics = await self.trainer.train_step_from(self.stream)
                await self._after_step(result)
        finally:
            await self.stream.close()

    def _horizon(self) -> int:
        """fully_async: the last step to generate for now: the next checkpoint's (nothing in flight then) or the end."""
        t, total = self.config.trainer, self.total_steps()
        if t.ckpt_interval <= 0:
            return total
        return min((self.trainer.global_step // t.ckpt_interval + 1) * t.ckpt_interval, total)

    async def _after_step(self, result: RunResult) -> None:
        """Evaluate, checkpoint and export when their intervals say so."""
        t, step = self.config.trainer, self.trainer.global_step
        if self.eval_prompts and t.eval_interval > 0 and step % t.eval_interval == 0:
            await self._evaluate(result)
        if t.ckpt_interval > 0 and step % t.ckpt_interval == 0:
            result.checkpoint = self._save(result.last_metrics)
        if t.export_interval > 0 and step % t.export_interval == 0:
            result.export = self._export()

    def _write_timeline(self) -> Path | None:
        """``trace.json`` and ``timeline.png`` in the run directory (the picture only with matplotlib)."""
        self.timeline.write_trace(self.run_dir / TRACE_FILE)
        try:
            return self.timeline.write_png(self.run_dir / PNG_FILE)
        except ImportError:
            logger.warning("timeline.png needs matplotlib (pip install matplotlib); trace.json was written")
            return None

    async def _evaluate(self, result: RunResult) -> None:
        if not self.eval_prompts:
            return
        metrics = await self.trainer.evaluate(self.eval_prompts)
        result.eval_history.append((self.trainer.global_step, metrics))
        self.tracker.log(metrics, self.trainer.global_step)

    async def _resume(self) -> None:
        t = self.config.trainer
        assert t.ckpt_path is not None
        path = checkpoint.resolve_resume_dir(t.resume_mode, t.ckpt_path, t.resume_path)
        if path is None:
            return
        state = checkpoint.load_checkpoint(path, read_state=self._read_models)
        self.trainer.global_step = state.global_step
        if state.loader_state is not None:
            self.loader.load_state_dict(state.loader_state)
        self.groups_started = int(state.extra.get("groups_started", state.global_step * t.train_batch_size))
        kl_coef = state.extra.get("kl_coef")
        if kl_coef is not None and self.trainer.kl_controller is not None:
            self.trainer.kl_controller.value = float(kl_coef)
        await self.trainer.sync_weights()
        print(f"resumed from {path} at step {state.global_step}")

    def _save(self, metrics: Metrics) -> Path:
        t = self.config.trainer
        assert t.ckpt_path is not None
        return checkpoint.save_checkpoint(
            t.ckpt_path,
            self.trainer.global_step,
            write_state=self._write_models,
            config=to_dict(self.config),
            metrics=metrics,
            extra={**state_for_checkpoint(self.trainer), **(self.stream.state_dict() if self.stream else {})},
            loader_state=self.loader.state_dict(),
            max_to_keep=t.max_ckpts_to_keep,
        )

    def _write_models(self, path: Path) -> None:
        checkpoint.save_models(path, self.trainer.policy, critic=self.trainer.critic)

    def _read_models(self, path: Path) -> None:
        checkpoint.load_models(path, self.trainer.policy, critic=self.trainer.critic)

    def _export_dir(self) -> Path:
        assert self.config.trainer.export_path is not None
        return Path(self.config.trainer.export_path) / f"global_step_{self.trainer.global_step}"

    def _export(self) -> Path:
        path = self._export_dir()
        export = getattr(self.trainer.policy, "export_hf", None)
        if export is None:
            raise TypeError(f"{type(self.trainer.policy).__name__} cannot export a Hugging Face directory")
        export(path, self.config.model.path)
        return path

    async def close(self) -> None:
        """Close what was built: the generator (it may still hold sandboxes or pools), the engine, the workers.

        A failure to close one does not keep the others open; it is raised once they are closed.
        """
        try:
            await self._close_generator()
        finally:
            try:
                if self.engine is not None:
                    await self.engine.close()
            finally:
                if self.compute is not None:
                    await asyncio.to_thread(self.compute.close)
                self._stop_workers()

    async def _close_generator(self) -> None:
        generator, self.generator = self.generator, None
        close = getattr(generator, "close", None)
        if close is not None:
            maybe = close()
            if asyncio.iscoroutine(maybe):
                await maybe

    def _stop_workers(self) -> None:
        """Stop the worker groups, then Ray if this run started it."""
        for group in self.worker_groups:
            group.close()
        if self.env_workers is not None:
            self.env_workers.close()
            self.env_workers = None
        if self.placement is not None:
            self.placement.remove()
            self.placement = None
        if self.started_ray:
            import ray

            ray.shutdown()
            self.started_ray = False


def training_actors(trainer: TrainerConfig, models: Sequence[WorkerGroupRole]) -> tuple[list[RoleSpec], ActorDemand]:
    """The placement roles of ``models``' worker groups, each with its own rank count, and their cluster-check row."""
    from skyrl_train.ray_cluster import ActorDemand, RoleSpec

    cpus, gpus = trainer.num_cpus_per_worker, trainer.num_gpus_per_worker or 0.0
    roles = [RoleSpec(model, worker_group_size(trainer, model), cpus, gpus) for model in models]
    total = sum(role.count for role in roles)
    what = f"{total} training workers ({', '.join(f'{role.name} {role.count}' for role in roles)})"
    return roles, ActorDemand(total, cpus, gpus, what, "trainer.num_cpus_per_worker", "trainer.num_gpus_per_worker")
