"""Build a run's live components from its settings (:mod:`skyrl_train.wiring`), and close them again.

Order: the prompts (tokenizer, datasets, loader) → Ray and the placement groups, when a role runs in actors →
policy (reference, critic) backends → inference engine → generator → tracker → trainer (with the weight sync and
the colocated hand-over). This module reads no config: everything it builds comes from the settings objects.

The generator is the :class:`~skyrl_train.generators.SkyRLGymGenerator`, or the one ``generator.factory`` builds
(:mod:`skyrl_train.generators.factory`): that one gets the engine through a
:class:`~skyrl_train.generators.factory.GeneratorPauseLink`, so a generator with ``pause``/``resume`` is paused
around every weight sync. ``fully_async`` generates through a
:class:`~skyrl_train.inference.versioned.VersionedEngine`, which records which policy made each token.

:class:`Components` owns what was built: :meth:`Components.close` closes the generator first (it may still hold
sandboxes or pools), then the engine, the compute thread, the worker actors, and Ray if the run started it. A
build that fails half-way closes what it had built before raising.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from skyrl_train.backends import BackendConfig, TorchBackend, TrainingBackend
from skyrl_train.backends.critic import CriticBackend
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.data.dataset import PromptDataset, PromptRecord
from skyrl_train.data.loader import PromptLoader
from skyrl_train.generators import Generator, SkyRLGymGenerator
from skyrl_train.generators.factory import GeneratorContext, GeneratorPauseLink, build_generator
from skyrl_train.inference.base import InferenceEngine
from skyrl_train.inference.factory import create_engine
from skyrl_train.inference.versioned import VersionedEngine
from skyrl_train.timeline import Timeline
from skyrl_train.tracking import Tracker
from skyrl_train.trainer import Trainer
from skyrl_train.wiring import ActorSettings, DataSettings, EngineSettings, OutputSettings, RunComponents

if TYPE_CHECKING:
    from skyrl_train.backends.ray_group import FSDPBackend
    from skyrl_train.generators.env_workers import EnvWorkers
    from skyrl_train.handover import ColocatedHandover
    from skyrl_train.inference.broadcast_sync import BroadcastSync
    from skyrl_train.ray_cluster import Placement

__all__ = ["Components", "Prompts", "load_prompts"]


@dataclass
class Prompts:
    """The run's tokenizer, training prompts (and their loader) and evaluation prompts."""

    tokenizer: Any
    train_set: PromptDataset
    loader: PromptLoader[PromptRecord]
    eval_prompts: list[PromptRecord]


def load_prompts(settings: DataSettings) -> Prompts:
    """Load the tokenizer and the datasets; chat-template each prompt and drop the ones that are too long."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer_path)

    def dataset(paths: tuple[str, ...]) -> PromptDataset:
        return PromptDataset(
            list(paths),
            default_env_class=settings.default_env_class,
            tokenizer=tokenizer,
            max_prompt_length=settings.max_prompt_length,
            chat_template_kwargs=settings.chat_template_kwargs,
        )

    train_set = dataset(settings.train_data)
    loader = PromptLoader(
        train_set, settings.batch_size, seed=settings.seed, shuffle=settings.shuffle, drop_last=settings.drop_last
    )
    return Prompts(tokenizer, train_set, loader, list(dataset(settings.val_data)) if settings.val_data else [])


@dataclass
class Components:
    """The live objects of one run; see the module docstring for the order they are built and closed in."""

    parts: RunComponents
    prompts: Prompts
    outputs: OutputSettings
    timeline: Timeline = field(default_factory=Timeline)  # every role's spans: trace.json and timeline.png
    compute: ComputeThread | None = None  # the thread every in-process model computes on
    engine: InferenceEngine | None = None  # the run's engine (or engine group)
    generator: Generator | None = None
    worker_groups: list[FSDPBackend] = field(default_factory=list)  # trainer.backend=fsdp: the actor groups
    env_workers: EnvWorkers | None = None  # environment.num_env_workers > 0: the env actors
    placement: Placement | None = None  # the placement groups of the run's actors
    started_ray: bool = False  # whether this run started Ray (and so shuts it down)
    broadcast: BroadcastSync | None = None  # trainer.backend=fsdp: how weights reach the engines
    handover: ColocatedHandover | None = None  # trainer.placement=colocate: roles taking turns with memory
    tracker: Tracker | None = None  # where step metrics go; finished by the run

    @classmethod
    async def open(cls, parts: RunComponents, prompts: Prompts, outputs: OutputSettings) -> tuple[Components, Trainer]:
        """Build every component and the trainer over them; a failure closes what was built, then raises."""
        built = cls(parts, prompts, outputs)
        try:
            return built, built._trainer()
        except BaseException:
            # A build that failed half-way must not leave sandboxes, engine threads, actors or a cluster behind.
            await built.close()
            raise

    def _trainer(self) -> Trainer:
        parts = self.parts
        if parts.actors is not None:
            self._start_ray(parts.actors)
        # With the local engine in this process, every model of the run computes on one thread
        # (skyrl_train.compute_thread says why).
        if parts.engine.kind == "local" and parts.engine.replicas == 1:
            self.compute = ComputeThread()
        policy, ref, critic = self._backends()
        self.engine = built = self._engine(parts.engine)
        # A factory's generator may have work to pause during weight syncs: the link pauses it with the engine.
        link = GeneratorPauseLink(built) if parts.factory is not None else None
        synced: InferenceEngine = link if link is not None else built
        serving = VersionedEngine(synced) if parts.loop.async_mode == "fully_async" else synced
        generator = self._generator(serving)
        if link is not None:
            link.attach(generator)
        trainer = Trainer(
            settings=parts.loop,
            objective=parts.objective,
            policy=policy,
            engine=serving,
            generator=generator,
            sampling_params=parts.sampling_params,
            eval_sampling_params=parts.eval_sampling_params,
            pad_token_id=_pad_token_id(self.prompts.tokenizer),
            ref=ref,
            critic=critic,
            kl_controller=parts.kl_controller,
            sink=self._tracker(),
            compute=self.compute,
            weight_sync=self._weight_sync(policy, built),
            # set by _weight_sync just above: a catch-up push waits for the policy's update to end
            update_guard=self.broadcast.updating if self.broadcast is not None else None,
            handover=self._handover(built, policy, critic),
            timeline=self.timeline,
        )
        for traced in (generator, built):  # the SkyRLGymGenerator records spans; an EngineGroup a lane per engine
            if hasattr(traced, "timeline"):
                traced.timeline = self.timeline
        return trainer

    def _tracker(self) -> Tracker:
        out = self.outputs
        self.tracker = tracker = Tracker.create(
            out.loggers,
            out.run_dir,
            project_name=out.project_name,
            run_name=out.run_name,
            config=out.config,
            total_steps=self.parts.schedule.total_steps,
            samples_per_step=out.log_samples_per_step,
        )
        return tracker

    def _start_ray(self, actors: ActorSettings) -> None:
        """Join or start Ray; check the cluster holds every actor; reserve the placed roles' bundles."""
        from skyrl_train.ray_cluster import Placement, ensure_ray

        self.started_ray = ensure_ray(list(actors.demands), actors.ray_address)
        if actors.placed:
            self.placement = Placement(list(actors.placed), actors.placement)

    def _actor_options(self, role: str, count: int) -> list[dict[str, Any]]:
        """Each actor's placement-group options for ``role``."""
        assert self.placement is not None
        return [self.placement.options(role, index) for index in range(count)]

    def _backends(self) -> tuple[TrainingBackend, TrainingBackend | None, TrainingBackend | None]:
        """Policy, reference and critic: in this process, or (``trainer.backend=fsdp``) as Ray worker groups."""
        parts, actors = self.parts, self.parts.actors
        if actors is None or actors.backend == "torch":
            local_ref = TorchBackend(parts.ref, self.compute) if parts.ref is not None else None
            local_critic = CriticBackend(parts.critic, self.compute) if parts.critic is not None else None
            return TorchBackend(parts.policy, self.compute), local_ref, local_critic
        policy = self._worker_group(parts.policy, "policy", actors)
        ref = self._worker_group(parts.ref, "ref", actors) if parts.ref is not None else None
        critic = self._worker_group(parts.critic, "critic", actors) if parts.critic is not None else None
        return policy, ref, critic

    def _worker_group(self, settings: BackendConfig, role: str, actors: ActorSettings) -> FSDPBackend:
        """Start ``role``'s worker group (its own rank count, in its placement bundles); kept for :meth:`close`."""
        from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig

        spec = next(spec for spec in actors.worker_groups if spec.name == role)
        group = WorkerGroupConfig(
            num_workers=spec.count,
            num_cpus_per_worker=spec.cpus,
            num_gpus_per_worker=spec.gpus,
            dist_backend=actors.dist_backend,
        )
        options = self._actor_options(role, spec.count)
        # A reference is a policy model that only runs forward passes.
        backend = FSDPBackend(settings, group, role="critic" if role == "critic" else "policy", actor_options=options)
        self.worker_groups.append(backend)  # at once: a later group that fails to start must not leak this one
        return backend

    def _engine(self, engine: EngineSettings) -> InferenceEngine:
        """The engine in this process, or (``inference.num_engines > 1``) a routed group of engine actors."""
        if engine.replicas == 1:
            return create_engine(engine.kind, engine.model_path, compute=self.compute, **engine.options)
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

    def _generator(self, engine: InferenceEngine) -> Generator:
        """The SkyRLGymGenerator, or the one ``generator.factory`` builds; kept in ``self.generator`` to close."""
        parts, tokenizer = self.parts, self.prompts.tokenizer
        if parts.factory is None:
            self.generator = SkyRLGymGenerator(engine, tokenizer, parts.generator, env_workers=self._env_workers())
            return self.generator
        context = GeneratorContext(
            engine=engine,
            tokenizer=tokenizer,
            config=parts.generator,
            run_dir=self.outputs.run_dir,
            run_name=self.outputs.run_name,
            seed=self.outputs.seed,
        )
        self.generator = build_generator(parts.factory, context)
        return self.generator

    def _env_workers(self) -> EnvWorkers | None:
        """``environment.num_env_workers`` actors holding the run's envs, or None (envs in this process)."""
        settings = self.parts.actors.env_workers if self.parts.actors is not None else None
        if settings is None:
            return None
        from skyrl_train.generators.env_workers import EnvWorkers

        self.env_workers = EnvWorkers(
            settings.count, num_cpus_per_worker=settings.cpus_per_worker, concurrency=settings.concurrency
        )
        return self.env_workers

    def _weight_sync(self, policy: TrainingBackend, built: InferenceEngine) -> Callable[[], Awaitable[object]] | None:
        """With Ray workers, rank 0 broadcasts the weights straight to the engines (``inference.broadcast_sync``).

        Over NCCL or gloo as the actor settings say. Remote servers keep the default sync: they load from a file.
        """
        from skyrl_train.backends.ray_group import FSDPBackend

        actors = self.parts.actors
        if actors is None or not isinstance(policy, FSDPBackend) or self.parts.engine.kind == "remote":
            return None
        from skyrl_train.inference.broadcast_sync import BroadcastReceiver, BroadcastSync, LocalReceiver
        from skyrl_train.inference.ray_engines import EngineGroup

        receiver: BroadcastReceiver = built if isinstance(built, EngineGroup) else LocalReceiver(built)
        self.broadcast = BroadcastSync(policy, receiver, backend=actors.weight_broadcast)
        return self.broadcast.push

    def _handover(
        self, engine: InferenceEngine, policy: TrainingBackend, critic: TrainingBackend | None
    ) -> ColocatedHandover | None:
        """Colocated actors take turns with their bundles' memory (``skyrl_train.handover``); else None."""
        actors = self.parts.actors
        if self.placement is None or actors is None or actors.placement != "colocate":
            return None
        from skyrl_train.handover import ColocatedHandover

        self.handover = ColocatedHandover(engine, [b for b in (policy, critic) if b is not None])
        return self.handover

    async def close(self) -> None:
        """Close what was built: the generator, the engine, the compute thread, the workers, Ray (if started here).

        A failure to close one does not keep the others open; it is raised once they are closed.
        """
        try:
            await self._close_generator()
        finally:
            try:
                engine, self.engine = self.engine, None
                if engine is not None:
                    await engine.close()
            finally:
                compute, self.compute = self.compute, None
                if compute is not None:
                    await asyncio.to_thread(compute.close)
                self._stop_workers()

    async def _close_generator(self) -> None:
        generator, self.generator = self.generator, None
        close = getattr(generator, "close", None)
        if close is not None:
            maybe = close()
            if asyncio.iscoroutine(maybe):
                await maybe

    def _stop_workers(self) -> None:
        """Stop the worker groups and env workers, remove the placement groups, then Ray if this run started it."""
        groups, self.worker_groups = self.worker_groups, []
        for group in groups:
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


def _pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's padding id, or its end-of-sequence id when it has none."""
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
