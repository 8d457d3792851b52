"""The RL step: generate → score → reference/old log-probs → advantages → update → sync; and evaluation.

The trainer calls protocols only (a :class:`Generator`, an :class:`InferenceEngine`, :class:`TrainingBackend`
models) and owns no device detail, so the same step runs in one CPU process in tests and over Ray workers.

One step, in order::

    prompts ──generator──► trajectories ──► Experience (token rewards, masks, rollout log-probs, groups)
        (dynamic sampling: more prompt batches, or copies of groups, until every group's rewards vary)
    prepare(experience)        old/ref log-probs, values, KL in reward, advantages   (skyrl_train.preparation)
    update(experience)         policy (and critic) optimizer steps over mini-batches  (skyrl_train.update)
    sync_weights()             engine.update_weights(policy.get_weights()), paused meanwhile; or the injected
                               weight_sync, e.g. a broadcast from the policy's rank 0

:meth:`Trainer.train_step` is the whole step of ``async_mode="sync"``. The other modes are loops of their own in
:mod:`skyrl_train.modes`, built from the same two halves: :meth:`Trainer.collect` (the experience of a batch of
prompts) and :meth:`Trainer.learn` (prepare, update, sync, metrics). They differ only in where the experience
comes from and what runs while the step learns.

With colocated roles the injected ``handover`` lends the engines' memory to training right after generation and
gives it back before the sync (``timing/handover_s``).

Metrics per step include the mean ``|rollout log-prob − trainer log-prob|`` over generated tokens
(``policy/rollout_logprob_gap``): on an on-policy step it measures how far the engine's numerics are from the
trainer's, and must stay small.

One update on the policy that sampled. With one update epoch over one mini-batch, the single training forward
pass runs on exactly the weights the old log-probs would be computed with (no optimizer step comes between them),
so when that forward computes what ``policy.forward`` computes (the backend reports no active dropout) the old
log-probs are its detached log-probs, and the separate no-grad pass is skipped (as TRL does with
``num_iterations=1``; see :mod:`skyrl_train.update`). ``LoopSettings.reuse_update_log_probs=False`` always runs the
separate pass; a KL penalty in the reward needs the old log-probs before the update, so it does too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

import torch

from skyrl_train.algorithms import KLController
from skyrl_train.backends.base import TrainingBackend
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.devices import device_metrics
from skyrl_train.dynamic_sampling import DynamicSamplingError, collect_informative_groups, replace_uninformative_groups
from skyrl_train.experience import Experience, to_experience
from skyrl_train.generators.base import Generator, GeneratorInput, GeneratorOutput
from skyrl_train.inference.base import InferenceEngine, SamplingParams
from skyrl_train.inference.versioned import VersionedEngine
from skyrl_train.loop_settings import AsyncMode, Handover, LoopSettings, Metrics, MetricsSink, PromptSource
from skyrl_train.objective import Objective
from skyrl_train.preparation import prepare
from skyrl_train.timeline import WAITING, Timeline, timed
from skyrl_train.update import Models, update

__all__ = [
    "AsyncMode",
    "Handover",
    "LoopSettings",
    "Metrics",
    "MetricsSink",
    "PromptSource",
    "StepClock",
    "Trainer",
    "mean_metrics",
    "reward_metrics",
    "state_for_checkpoint",
]

P = ParamSpec("P")
T = TypeVar("T")
BeforeSync = Callable[[Metrics], Awaitable[None]]
"""Work a mode waits for between the update and the weight sync (one_step_off: the rollouts generated ahead)."""


@dataclass
class StepClock:
    """One step's phase timings (``timing/*_s``) and its start on the timeline."""

    timings: Metrics = field(default_factory=dict)
    start: float = 0.0


@dataclass
class Trainer:
    """Runs RL steps and evaluations over injected components. See the module docstring for one step."""

    settings: LoopSettings
    objective: Objective
    policy: TrainingBackend
    engine: InferenceEngine
    generator: Generator
    sampling_params: SamplingParams
    eval_sampling_params: SamplingParams
    pad_token_id: int
    ref: TrainingBackend | None = None
    critic: TrainingBackend | None = None  # a value model (CriticBackend); advantages then get its values
    kl_controller: KLController | None = None
    sink: MetricsSink | None = None
    compute: ComputeThread | None = None  # where the loop's tensor work runs (the thread its models compute on)
    # How the policy's weights reach the engine; None: engine.update_weights(policy.get_weights()). A run on Ray
    # workers passes skyrl_train.inference.broadcast_sync.BroadcastSync.push (rank 0 straight to the engines).
    weight_sync: Callable[[], Awaitable[object]] | None = None
    # Held while the policy's ranks prepare and update, given the version the update makes: a weight push (an
    # engine that restarted mid-update being caught up) waits for it (BroadcastSync.updating). None: nothing held.
    update_guard: Callable[[int], AbstractAsyncContextManager[object]] | None = None
    # Colocated roles taking turns with one device's memory (skyrl_train.handover.ColocatedHandover); None: each
    # role keeps its memory.
    handover: Handover | None = None
    # Spans of the step's phases (skyrl_train.timeline); with one, every step logs the engine's and the trainer's
    # busy fractions. The generator records the engine and env spans into the same timeline.
    timeline: Timeline | None = None
    global_step: int = 0
    callbacks: list[Callable[[Trainer, Metrics], None]] = field(default_factory=list)

    # ------------------------------------------------------------------------------------------ one RL step

    async def train_step(self, prompts: Sequence[PromptRecord], next_prompts: PromptSource | None = None) -> Metrics:
        """Roll out ``prompts``, update the policy (and critic) on the trajectories, sync the engine; return metrics.

        ``next_prompts`` hands out further prompt batches; dynamic sampling draws from it when ``prompts`` alone
        does not yield a training batch (without it, such a step raises ``DynamicSamplingError``, as does one
        that exhausts ``max_sample_batches``).
        """
        clock = self.start_step()
        with timed(clock.timings, "timing/generate_s", self.timeline, WAITING, "rollouts"):
            experience, metrics = await self.collect(prompts, next_prompts)
        metrics["async/staleness"] = 0.0
        return await self.learn(experience, metrics, clock)

    def start_step(self) -> StepClock:
        """The clock of a step starting now."""
        return StepClock(start=self.timeline.now() if self.timeline is not None else 0.0)

    async def learn(
        self,
        experience: Experience,
        metrics: Metrics,
        clock: StepClock,
        *,
        before_sync: BeforeSync | None = None,
        concurrent: bool = False,
    ) -> Metrics:
        """The rest of a step once its experience is ready: prepare, update, weight sync, metrics; the step ends.

        ``concurrent``: rollouts keep generating on this event loop meanwhile, so the models' calls leave it.
        ``before_sync`` runs after the update, before the new weights are loaded.
        """
        timings = clock.timings
        if self.handover is not None:
            with timed(timings, "timing/handover_s", self.timeline, "sync", "hand-over"):
                await self.handover.to_training()
        async with self._updating():
            reuse = self._reuses_update_forward(experience)
            with timed(timings, "timing/prepare_s", self.timeline, "trainer", "prepare"):
                await self._computed(concurrent, self._prepare, experience, metrics, old_log_probs=not reuse)
            with timed(timings, "timing/update_s", self.timeline, "trainer", "update"):
                metrics.update(await self._computed(concurrent, self._update, experience, reuse_forward=reuse))
        if self.handover is not None:
            with timed(timings, "timing/handover_s", self.timeline, "sync", "hand-over"):
                await self.handover.to_generation()  # the engines must be awake to load the new weights
        if before_sync is not None:
            await before_sync(timings)
        with timed(timings, "timing/weight_sync_s", self.timeline, "sync", "weight sync"):
            await self.sync_weights(version=self.global_step + 1)
        self.global_step += 1
        metrics.update(self._step_metrics(clock))
        self._emit(metrics)
        return metrics

    def _step_metrics(self, clock: StepClock) -> Metrics:
        """Timings, busy fractions, worker counts and device memory of the step that just ended."""
        metrics = dict(clock.timings)
        if self.timeline is not None:
            end = self.timeline.now()
            self.timeline.record("step", "step", clock.start, end)
            metrics["timing/trainer_busy_fraction"] = self.timeline.busy_fraction("trainer", clock.start, end)
            metrics["timing/engine_busy_fraction"] = self._engine_busy(clock.start, end)
        metrics["timing/step_s"] = sum(clock.timings.values())
        metrics["system/num_policy_workers"] = float(getattr(self.policy, "num_workers", 1))
        metrics["system/num_engines"] = float(getattr(self.engine, "num_engines", 1))
        roles = {"policy": self.policy, "ref": self.ref, "critic": self.critic}
        metrics.update(device_metrics(self.settings.device, {r: b for r, b in roles.items() if b is not None}))
        return metrics

    def _updating(self) -> AbstractAsyncContextManager[object]:
        """The update guard for the version this step's update makes (nothing without a guard)."""
        if self.update_guard is None:
            return contextlib.nullcontext()
        return self.update_guard(self.global_step + 1)

    def _engine_busy(self, start: float, end: float) -> float:
        """The engines' mean busy fraction: over each engine's own lane when they have one, else the shared lane."""
        assert self.timeline is not None
        lanes = [lane for lane in self.timeline.lanes() if lane.startswith("engine ")] or ["engine"]
        return sum(self.timeline.busy_fraction(lane, start, end) for lane in lanes) / len(lanes)

    async def _computed(self, concurrent: bool, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, on the compute thread when there is one (see ``skyrl_train.compute_thread``).

        Tensor work of the loop itself (advantages, mini-batch selection) then shares the thread of the model work,
        and the event loop keeps running meanwhile. Without one, ``concurrent`` (rollouts generating on this event
        loop) sends the call to a thread: backends in other processes block on their calls.
        """
        if self.compute is not None:
            return await self.compute.acall(fn, *args, **kwargs)
        if concurrent:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    @property
    def models(self) -> Models:
        """The models of the run: the policy, and the reference and the critic when it has them."""
        return Models(self.policy, self.ref, self.critic)

    def _prepare(self, experience: Experience, metrics: Metrics, *, old_log_probs: bool = True) -> None:
        """:func:`skyrl_train.preparation.prepare` with this trainer's models and settings."""
        prepare(
            experience,
            metrics,
            models=self.models,
            objective=self.objective,
            settings=self.settings,
            kl_controller=self.kl_controller,
            version=self.global_step,
            old_log_probs=old_log_probs,
        )

    def _update(self, experience: Experience, *, reuse_forward: bool = False) -> Metrics:
        """:func:`skyrl_train.update.update` with this trainer's models and settings."""
        return update(
            experience,
            models=self.models,
            objective=self.objective,
            settings=self.settings,
            step=self.global_step,
            reuse_forward=reuse_forward,
        )

    def _reuses_update_forward(self, experience: Experience) -> bool:
        """Whether the update's forward pass can give the old log-probs (see "One update" in the module docstring)."""
        s = self.settings
        if not s.reuse_update_log_probs or s.update_epochs_per_batch != 1 or s.use_kl_in_reward:
            return False
        if experience.num_groups > s.policy_mini_batch_size:  # more than one mini-batch: later ones are off-policy
            return False
        has_active_dropout = getattr(self.policy, "has_active_dropout", None)
        return has_active_dropout is not None and not has_active_dropout()

    # ------------------------------------------------------------------------------------------ rollouts

    async def collect(
        self, prompts: Sequence[PromptRecord], next_prompts: PromptSource | None, step: int | None = None
    ) -> tuple[Experience, Metrics]:
        """Step ``step``'s experience (after dynamic sampling, if configured) and its rollout and reward metrics.

        ``step`` (default: the current one) seeds the sampling, so a batch generated a step ahead draws what it would
        have drawn in its own step.
        """
        outputs: list[GeneratorOutput] = []
        step = self.global_step if step is None else step

        async def sample(attempt: int) -> Experience:
            batch = prompts if attempt == 0 else _refill(next_prompts)
            request = self.generator_input(batch, training=True, attempt=attempt, step=step)
            outputs.append(await self.generator.generate(request))
            return to_experience(outputs[-1], self.pad_token_id)

        s = self.settings
        if s.dynamic_sampling == "filter":
            experience, metrics = await collect_informative_groups(
                sample, len(prompts), s.max_sample_batches, self.pad_token_id
            )
        elif s.dynamic_sampling == "replace":
            generator = torch.Generator().manual_seed(s.seed * 1_000_003 + step)
            experience, metrics = await replace_uninformative_groups(
                sample, s.min_replace_ratio, s.max_sample_batches, generator
            )
        else:
            experience, metrics = await sample(0), {}
        # Reward metrics describe everything the policy generated, not only the groups kept for training.
        return experience, {**mean_metrics([o.metrics for o in outputs]), **reward_metrics(outputs), **metrics}

    def generator_input(
        self,
        prompts: Sequence[PromptRecord],
        *,
        training: bool,
        attempt: int = 0,
        step: int | None = None,
        seed_key: int | None = None,
    ) -> GeneratorInput:
        """The request for ``prompts``; ``seed_key`` (default ``2 · step + training``) picks the sampling seed."""
        step = self.global_step if step is None else step
        n = self.settings.n_samples_per_prompt if training else self.settings.eval_n_samples_per_prompt
        rows = [(p, i) for p in prompts for i in range(n)]
        params = self.sampling_params if training else self.eval_sampling_params
        if params.seed is None:
            # A seed per step (the generator offsets it per trajectory and turn) makes a step's samples depend
            # only on the run seed and the step, so a resumed run draws exactly what the uninterrupted one did.
            # A dynamic-sampling refill (attempt > 0) is offset by attempt · 2^50: the per-trajectory offsets stay
            # below 2^20, so a refill never repeats a seed of its step's earlier batches.
            key = step * 2 + training if seed_key is None else seed_key
            seed = ((self.settings.seed * 1_000_003 + key) << 20) + (attempt << 50)
            params = replace(params, seed=seed)
        return GeneratorInput(
            prompts=[p.messages for p, _ in rows],
            env_classes=[p.env_class for p, _ in rows],
            env_extras=[p.extras for p, _ in rows],
            trajectory_ids=[f"{p.uid}:{i}" for p, i in rows],
            sampling_params=params,
            training=training,
            global_step=step,
        )

    async def sync_weights(self, version: int | None = None) -> float:
        """Push the policy's weights into the engine (generation paused meanwhile); return the seconds it took.

        ``version`` (default: the current step) is the policy version of the weights pushed; a
        :class:`VersionedEngine` stamps it on everything it generates from then on.
        """
        start = time.monotonic()
        await self.engine.pause()
        try:
            if self.weight_sync is not None:
                await self.weight_sync()
            else:
                await self.engine.update_weights(self.policy.get_weights())
            if isinstance(self.engine, VersionedEngine):
                self.engine.version = self.global_step if version is None else version
        finally:
            await self.engine.resume()
        return time.monotonic() - start

    # ------------------------------------------------------------------------------------------ evaluation

    async def evaluate(self, prompts: Sequence[PromptRecord]) -> Metrics:
        """Roll out ``prompts`` with the evaluation sampling params; mean reward per ``data_source`` and overall."""
        output = await self.generator.generate(self.generator_input(prompts, training=False))
        rewards = output.trajectory_rewards()
        n = self.settings.eval_n_samples_per_prompt
        by_source: defaultdict[str, list[float]] = defaultdict(list)
        for index, reward in enumerate(rewards):
            by_source[prompts[index // n].data_source].append(reward)
        metrics = {f"eval/{src}/reward_mean": sum(v) / len(v) for src, v in by_source.items()}
        metrics["eval/all/reward_mean"] = sum(rewards) / max(len(rewards), 1)
        metrics["eval/all/pass_rate"] = sum(r > 0 for r in rewards) / max(len(rewards), 1)
        return metrics

    def _emit(self, metrics: Metrics) -> None:
        if self.sink is not None:
            self.sink.log(metrics, self.global_step)
        for callback in self.callbacks:
            callback(self, metrics)


def _refill(next_prompts: PromptSource | None) -> Sequence[PromptRecord]:
    if next_prompts is None:
        raise DynamicSamplingError(
            "dynamic sampling needs another batch of prompts but train_step got no next_prompts: "
            "pass next_prompts (e.g. lambda: next(batches)) or set algorithm.dynamic_sampling=null"
        )
    return next_prompts()


def reward_metrics(outputs: Sequence[GeneratorOutput]) -> Metrics:
    """Reward statistics and stop-reason shares over every trajectory of ``outputs`` (step-wise rows: once each)."""
    rewards = torch.tensor([r for o in outputs for r in o.trajectory_rewards()], dtype=torch.float32)
    reasons = [
        str(reason) for o in outputs for reason, last in zip(o.stop_reasons, o.last_steps(), strict=True) if last
    ]
    metrics = {
        "reward/mean": rewards.mean().item(),
        "reward/max": rewards.max().item(),
        "reward/min": rewards.min().item(),
    }
    for reason in set(reasons):
        metrics[f"rollout/stop_{reason}"] = reasons.count(reason) / len(reasons)
    return metrics


def mean_metrics(rows: Sequence[Mapping[str, float]]) -> Metrics:
    """Each key's mean over the rows that have it (the generator's batch statistics over refills)."""
    values: defaultdict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in row.items():
            values[key].append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}


def state_for_checkpoint(trainer: Trainer) -> dict[str, Any]:
    """JSON-safe loop state to store with a checkpoint (the adaptive KL coefficient)."""
    return {"kl_coef": trainer.kl_controller.value if trainer.kl_controller is not None else None}
