"""The RL loop: generate → score → reference/old log-probs → advantages → update → sync → evaluate.

The trainer calls protocols only (a :class:`Generator`, an :class:`InferenceEngine`, :class:`TrainingBackend`
models) and owns no device detail, so the same loop runs in one CPU process in tests and over Ray workers.

One step, in order::

    prompts ──generator──► trajectories ──► Experience (token rewards, masks, rollout log-probs, groups)
        (dynamic sampling: more prompt batches, or copies of groups, until every group's rewards vary)
        old_log_probs = policy.forward(batch)              (the policy that sampled, as the trainer computes it;
                                                            skipped when the update's own forward pass gives them)
        ref_log_probs = ref.forward(batch)                 (when a KL term needs it)
        values = critic.forward(batch)                     (when there is a critic: PPO with GAE)
        rewards −= β·KL                                    (KL in reward, optional)
        advantages, returns = estimator(rewards, mask, groups, values)   (GRPO by default)
        for each update epoch, for each mini-batch:
            policy.forward_backward(mini_batch, loss) ; optim_step
            critic.forward_backward(mini_batch, value loss) ; optim_step   (same mini-batches, when there is one)
        engine.update_weights(policy.get_weights())        (paused while it loads; or the injected weight_sync,
                                                            e.g. a broadcast from the policy's rank 0)

With colocated roles the injected ``handover`` lends the engines' memory to training right after generation and
gives it back before the sync (``timing/handover_s``).

Async modes change only where the experience comes from. ``one_step_off``: :meth:`Trainer.train_step` with
``upcoming`` starts the next step's rollouts before this step's update, and the sync waits for them.
``fully_async``: a :class:`~skyrl_train.async_buffer.RolloutStream` generates prompt groups without pause;
:meth:`Trainer.train_step_from` takes a batch of them (each group is one generate call, :meth:`Trainer.rollout_group`),
and the rest of the step is the same. The engine is then a :class:`~skyrl_train.inference.versioned.VersionedEngine`:
the sync pauses it between requests, loads the weights, and gives it the new version, which it stamps on every turn
generated from then on (``tensors["policy_versions"]``).

Metrics per step include the mean ``|rollout log-prob − trainer log-prob|`` over generated tokens
(``policy/rollout_logprob_gap``): on an on-policy step it measures how far the engine's numerics are from the
trainer's, and must stay small.

One update on the policy that sampled. With one update epoch over one mini-batch, the single training forward
pass runs on exactly the weights the old log-probs would be computed with (no optimizer step comes between them),
so when that forward computes what ``policy.forward`` computes (the backend reports no active dropout) the old
log-probs are its detached log-probs, and the separate no-grad pass is skipped (as TRL does with
``num_iterations=1``). The ratio is then exactly 1 where the separate pass would give ``1 ± float error``; values
and gradients are otherwise the same. ``policy/rollout_logprob_gap`` then comes from the training forward, as one
of the loss function's metrics: the loss runs wherever the backend runs it (in Ray workers with FSDP), and only its
metrics come back. No forward pass runs after the optimizer step to measure it.
``LoopSettings.reuse_update_log_probs=False`` always runs the separate pass; a KL penalty in the reward needs the
old log-probs before the update, so it does too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

import torch

from skyrl_train.algorithms import (
    AdvantageConfig,
    DynamicSamplingType,
    KLController,
    apply_kl_penalty,
    broadcast_from_last_steps,
    estimate_advantages,
    explained_variance,
    fold_into_last_steps,
    get_advantage_estimator,
    mask_zero_variance_groups,
    masked_mean,
)
from skyrl_train.algorithms.kl import KLEstimatorName
from skyrl_train.async_buffer import Group, RolloutStream, make_group, stream_metrics
from skyrl_train.backends.base import LossFn, ModelOutput, TrainingBackend, TrainingBatch
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.devices import device_metrics
from skyrl_train.dynamic_sampling import (
    DynamicSamplingError,
    collect_informative_groups,
    replace_uninformative_groups,
)
from skyrl_train.experience import POLICY_VERSIONS, Experience, concat_experiences, to_experience
from skyrl_train.generators.base import Generator, GeneratorInput, GeneratorOutput
from skyrl_train.inference.base import InferenceEngine, SamplingParams
from skyrl_train.inference.versioned import VersionedEngine
from skyrl_train.objective import TOKEN_STALENESS, Objective, add_token_weights, make_loss_fn, make_value_loss_fn
from skyrl_train.timeline import WAITING, Timeline, span_on

logger = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

Metrics = dict[str, float]
AsyncMode = Literal["sync", "one_step_off", "fully_async"]
PromptSource = Callable[[], Sequence[PromptRecord]]
"""Hands out the next batch of training prompts (dynamic sampling draws more than one per step)."""


class MetricsSink(Protocol):
    """Where step metrics go (``skyrl_train.tracking.Tracker`` satisfies it)."""

    def log(self, metrics: Metrics, step: int) -> None:
        """Record ``metrics`` for ``step``."""
        ...


@dataclass(frozen=True)
class LoopSettings:
    """What the loop itself needs; ``skyrl_train.wiring.loop_settings`` fills it from the run config.

    The defaults are the run config's (``tests/test_wiring.py`` checks that they stay so).
    """

    n_samples_per_prompt: int = 5  # trajectories per prompt (a GRPO group)
    policy_mini_batch_size: int = 256  # PROMPTS per optimizer step
    update_epochs_per_batch: int = 1  # passes over each step's trajectories
    advantage_estimator: str = "grpo"
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    use_kl_in_reward: bool = False
    kl_estimator_type: KLEstimatorName = "k3"
    zero_variance_filter: bool = False  # mask groups whose rewards are all equal out of the loss
    dynamic_sampling: DynamicSamplingType | None = None  # DAPO: "filter" or "replace" zero-variance groups
    max_sample_batches: int = 30  # dynamic sampling: prompt batches a step may draw before it fails
    min_replace_ratio: float = 0.3  # "replace": informative share of a batch needed to copy from it
    value_clip: float | None = 0.2  # critic: how far a value may move from its value at collection; None: no clip
    logprob_temperature: float = 1.0  # must equal the sampling temperature
    reuse_update_log_probs: bool = True  # one update on one mini-batch: old log-probs from its forward pass
    eval_n_samples_per_prompt: int = 1
    seed: int = 42  # seeds the per-step sampling seeds and the mini-batch shuffles
    # "one_step_off": the next step generates while this one trains; "fully_async": train_step_from(stream)
    async_mode: AsyncMode = "sync"
    device: str = "cpu"  # where the models compute (trainer.device, resolved): logged as system/device_is_cuda


@dataclass
class _Ahead:
    """Rollouts of the next step's prompts, running while this step trains."""

    prompts: Sequence[PromptRecord]
    rollout: asyncio.Future[tuple[Experience, Metrics]]
    version: int  # the policy version (optimizer steps) whose weights generate them


class Handover(Protocol):
    """Hands device memory from the engines to the training backends after generation, and back before the sync."""

    async def to_training(self) -> None:
        """Generation is over: let the backends have the memory."""
        ...

    async def to_generation(self) -> None:
        """Training is over: let the engines have it (awake, ready to load weights)."""
        ...


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
    _ahead: _Ahead | None = field(default=None, init=False, repr=False)  # one_step_off: the next step's rollouts
    _stream: RolloutStream | None = field(default=None, init=False, repr=False)  # fully_async: generating meanwhile

    # ------------------------------------------------------------------------------------------ one RL step

    async def train_step(
        self,
        prompts: Sequence[PromptRecord],
        next_prompts: PromptSource | None = None,
        upcoming: Sequence[PromptRecord] | None = None,
    ) -> Metrics:
        """Roll out ``prompts``, update the policy (and critic) on the trajectories, sync the engine; return metrics.

        ``next_prompts`` hands out further prompt batches; dynamic sampling draws from it when ``prompts`` alone
        does not yield a training batch (without it, such a step raises ``DynamicSamplingError``, as does one
        that exhausts ``max_sample_batches``).

        ``upcoming`` (``async_mode="one_step_off"``): the next step's prompts. Their rollouts start once this step's
        experience is ready, on the weights before this step's update, and run while it trains; the sync waits for
        them, and the next call, given the same prompts, trains on them (one policy version old).
        """
        if upcoming is not None and self.settings.async_mode != "one_step_off":
            raise ValueError("upcoming prompts are generated ahead only with async_mode='one_step_off'")
        timings: Metrics = {}
        step_start = self._now()
        start = time.monotonic()
        with span_on(self.timeline, WAITING, "rollouts"):
            experience, metrics, version = await self._experience(prompts, next_prompts)
        timings["timing/generate_s"] = time.monotonic() - start
        if upcoming is not None:
            rollout = self._rollout(upcoming, None, step=self.global_step + 1)
            self._ahead = _Ahead(upcoming, asyncio.ensure_future(rollout), self.global_step)
            await asyncio.sleep(0)  # let it send its first requests before the update takes the thread
        metrics["async/staleness"] = float(self.global_step - version)
        return await self._learn(experience, metrics, timings, step_start)

    async def train_step_from(self, stream: RolloutStream) -> Metrics:
        """``async_mode="fully_async"``: train on the next batch of groups ``stream`` has ready; return metrics.

        The stream keeps generating meanwhile (see ``skyrl_train.async_buffer``); after the update the weights are
        synced into the running engines (later turns of running rollouts use them) and the stream learns the new
        policy version. ``async/*`` metrics count the groups evicted and refilled and the trained samples' staleness.
        """
        if self.settings.async_mode != "fully_async":
            raise ValueError("train_step_from(stream) needs async_mode='fully_async'")
        if stream.version != self.global_step:
            raise ValueError(f"the stream generates for version {stream.version}, the trainer is at {self.global_step}")
        timings: Metrics = {}
        step_start = self._now()
        start = time.monotonic()
        with span_on(self.timeline, WAITING, "batch"):
            taken = await stream.take()
        timings["timing/wait_batch_s"] = time.monotonic() - start
        experience = concat_experiences([group.experience for group in taken.groups], self.pad_token_id)
        generated = [group.output for group in (*taken.groups, *taken.evicted)]
        metrics = {**_mean_metrics([o.metrics for o in generated]), **_reward_metrics(generated)}
        metrics.update(stream_metrics(taken, self.global_step, stream.settings.max_staleness))
        self._stream = stream
        try:
            metrics = await self._learn(experience, metrics, timings, step_start)
        finally:
            self._stream = None
        stream.advance(self.global_step)
        return metrics

    async def rollout_group(self, prompt: PromptRecord, index: int, version: int) -> Group:
        """``async_mode="fully_async"``: one prompt's group, the ``index``-th of the run, started at ``version``.

        Its sampling is seeded by ``index`` (as a step's by its number), so it does not depend on when it runs.
        """
        request = self._generator_input([prompt], training=True, step=version, seed_key=2 * index + 1)
        output = await self.generator.generate(request)
        return make_group(output, self.pad_token_id, index=index, admitted=version)

    def _updating(self) -> AbstractAsyncContextManager[object]:
        """The update guard for the version this step's update makes (nothing without a guard)."""
        if self.update_guard is None:
            return contextlib.nullcontext()
        return self.update_guard(self.global_step + 1)

    async def _learn(self, experience: Experience, metrics: Metrics, timings: Metrics, step_start: float) -> Metrics:
        """The rest of a step once its experience is ready: update, weight sync, metrics (see the module docstring)."""
        if self.handover is not None:
            start = time.monotonic()
            with span_on(self.timeline, "sync", "hand-over"):
                await self.handover.to_training()
            timings["timing/handover_s"] = time.monotonic() - start
        async with self._updating():
            start = time.monotonic()
            reuse = self._reuses_update_forward(experience)
            with span_on(self.timeline, "trainer", "prepare"):
                await self._computed(self._prepare, experience, metrics, old_log_probs=not reuse)
            timings["timing/prepare_s"] = time.monotonic() - start
            start = time.monotonic()
            with span_on(self.timeline, "trainer", "update"):
                metrics.update(await self._computed(self._update, experience, reuse_forward=reuse))
            timings["timing/update_s"] = time.monotonic() - start
        if self.handover is not None:
            start = time.monotonic()
            with span_on(self.timeline, "sync", "hand-over"):
                await self.handover.to_generation()  # the engines must be awake to load the new weights
            timings["timing/handover_s"] += time.monotonic() - start
        if self._ahead is not None:  # the rollouts generated ahead use the old weights to their end
            start = time.monotonic()
            with span_on(self.timeline, WAITING, "rollouts ahead"):
                await asyncio.wait({self._ahead.rollout})
            timings["timing/wait_ahead_s"] = time.monotonic() - start
        with span_on(self.timeline, "sync", "weight sync"):
            timings["timing/weight_sync_s"] = await self.sync_weights(version=self.global_step + 1)
        self.global_step += 1
        metrics.update(timings)
        if self.timeline is not None:
            step_end = self._now()
            self.timeline.record("step", "step", step_start, step_end)
            metrics["timing/trainer_busy_fraction"] = self.timeline.busy_fraction("trainer", step_start, step_end)
            metrics["timing/engine_busy_fraction"] = self._engine_busy(step_start, step_end)
        metrics["timing/step_s"] = sum(timings.values())
        metrics["system/num_policy_workers"] = float(getattr(self.policy, "num_workers", 1))
        metrics["system/num_engines"] = float(getattr(self.engine, "num_engines", 1))
        roles = {"policy": self.policy, "ref": self.ref, "critic": self.critic}
        metrics.update(device_metrics(self.settings.device, {r: b for r, b in roles.items() if b is not None}))
        self._emit(metrics)
        return metrics

    def _engine_busy(self, start: float, end: float) -> float:
        """The engines' mean busy fraction: over each engine's own lane when they have one, else the shared lane."""
        assert self.timeline is not None
        lanes = [lane for lane in self.timeline.lanes() if lane.startswith("engine ")] or ["engine"]
        return sum(self.timeline.busy_fraction(lane, start, end) for lane in lanes) / len(lanes)

    async def _experience(
        self, prompts: Sequence[PromptRecord], next_prompts: PromptSource | None
    ) -> tuple[Experience, Metrics, int]:
        """The experience of ``prompts`` (generated ahead during the last step, or now) and its policy version.

        The version is the number of optimizer steps behind the weights that generated it.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return (*await self._rollout(prompts, next_prompts), self.global_step)
        if ahead.prompts is not prompts:
            ahead.rollout.cancel()
            raise ValueError("train_step got other prompts than the upcoming ones of the last step: pass those")
        experience, metrics = await ahead.rollout
        return experience, metrics, ahead.version

    def _now(self) -> float:
        return self.timeline.now() if self.timeline is not None else 0.0

    async def _computed(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, on the compute thread when there is one (see ``skyrl_train.compute_thread``).

        Tensor work of the loop itself (advantages, mini-batch selection) then shares the thread of the model work,
        and the event loop keeps running meanwhile.
        """
        if self.compute is not None:
            return await self.compute.acall(fn, *args, **kwargs)
        generating = self._stream is not None or (self._ahead is not None and not self._ahead.rollout.done())
        if generating:
            # Backends in other processes block on their calls: off the event loop, the rollouts generated ahead
            # (or the fully-async stream) keep going meanwhile.
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    async def _rollout(
        self, prompts: Sequence[PromptRecord], next_prompts: PromptSource | None, step: int | None = None
    ) -> tuple[Experience, Metrics]:
        """Step ``step``'s experience (after dynamic sampling, if configured) and its rollout and reward metrics.

        ``step`` (default: the current one) seeds the sampling, so a batch generated a step ahead draws what it would
        have drawn in its own step.
        """
        outputs: list[GeneratorOutput] = []
        step = self.global_step if step is None else step

        async def sample(attempt: int) -> Experience:
            batch = prompts if attempt == 0 else self._refill(next_prompts)
            request = self._generator_input(batch, training=True, attempt=attempt, step=step)
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
        return experience, {**_mean_metrics([o.metrics for o in outputs]), **_reward_metrics(outputs), **metrics}

    def _refill(self, next_prompts: PromptSource | None) -> Sequence[PromptRecord]:
        if next_prompts is None:
            raise DynamicSamplingError(
                "dynamic sampling needs another batch of prompts but train_step got no next_prompts: "
                "pass next_prompts (e.g. lambda: next(batches)) or set algorithm.dynamic_sampling=null"
            )
        return next_prompts()

    def _generator_input(
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

    def _reuses_update_forward(self, experience: Experience) -> bool:
        """Whether the update's forward pass can give the old log-probs (see "One update" in the module docstring)."""
        s = self.settings
        if not s.reuse_update_log_probs or s.update_epochs_per_batch != 1 or s.use_kl_in_reward:
            return False
        if experience.num_groups > s.policy_mini_batch_size:  # more than one mini-batch: later ones are off-policy
            return False
        has_active_dropout = getattr(self.policy, "has_active_dropout", None)
        return has_active_dropout is not None and not has_active_dropout()

    def _prepare(self, experience: Experience, metrics: Metrics, *, old_log_probs: bool = True) -> None:
        """Fill old log-probs (unless ``old_log_probs`` is False), ref log-probs and advantages into the batch.

        Failed trajectories stay in the batch (masked) but take no part in the advantages' statistics: see
        "Failed trajectories" in ``skyrl_train.algorithms.advantages``.

        Raises:
            ValueError: the objective needs the engine's rollout log-probs and the generator returned none.
        """
        batch = experience.batch
        _check_rollout_log_probs(self.objective, batch)
        if POLICY_VERSIONS in batch.tensors:
            metrics.update(_add_token_staleness(batch, self.global_step))
        temperature = self.settings.logprob_temperature
        if old_log_probs:
            batch.tensors["old_log_probs"] = self.policy.forward(batch, temperature=temperature).log_probs.detach()
            if _ROLLOUT in batch.tensors:
                metrics[_GAP] = _mean_gap(batch.tensors[_ROLLOUT], batch.tensors["old_log_probs"], batch.response_mask)
        else:
            # The gap is measured on the training forward, over the tokens generated (before any filter below).
            batch.tensors[_GAP_MASK] = batch.response_mask
        if self.ref is not None:
            batch.tensors["ref_log_probs"] = self.ref.forward(batch, temperature=temperature).log_probs.detach()
        if self.critic is not None:
            batch.tensors["values"] = _critic_values(self.critic, batch)
        rewards = batch.tensors["rewards"]
        if self.settings.use_kl_in_reward and self.kl_controller is not None:
            rewards, kl_metrics = apply_kl_penalty(
                rewards,
                batch.tensors["old_log_probs"],
                batch.tensors["ref_log_probs"],
                batch.response_mask,
                self.kl_controller.value,
                self.settings.kl_estimator_type,
            )
            self.kl_controller.update(kl_metrics["kl"], len(batch))
            metrics.update({f"reward/{k}": v for k, v in kl_metrics.items()})
        if experience.step_wise:
            self._check_step_wise()
            rewards = fold_into_last_steps(rewards, batch.response_mask, experience.trajectory_end)
        counted = experience.counted  # surviving trajectories, once each (their last row)
        if self.settings.zero_variance_filter:
            batch.response_mask = mask_zero_variance_groups(
                batch.response_mask, experience.trajectory_rewards, experience.group_index, valid=counted
            )
        advantages, returns = estimate_advantages(
            get_advantage_estimator(self.settings.advantage_estimator),
            rewards,
            batch.response_mask,
            self.settings.advantage,
            group_index=experience.group_index,
            values=batch.tensors.get("values"),
            valid=counted,
        )
        if experience.step_wise:
            advantages, returns = self._broadcast_steps(experience, advantages, returns)
        batch.tensors["advantages"] = advantages
        batch.tensors["returns"] = returns
        metrics["policy/advantage_abs_mean"] = masked_mean(advantages.abs(), batch.response_mask).item()
        metrics["policy/trained_token_fraction"] = batch.response_mask.mean().item()
        if self.critic is not None:
            values, mask = batch.tensors["values"], batch.response_mask
            metrics["critic/explained_variance"] = explained_variance(values, returns, mask)
            metrics["critic/returns_mean"] = masked_mean(returns, mask).item()

    def _check_step_wise(self) -> None:
        """Raise ``ValueError`` when step-wise rows meet ``gae``, whose per-token values belong to one row."""
        if self.settings.advantage_estimator == "gae":
            raise ValueError(
                "the generator returned step-wise rows (is_last_step) and algorithm.advantage_estimator is 'gae', "
                "whose per-token advantages do not carry from one row to another: use an outcome estimator "
                "(grpo, rloo, maxrl, reinforce++) or a generator that returns one row per trajectory"
            )

    @staticmethod
    def _broadcast_steps(
        experience: Experience, advantages: torch.Tensor, returns: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every step-wise row takes its trajectory's last row's advantage and return (see ``generators.base``)."""
        mask, end = experience.batch.response_mask, experience.trajectory_end
        return broadcast_from_last_steps(advantages, mask, end), broadcast_from_last_steps(returns, mask, end)

    def _update(self, experience: Experience, *, reuse_forward: bool = False) -> Metrics:
        """Update epochs over mini-batches of whole prompt groups; return averaged loss metrics.

        The critic, when there is one, takes an optimizer step on each mini-batch right after the policy: both
        learn from the same shuffled mini-batches, and neither update changes what the other one sees (the old
        log-probs, values, advantages and returns were all computed before the first update). With
        ``reuse_forward`` the batch has no old log-probs: each micro-batch takes the detached log-probs of its own
        forward pass, and the loss function reports the rollout log-prob gap of that pass among its metrics (see
        :func:`_on_policy_update`), so the gap comes back from wherever the backend runs the loss.
        """
        loss_fn = make_loss_fn(self.objective)
        gap: Metrics = {}  # the gap of a mini-batch with nothing to train on, from a forward of its own
        value_loss_fn = make_value_loss_fn(self.settings.value_clip)
        sums: defaultdict[str, float] = defaultdict(float)
        skipped: defaultdict[str, float] = defaultdict(float)  # optimizer steps skipped, per model
        count = 0
        rng = random.Random(self.settings.seed * 1_000_003 + self.global_step)
        for _ in range(self.settings.update_epochs_per_batch):
            for rows in self._mini_batches(experience.group_index, rng):
                mini = experience.batch.select(rows)
                if mini.response_mask.sum() == 0:  # nothing to learn from (e.g. every group zero-variance or failed)
                    if reuse_forward:
                        gap = self._measure_gap(mini)  # before the step, which leaves the weights as they are
                    self._advance_schedules()
                    continue
                ends = experience.trajectory_end[rows]
                add_token_weights(mini, experience.group_index[rows], self.objective, trajectory_index=ends)
                sent, sent_loss_fn = _on_policy_update(mini, loss_fn) if reuse_forward else (mini, loss_fn)
                stats = self.policy.forward_backward(
                    sent,
                    sent_loss_fn,
                    temperature=self.settings.logprob_temperature,
                    with_entropy=self.objective.needs_entropy,
                )
                stats.update(self.policy.optim_step())
                if self.critic is not None:
                    stats.update(_critic_step(self.critic, mini, value_loss_fn))
                for key, value in stats.items():
                    if key.endswith("skipped"):
                        skipped[key] += value
                    else:
                        sums[key] += value
                count += 1
        metrics = {k if "/" in k else f"policy/{k}": v / count for k, v in sums.items()} if count else {}
        metrics["policy/optimizer_steps"] = float(count)
        metrics.update(_skipped_steps(skipped, self.global_step))
        metrics.update(gap)
        return metrics

    def _advance_schedules(self) -> None:
        """An optimizer step without gradients: weights and moments stay, the LR schedules keep to the plan.

        The schedules are sized for every mini-batch of the run; skipping a mini-batch without stepping would
        leave a decaying schedule short of its end.
        """
        self.policy.optim_step()
        if self.critic is not None:
            self.critic.optim_step()

    def _measure_gap(self, batch: TrainingBatch) -> Metrics:
        """``policy/rollout_logprob_gap`` of ``batch`` from a forward pass of its own; {} without rollout log-probs.

        For an on-policy mini-batch with nothing to train on: no training forward runs to measure the gap.
        """
        if _ROLLOUT not in batch.tensors:
            return {}
        log_probs = self.policy.forward(batch, temperature=self.settings.logprob_temperature).log_probs
        return {_GAP: _mean_gap(batch.tensors[_ROLLOUT], log_probs, batch.tensors[_GAP_MASK])}

    def _mini_batches(self, group_index: torch.Tensor, rng: random.Random) -> Iterator[torch.Tensor]:
        """Row indices of each mini-batch: ``policy_mini_batch_size`` whole groups, groups in shuffled order."""
        groups: dict[int, list[int]] = defaultdict(list)
        for row, group in enumerate(group_index.tolist()):
            groups[group].append(row)
        order = list(groups)
        rng.shuffle(order)
        size = self.settings.policy_mini_batch_size
        for start in range(0, len(order), size):
            rows = [row for group in order[start : start + size] for row in groups[group]]
            yield torch.tensor(sorted(rows), dtype=torch.long)

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
        output = await self.generator.generate(self._generator_input(prompts, training=False))
        rewards = output.trajectory_rewards()
        n = self.settings.eval_n_samples_per_prompt
        by_source: defaultdict[str, list[float]] = defaultdict(list)
        for index, reward in enumerate(rewards):
            by_source[prompts[index // n].data_source].append(reward)
        metrics = {f"eval/{src}/reward_mean": sum(v) / len(v) for src, v in by_source.items()}
        metrics["eval/all/reward_mean"] = sum(rewards) / max(len(rewards), 1)
        metrics["eval/all/pass_rate"] = sum(r > 0 for r in rewards) / max(len(rewards), 1)
        return metrics

    # ------------------------------------------------------------------------------------------ helpers

    def _emit(self, metrics: Metrics) -> None:
        if self.sink is not None:
            self.sink.log(metrics, self.global_step)
        for callback in self.callbacks:
            callback(self, metrics)


def _reward_metrics(outputs: Sequence[GeneratorOutput]) -> Metrics:
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


def _mean_metrics(rows: Sequence[Mapping[str, float]]) -> Metrics:
    """Each key's mean over the rows that have it (the generator's batch statistics over refills)."""
    values: defaultdict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in row.items():
            values[key].append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}


def _critic_values(critic: TrainingBackend, batch: TrainingBatch) -> torch.Tensor:
    """``[B, T]`` values of the batch's response tokens, as the critic predicts them before this step's update."""
    values = critic.forward(batch).values
    if values is None:
        raise TypeError(f"the critic ({type(critic).__name__}) returned no values: build it as a CriticBackend")
    return values.detach()


def _critic_step(critic: TrainingBackend, mini: TrainingBatch, loss_fn: LossFn) -> Metrics:
    """One critic optimizer step on a mini-batch; metrics under ``critic/`` (``value_loss``, ``grad_norm``, …)."""
    stats = critic.forward_backward(mini, loss_fn)
    stats["value_loss"] = stats.pop("loss")
    stats.update(critic.optim_step())
    return {key if "/" in key else f"critic/{key}": value for key, value in stats.items()}


_GAP = "policy/rollout_logprob_gap"
_GAP_MASK = "logprob_gap_mask"
"""``tensors`` key of the ``[B, T]`` mask the rollout log-prob gap is measured over, when the update measures it."""
_TRAINED_MASK = "trained_mask"
"""``tensors`` key of the ``[B, T]`` mask of the tokens an on-policy update trains on (:func:`_on_policy_update`)."""


def _mean_gap(rollout: torch.Tensor, log_probs: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean ``|rollout − log_probs|`` (both ``[B, T]``) over the tokens of ``mask``; 0 over none."""
    return float(masked_mean((rollout - log_probs.detach().to(rollout.device)).abs(), mask.to(rollout.device)))


def _on_policy_update(mini: TrainingBatch, loss_fn: LossFn) -> tuple[TrainingBatch, LossFn]:
    """The batch and loss function to send for an update whose forward pass also gives the old log-probs.

    Only valid when the forward pass runs on the weights that sampled the batch and computes what a no-grad forward
    would (see "One update" in the module docstring). The gap to the rollout log-probs is measured over the
    generated tokens (``tensors[_GAP_MASK]``), which include groups the zero-variance filter left out of
    ``response_mask``. The backend combines non-loss metrics over micro-batches and ranks weighted by their
    ``response_mask`` tokens, and pads a rank's short share with copies of a row whose ``response_mask`` alone is
    zeroed; so the batch sent carries the generated tokens as ``response_mask`` (the gap's weights, zero on padding)
    and the trained ones under ``_TRAINED_MASK``, which the loss function turns back into the mask it trains with.
    """
    trained = mini.response_mask
    tensors = {name: t for name, t in mini.tensors.items() if name != _GAP_MASK}
    sent = replace(mini, response_mask=mini.tensors[_GAP_MASK], tensors={**tensors, _TRAINED_MASK: trained})
    # Generated over trained tokens of the mini-batch: converts the backend's weights back (see below).
    scale = float(sent.response_mask.sum()) / float(trained.sum())
    return sent, _with_current_as_old(loss_fn, scale)


def _with_current_as_old(loss_fn: LossFn, scale: float) -> LossFn:
    """``loss_fn`` on a micro-batch of :func:`_on_policy_update`'s batch, with the forward's log-probs as old ones.

    Its metrics add ``policy/rollout_logprob_gap``: the mean over the micro-batch's generated tokens (its
    ``response_mask``, ``g`` of them), which the backend's weighting by ``g`` makes the mean over all of them.
    ``loss_fn`` sees the ``t`` trained tokens as its mask, and its metrics are means over those; each is multiplied
    by ``t / g · scale`` (``scale``: the mini-batch's generated over its trained tokens), so that the backend's
    ``g``-weighted mean comes out as the ``t``-weighted one. ``*_loss`` shares are summed, not weighted: they stay.
    """

    def on_policy_loss_fn(output: ModelOutput, batch: TrainingBatch) -> tuple[torch.Tensor, dict[str, float]]:
        current = output.log_probs.detach()
        generated = batch.response_mask
        trained = batch.tensors[_TRAINED_MASK] * generated  # 0 on padding rows, whose generated mask alone is 0
        tensors = {**batch.tensors, "old_log_probs": current}
        loss, metrics = loss_fn(output, replace(batch, response_mask=trained, tensors=tensors))
        share = float(trained.sum()) / max(float(generated.sum()), 1.0) * scale
        metrics = {name: v if name.endswith("_loss") else v * share for name, v in metrics.items()}
        if _ROLLOUT in batch.tensors:
            metrics[_GAP] = _mean_gap(batch.tensors[_ROLLOUT], current, generated)
        return loss, metrics

    return on_policy_loss_fn


_ROLLOUT = "rollout_log_probs"


def _add_token_staleness(batch: TrainingBatch, version: int) -> Metrics:
    """Store ``tensors["token_staleness"]`` (policy ``version`` minus each token's); return its mean and maximum.

    Both statistics are over the generated tokens the engine gave a version.
    """
    versions = batch.tensors[POLICY_VERSIONS].float()
    staleness = torch.where(versions >= 0, float(version) - versions, torch.zeros_like(versions))
    batch.tensors[TOKEN_STALENESS] = staleness
    generated = staleness[(batch.response_mask > 0) & (versions >= 0)]
    if generated.numel() == 0:
        return {}
    return {"async/token_staleness": generated.mean().item(), "async/token_staleness_max": generated.max().item()}


def _check_rollout_log_probs(objective: Objective, batch: TrainingBatch) -> None:
    """Fail before any model work when the objective needs rollout log-probs the generator did not return."""
    needed_by = objective.needs_rollout_log_probs
    if needed_by is not None and _ROLLOUT not in batch.tensors:
        raise ValueError(
            f"{needed_by} needs the inference engine's log-probs of the sampled tokens, but the generator returned "
            "none (GeneratorOutput.rollout_logprobs is None): sample with SamplingParams(logprobs=True) from an "
            "engine that reports them, or turn the correction off"
        )


def _skipped_steps(skipped: Mapping[str, float], step: int) -> Metrics:
    """``policy/skipped_steps`` (and ``critic/skipped_steps``): optimizer steps dropped for a non-finite gradient."""
    metrics: Metrics = {}
    for key, count in skipped.items():
        name = key.rsplit("skipped", 1)[0] or "policy/"
        metrics[f"{name}skipped_steps"] = count
        if count:
            logger.warning(
                "step %d: %d %s optimizer step(s) skipped for a non-finite gradient norm", step, count, name[:-1]
            )
    metrics.setdefault("policy/skipped_steps", 0.0)
    return metrics


def state_for_checkpoint(trainer: Trainer) -> dict[str, Any]:
    """JSON-safe loop state to store with a checkpoint (the adaptive KL coefficient)."""
    return {"kl_coef": trainer.kl_controller.value if trainer.kl_controller is not None else None}
