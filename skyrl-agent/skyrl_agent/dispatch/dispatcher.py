"""The dispatcher: runs episodes through acquire sandbox → run agent → grade, with limits, deadlines and retries.

Each stage has its own concurrency limit (a semaphore) so sandbox start-up and grading overlap with generation
for other episodes; sandbox creations can also be rate-limited (asyncio-throttle). Episodes wait in a bounded
input queue, and at most ``prefetch`` started sandboxes wait for a free agent slot.

Admission: given an :class:`~skyrl_agent.dispatch.admission.AdmissionController`, the run limit moves between its
floor and ``StageLimits.run`` with the engines' load (the held sandboxes follow: run limit plus ``prefetch``), and
sandbox creations draw from its host-wide start rate. A lowered limit drains: running episodes are never stopped.

Ownership: the dispatcher owns every sandbox that ``acquire`` returns until it hands it to ``release``, which
it does exactly once per sandbox on every exit path (success, error, timeout, cancellation), through
:class:`~skyrl_agent.dispatch.releases.Releases`. ``run_agent`` and ``grade`` borrow the sandbox and must not close
it. An ``acquire`` call that outlives its start deadline keeps running (a create cannot be taken back half-way) and
keeps its acquire slot until it really ends; a sandbox it still returns is released, and :meth:`Dispatcher.run`
returns only after that.

Time: the episode deadline starts when the episode gets its run (agent) slot. Waiting for a slot (the input
queue, the held, acquire, run and grade slots) is queue time, charged to no deadline and reported apart: as
``queue_wait`` spans, as ``EpisodeResult.queue_s`` and in the ``queue_s/*`` metrics.

Lifetime: one deadline model for the sandbox too. A sandbox whose backend ends it on its own
(:class:`~skyrl_agent.sandbox.base.ExpiringSandbox`) is promised ``Timeouts.sandbox_lifetime_s`` (the episode
deadline plus the grading deadline, in active time) when it starts and again when its run slot begins; at least
``grade_s`` more when its grade slot begins; and, on every :meth:`Dispatcher.resume`, what remains of that
promise in active time, so a weight-sync pause extends the sandbox exactly as it extends the deadlines.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncio_throttle.throttler import Throttler

from skyrl_agent.dispatch.admission import AdjustableLimit, AdmissionController, Slots
from skyrl_agent.dispatch.clock import Deadline, PausableClock, within
from skyrl_agent.dispatch.context import GuardedLLM, RunContext, Timeouts
from skyrl_agent.dispatch.gc_policy import fewer_full_collections
from skyrl_agent.dispatch.outcomes import (
    DEFAULT_POLICY,
    FailurePolicy,
    Outcome,
    Treatment,
    classify_error,
    outcome_metrics,
    ungraded_outcome,
)
from skyrl_agent.dispatch.releases import ReleaseFn, Releases
from skyrl_agent.dispatch.retry import Backoff, CircuitBreaker, CircuitOpenError, retry_infra
from skyrl_agent.dispatch.trace import Trace
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.sandbox.base import ExpiringSandbox, Sandbox, SandboxStartError

logger = logging.getLogger(__name__)

__all__ = [
    "DispatchResult",
    "Dispatcher",
    "DispatcherConfig",
    "Episode",
    "EpisodeResult",
    "GradeResult",
    "StageLimits",
    "TrajectoryLike",
]


@dataclass(frozen=True)
class Episode:
    """One episode to run. ``data`` is the task row (prompt, metadata such as a gold patch, ...)."""

    id: str
    data: Mapping[str, Any] = field(default_factory=dict)
    group_id: str | None = None  # episodes sampled from the same prompt (a GRPO group)


@dataclass(frozen=True)
class GradeResult:
    """What the grader decided: ``reward`` and whether the task counts as resolved."""

    reward: float
    resolved: bool
    details: Mapping[str, Any] = field(default_factory=dict)


class TrajectoryLike(Protocol):
    """What the dispatcher reads from a trajectory: whether the agent ran out of turns or context."""

    @property
    def finish_reason(self) -> str:
        """Why the agent stopped."""
        ...

    @property
    def truncated(self) -> bool:
        """True when the agent stopped for lack of turns or context, without submitting."""
        ...


AcquireFn = Callable[[Episode], Awaitable[Sandbox]]
RunAgentFn = Callable[[Episode, Sandbox, LLMClient, RunContext], Awaitable[TrajectoryLike]]
GradeFn = Callable[[Episode, Sandbox, TrajectoryLike], Awaitable[GradeResult | float]]
LLMFactory = Callable[[Episode], LLMClient]


@dataclass(frozen=True)
class StageLimits:
    """Concurrency of each stage, and the sizes of the queues between them."""

    acquire: int = 8  # sandbox starts at once
    run: int = 32  # agent runs at once
    grade: int = 8  # gradings at once
    prefetch: int = 4  # started sandboxes that may wait for a free agent slot
    queue_size: int = 64  # episodes waiting in the input queue
    acquire_rate_per_s: int | None = None  # sandbox starts per second at most, per run() (None: unlimited)


@dataclass(frozen=True)
class DispatcherConfig:
    """Limits, deadlines, retry behaviour and the failure policy."""

    limits: StageLimits = field(default_factory=StageLimits)
    timeouts: Timeouts = field(default_factory=Timeouts)
    backoff: Backoff = field(default_factory=Backoff)
    breaker_threshold: int = 10  # consecutive infrastructure failures that stop retries
    breaker_cooldown_s: float = 30.0
    breaker_wait_s: float = 120.0  # an outage this young makes starts wait for the circuit, not fail (0: fail fast)
    policy: FailurePolicy = DEFAULT_POLICY
    seed: int = 0  # for retry jitter
    # While run() is active, the GC's oldest-generation threshold is at least this (None: the interpreter's);
    # full collections walk every live episode's objects (see skyrl_agent.dispatch.gc_policy).
    gc_full_collection_threshold: int | None = 100

    def __post_init__(self) -> None:
        threshold = self.gc_full_collection_threshold
        if threshold is not None and threshold < 1:
            raise ValueError(
                f"gc_full_collection_threshold must be at least 1 (got {threshold}); None keeps the interpreter's"
            )


@dataclass
class EpisodeResult:
    """How one episode ended. ``trace`` covers every attempt.

    ``queue_s`` is the wall seconds the episode spent waiting for slots over all its attempts (the sum of its
    ``queue_wait`` spans); no deadline counts them.
    """

    episode: Episode
    outcome: Outcome
    reward: float = 0.0
    trajectory: TrajectoryLike | None = None
    grade: GradeResult | None = None
    error: str | None = None
    attempts: int = 1
    trace: Trace | None = None
    treatment: Treatment = Treatment.TRAIN
    exception: BaseException | None = field(default=None, repr=False)  # what ended a failed attempt
    queue_s: float = 0.0


@dataclass
class DispatchResult:
    """All results, in input order, and their metrics."""

    results: list[EpisodeResult]
    metrics: dict[str, float]


class _Gauge:
    """Current and peak count of work in a stage."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.current = 0
        self.peak = 0

    def enter(self) -> None:
        self.current += 1
        self.peak = max(self.peak, self.current)

    def leave(self) -> None:
        self.current -= 1

    async def wait(self, sem: Slots, trace: Trace, attempt: int) -> None:
        """Take a slot of ``sem``; the wait is a ``queue_wait`` span."""
        with trace.span("queue_wait", slot=self.name, attempt=attempt):
            await sem.acquire()
        self.enter()

    @asynccontextmanager
    async def hold(self, sem: Slots, trace: Trace, attempt: int) -> AsyncIterator[None]:
        await self.wait(sem, trace, attempt)
        try:
            yield
        finally:
            self.leave()
            sem.release()


class _StageFailed(Exception):
    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(f"{stage}: {type(error).__name__}: {error}")
        self.stage = stage
        self.error = error


class Dispatcher:
    """Runs episodes through the three stages. One dispatcher may serve many :meth:`run` calls, one at a time.

    Args:
        acquire: Starts (or takes from a pool) the episode's sandbox; may raise ``SandboxError``.
        run_agent: Runs the agent in the sandbox under the given context's deadlines; returns its trajectory.
        grade: Grades the trajectory (the sandbox is still held); raise :class:`GradingError` when undecided.
        release: Stops or returns a sandbox; called exactly once per acquired sandbox.
        llm: One client for all episodes, or a function of the episode (e.g. the oracle policy).
        config: Limits, deadlines, retries and the failure policy.
        admission: Moves the run limit (``config.limits.run`` at most) with the engines' load and spaces sandbox
            starts; shared by dispatchers that run at once (see :mod:`skyrl_agent.dispatch.admission`).
    """

    def __init__(
        self,
        acquire: AcquireFn,
        run_agent: RunAgentFn,
        grade: GradeFn,
        release: ReleaseFn,
        llm: LLMClient | LLMFactory,
        config: DispatcherConfig | None = None,
        *,
        clock: PausableClock | None = None,
        admission: AdmissionController | None = None,
    ) -> None:
        self._acquire_fn, self._run_fn, self._grade_fn = acquire, run_agent, grade
        self._llm = llm
        self.config = config or DispatcherConfig()
        self.clock = clock or PausableClock()
        self.admission = admission
        cfg = self.config
        self.breaker = CircuitBreaker(cfg.breaker_threshold, cfg.breaker_cooldown_s)
        self._rng = random.Random(cfg.seed)
        self.gauges = {name: _Gauge(name) for name in ("acquire", "run", "grade", "held")}
        self._releases = Releases(release)
        self._stopping = False
        self._inflight: set[asyncio.Task[EpisodeResult]] = set()
        self._needed: dict[int, tuple[ExpiringSandbox, Deadline]] = {}  # expiring sandboxes held, and for how long

    @property
    def release_errors(self) -> int:
        """``release`` calls that raised, over every :meth:`run` (logged; the reaper finds what they left)."""
        return self._releases.errors

    # -- control -------------------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop the episode clock and hold new LLM calls (e.g. during a weight sync); idempotent."""
        self.clock.pause()

    def resume(self) -> None:
        """Restart the clock and release held LLM calls; idempotent. Held sandboxes are kept alive for the pause."""
        self.clock.resume()
        for sandbox, need in list(self._needed.values()):
            _keep_alive(sandbox, need.remaining_s())

    def stop(self) -> None:
        """End the current :meth:`run` early: running episodes and those not started end as ``cancelled``."""
        self._stopping = True
        for task in self._inflight:
            task.cancel()

    # -- running -------------------------------------------------------------------------------------------

    async def run(self, episodes: Iterable[Episode]) -> DispatchResult:
        """Run every episode; return exactly one result per episode, in input order.

        Returns once every sandbox it acquired is released, including those of starts that outlived their
        deadline. Cancelling this call cancels running episodes, releases their sandboxes, and re-raises.
        """
        self._stopping = False
        limits = self.config.limits
        sems, resize = _stage_slots(limits, self.admission)
        throttler = Throttler(int(limits.acquire_rate_per_s)) if limits.acquire_rate_per_s else None
        queue: asyncio.Queue[tuple[int, Episode, float] | None] = asyncio.Queue(maxsize=limits.queue_size)
        results: dict[int, EpisodeResult] = {}
        n_workers = limits.acquire + limits.run + limits.grade + limits.prefetch

        async def produce() -> int:
            n = 0
            for n, episode in enumerate(episodes, start=1):
                await queue.put((n - 1, episode, self.clock.wall_s()))
            for _ in range(n_workers):
                await queue.put(None)
            return n

        async def work() -> None:
            while (item := await queue.get()) is not None:
                index, episode, enqueued = item
                results[index] = await self._supervise(episode, enqueued, sems, throttler)

        producer = asyncio.create_task(produce())
        workers = [asyncio.create_task(work()) for _ in range(n_workers)]
        follow = [asyncio.create_task(self.admission.follow(limits.run, resize))] if self.admission else []
        with fewer_full_collections(self.config.gc_full_collection_threshold):
            try:
                n = await producer
                await asyncio.gather(*workers)
            finally:
                for task in [producer, *workers, *follow]:
                    task.cancel()
                await asyncio.gather(producer, *workers, *follow, return_exceptions=True)
                await self._releases.drain()  # also the releases of starts that outlived their deadline
        ordered = [results[i] for i in range(n)]
        self._apply_policy(ordered)
        return DispatchResult(ordered, self._metrics(ordered))

    async def _supervise(
        self, episode: Episode, enqueued: float, sems: dict[str, Slots], throttler: Throttler | None
    ) -> EpisodeResult:
        trace = Trace(episode.id, time_fn=self.clock.wall_s)
        trace.add("queue_wait", -(self.clock.wall_s() - enqueued), 0.0, slot="input")
        if self._stopping:
            result = EpisodeResult(episode, Outcome.CANCELLED, error="stopped before start", trace=trace, attempts=0)
        else:
            result = await self._supervised(episode, trace, sems, throttler)
        result.queue_s = sum(span.duration_s for span in trace.named("queue_wait"))
        return result

    async def _supervised(
        self, episode: Episode, trace: Trace, sems: dict[str, Slots], throttler: Throttler | None
    ) -> EpisodeResult:
        task = asyncio.create_task(self._run_episode(episode, trace, sems, throttler))
        self._inflight.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the whole run is being cancelled
            return EpisodeResult(episode, Outcome.CANCELLED, error="stopped while running", trace=trace)
        finally:
            self._inflight.discard(task)

    async def _run_episode(
        self, episode: Episode, trace: Trace, sems: dict[str, Slots], throttler: Throttler | None
    ) -> EpisodeResult:
        attempt = 1
        while True:
            result = await self._attempt(episode, trace, attempt, sems, throttler)
            retry = self.config.policy.should_retry(result.outcome, attempt)
            if not retry or isinstance(result.exception, CircuitOpenError):
                return result  # a re-run would meet the circuit that already failed this one
            with trace.span("retry_wait", attempt=attempt):
                await asyncio.sleep(self.config.backoff.delay_s(attempt, self._rng))
            attempt += 1

    async def _attempt(
        self,
        episode: Episode,
        trace: Trace,
        attempt: int,
        sems: dict[str, Slots],
        throttler: Throttler | None,
    ) -> EpisodeResult:
        timeouts = self.config.timeouts
        sandbox: Sandbox | None = None
        trajectory: TrajectoryLike | None = None
        stage = "acquire"
        try:
            async with self.gauges["held"].hold(sems["held"], trace, attempt):
                sandbox = await self._acquire(episode, trace, sems["acquire"], throttler, attempt)
                self._promise(sandbox, timeouts.sandbox_lifetime_s)  # through the wait for a run slot
                stage = "agent"
                async with self.gauges["run"].hold(sems["run"], trace, attempt):
                    # The episode deadline starts now: queueing for this slot is not the episode's time.
                    ctx = RunContext(clock=self.clock, timeouts=timeouts, trace=trace)
                    lifetime = self._promise(sandbox, timeouts.sandbox_lifetime_s)
                    with trace.span("agent", attempt=attempt):
                        # The episode deadline also bounds run_agent functions that ignore the context.
                        run = self._run_fn(episode, sandbox, self._client(episode, ctx), ctx)
                        trajectory = await within(run, ctx._episode())
            ungraded = ungraded_outcome(trajectory.finish_reason, trajectory.truncated)
            if ungraded is not None:
                return self._result(episode, ungraded, attempt, trace, trajectory=trajectory)
            stage = "grade"
            async with self.gauges["grade"].hold(sems["grade"], trace, attempt):
                self._promise(sandbox, _at_least(lifetime, timeouts.grade_s))
                with trace.span("grade", attempt=attempt):
                    grading = self._grade_fn(episode, sandbox, trajectory)
                    graded = await within(grading, Deadline(self.clock, timeouts.grade_s, "grade"))
            grade = graded if isinstance(graded, GradeResult) else GradeResult(float(graded), float(graded) > 0)
            outcome = Outcome.RESOLVED if grade.resolved else Outcome.UNRESOLVED
            return self._result(episode, outcome, attempt, trace, trajectory=trajectory, grade=grade)
        except Exception as exc:
            logger.info("episode %s attempt %d failed in %s: %r", episode.id, attempt, stage, exc)
            outcome = classify_error(exc, stage)
            kept = trajectory if outcome is Outcome.AGENT_BROKE_SANDBOX else None  # trained on: keep its tokens
            return self._result(
                episode, outcome, attempt, trace, trajectory=kept, error=f"{stage}: {exc!r}", exception=exc
            )
        finally:
            if sandbox is not None:
                self._needed.pop(id(sandbox), None)
                await self._releases.release(sandbox, trace)

    async def _acquire(
        self, episode: Episode, trace: Trace, sem: Slots, throttler: Throttler | None, attempt: int
    ) -> Sandbox:
        """Start the episode's sandbox, retrying infrastructure failures. Each try has its own start deadline."""

        async def one_try() -> Sandbox:
            return await self._start_one(episode, trace, sem, throttler, attempt)

        async def admit() -> None:
            await self._admitted(trace, attempt)

        return await retry_infra(one_try, self.config.backoff, self.breaker, self._rng, admit=admit)

    async def _admitted(self, trace: Trace, attempt: int) -> None:
        """Pass the circuit breaker; while the outage is young, wait for it (a ``queue_wait`` span: ``breaker``)."""
        try:
            self.breaker.check()
            return
        except CircuitOpenError:
            if self.breaker.outage_s >= self.config.breaker_wait_s:
                raise
        with trace.span("queue_wait", slot="breaker", attempt=attempt):
            await self.breaker.admit(self.config.breaker_wait_s)

    async def _start_one(
        self, episode: Episode, trace: Trace, sem: Slots, throttler: Throttler | None, attempt: int
    ) -> Sandbox:
        """One ``acquire`` call under the start deadline; its slot is held until the call really ends."""
        gauge = self.gauges["acquire"]
        await gauge.wait(sem, trace, attempt)

        def free_slot(_: object = None) -> None:
            gauge.leave()
            sem.release()

        try:
            self.breaker.check()  # again: the circuit may have opened while this try waited for a slot
            if throttler is not None:
                async with throttler:
                    pass
            if self.admission is not None:
                await self.admission.admit_start()
            create = asyncio.ensure_future(self._acquire_fn(episode))
        except BaseException:
            free_slot()
            raise
        # Shielded below: a create cannot be taken back half-way. When this try gives up on it (deadline,
        # cancellation) it runs on and keeps the slot, so creates in flight never exceed ``limits.acquire``.
        create.add_done_callback(free_slot)
        with trace.span("sandbox_start", attempt=attempt):
            start = Deadline(self.clock, self.config.timeouts.sandbox_start_s, "sandbox_start")
            try:
                return await within(asyncio.shield(create), start)
            except BaseException as exc:
                self._releases.release_late(create)
                if isinstance(exc, TimeoutError):
                    # A start that hangs is an infrastructure failure: retry it on a fresh sandbox.
                    raise SandboxStartError(f"sandbox start for {episode.id} timed out: {exc}") from exc
                raise

    def _promise(self, sandbox: Sandbox, budget_s: float | None) -> Deadline:
        """Tell an expiring ``sandbox`` it is needed ``budget_s`` active seconds more (renewed on resume)."""
        need = Deadline(self.clock, budget_s, "sandbox")
        if budget_s is not None and isinstance(sandbox, ExpiringSandbox):
            self._needed[id(sandbox)] = (sandbox, need)
            _keep_alive(sandbox, budget_s)
        return need

    def _client(self, episode: Episode, ctx: RunContext) -> LLMClient:
        inner = self._llm if isinstance(self._llm, LLMClient) else self._llm(episode)
        return GuardedLLM(inner, ctx)

    @staticmethod
    def _result(episode: Episode, outcome: Outcome, attempt: int, trace: Trace, **fields: Any) -> EpisodeResult:
        grade = fields.get("grade")
        reward = grade.reward if isinstance(grade, GradeResult) else 0.0
        return EpisodeResult(episode, outcome, reward=reward, attempts=attempt, trace=trace, **fields)

    def _apply_policy(self, results: list[EpisodeResult]) -> None:
        treatments = self.config.policy.group_treatments(
            [r.outcome for r in results], [r.episode.group_id for r in results]
        )
        for result, treatment in zip(results, treatments, strict=True):
            result.treatment = treatment
            if treatment is not Treatment.TRAIN:
                result.reward = 0.0

    def _metrics(self, results: list[EpisodeResult]) -> dict[str, float]:
        metrics = outcome_metrics([r.outcome for r in results], [r.treatment for r in results])
        metrics["retries"] = float(sum(max(r.attempts - 1, 0) for r in results))
        metrics["breaker_trips"] = float(self.breaker.trips)
        metrics["release_errors"] = float(self.release_errors)
        queue_s = [r.queue_s for r in results]
        metrics["queue_s/mean"] = sum(queue_s) / len(queue_s) if queue_s else 0.0
        metrics["queue_s/max"] = max(queue_s, default=0.0)
        for name, gauge in self.gauges.items():
            metrics[f"stage/{name}/peak"] = float(gauge.peak)
        if self.admission is not None:
            metrics["stage/run/limit"] = float(self.admission.limit(self.config.limits.run))
        return metrics


def _stage_slots(
    limits: StageLimits, admission: AdmissionController | None
) -> tuple[dict[str, Slots], Callable[[int], None]]:
    """Each stage's slots, and the function that resizes the run stage (and the held sandboxes with it)."""
    admitted = limits.run if admission is None else admission.poll(limits.run)
    run, held = AdjustableLimit(admitted), AdjustableLimit(admitted + limits.prefetch)

    def resize(limit: int) -> None:
        run.set_limit(limit)
        held.set_limit(limit + limits.prefetch)  # still at most ``prefetch`` started sandboxes wait for a run slot

    grade = asyncio.Semaphore(limits.grade)
    return {"acquire": asyncio.Semaphore(limits.acquire), "run": run, "grade": grade, "held": held}, resize


def _at_least(need: Deadline, budget_s: float | None) -> float | None:
    """The larger of what remains of ``need`` and ``budget_s`` (None: unbounded)."""
    if need.budget_s is None or budget_s is None:
        return None
    return max(need.remaining_s(), budget_s)


def _keep_alive(sandbox: ExpiringSandbox, seconds: float) -> None:
    try:
        sandbox.keep_alive(max(seconds, 0.0))
    except Exception:  # the sandbox may expire early; the episode then fails as a dead sandbox, not here
        logger.exception("keeping sandbox %s alive failed", getattr(sandbox, "id", "?"))
