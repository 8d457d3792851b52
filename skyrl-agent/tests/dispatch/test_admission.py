"""Admission: the AIMD run limit, the resizable limit, the start-rate bucket, and a real dispatcher following a load."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import pytest

from skyrl_agent.dispatch import (
    AdjustableLimit,
    AdmissionConfig,
    AdmissionController,
    Dispatcher,
    DispatcherConfig,
    Episode,
    GradeResult,
    Outcome,
    RunContext,
    StageLimits,
)
from skyrl_agent.dispatch.admission import TokenBucket, next_limit, pressure
from skyrl_agent.integrations.skyrl_train import engine_admission
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.sandbox.base import Sandbox
from skyrl_agent.testing import FakeSandbox, ScriptedClient


@dataclass(frozen=True)
class Load:
    waiting: int | None = 0
    kv_cache_usage: float | None = None


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


FULL, EMPTY = Load(0, 1.0), Load(0, 0.1)


# -- the rule --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("load", "expected"),
    [
        (Load(0, 0.95), "saturated"),
        (Load(9, 0.1), "saturated"),  # more waiting than waiting_high (4)
        (Load(0, 0.5), "headroom"),
        (Load(None, 0.5), "headroom"),
        (Load(0, None), "headroom"),
        (Load(3, 0.5), "steady"),
        (Load(None, None), "unknown"),
        (None, "unknown"),
    ],
)
def test_pressure(load: Load | None, expected: str) -> None:
    assert pressure(load, AdmissionConfig()) == expected


def test_additive_increase_multiplicative_decrease() -> None:
    config = AdmissionConfig(floor=2, increase=3, decrease=0.5)
    assert next_limit(10, FULL, config, ceiling=32) == 5
    assert next_limit(3, FULL, config, ceiling=32) == 2  # not below the floor
    assert next_limit(10, EMPTY, config, ceiling=32) == 13
    assert next_limit(31, EMPTY, config, ceiling=32) == 32  # not above the ceiling
    assert next_limit(10, Load(2, 0.5), config, ceiling=32) == 10
    assert next_limit(10, None, config, ceiling=32) == 10
    assert next_limit(10, FULL, AdmissionConfig(floor=8), ceiling=4) == 4  # a floor above the ceiling yields


def test_the_limit_stays_between_floor_and_ceiling() -> None:
    rng = random.Random(0)
    clock = FakeClock()
    loads: list[Load | None] = [FULL, EMPTY, Load(2, 0.5), Load(None, None), None]
    current: list[Load | None] = [EMPTY]
    config = AdmissionConfig(floor=3, increase=5, decrease=0.3, interval_s=1.0)
    controller = AdmissionController(config, lambda: current[0], time_fn=clock)
    for _ in range(2000):
        current[0] = rng.choice(loads)
        clock.now += rng.choice([0.2, 1.0, 3.0])
        ceiling = rng.choice([3, 8, 16])
        assert 3 <= controller.poll(ceiling) <= ceiling


def test_poll_adjusts_at_once_then_once_per_interval() -> None:
    clock = FakeClock()
    reads: list[float] = []

    def load() -> Load:
        reads.append(clock.now)
        return FULL

    controller = AdmissionController(AdmissionConfig(interval_s=5.0), load, time_fn=clock)
    assert controller.limit(16) == 16  # the ceiling before the first reading
    assert controller.poll(16) == 8
    clock.now = 4.9
    assert controller.poll(16) == 8
    assert controller.due_in_s() == pytest.approx(0.1)
    clock.now = 5.0
    assert controller.poll(16) == 4
    assert reads == [0.0, 5.0]


def test_a_failing_or_missing_load_holds_the_limit() -> None:
    def broken() -> Load:
        raise RuntimeError("engine gone")

    clock = FakeClock()
    controller = AdmissionController(AdmissionConfig(interval_s=1.0), broken, time_fn=clock)
    assert controller.poll(8) == 8
    assert not AdmissionController(AdmissionConfig(), None).follows_load
    off = AdmissionController(AdmissionConfig(enabled=False), lambda: FULL, time_fn=clock)
    assert not off.follows_load
    assert off.poll(8) == 8


def test_config_errors_are_reported_together() -> None:
    with pytest.raises(ValueError, match=r"floor.*decrease.*starts_per_s"):
        AdmissionConfig(floor=0, decrease=1.5, starts_per_s=0)


# -- the resizable limit ---------------------------------------------------------------------------------


def test_raising_the_limit_wakes_waiters_and_lowering_drains() -> None:
    async def main() -> None:
        limit = AdjustableLimit(1)
        await limit.acquire()
        waiters = [asyncio.create_task(limit.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        limit.set_limit(3)
        await asyncio.sleep(0)
        assert [w.done() for w in waiters] == [True, True, False]
        assert limit.held == 3
        limit.set_limit(1)  # three hold it: nobody new until fewer than one do
        limit.release()
        limit.release()
        await asyncio.sleep(0)
        assert not waiters[2].done()
        assert limit.held == 1
        limit.release()
        await asyncio.sleep(0)
        assert waiters[2].done()
        assert limit.held == 1

    asyncio.run(main())


def test_a_waiter_cancelled_as_it_is_granted_passes_its_slot_on() -> None:
    async def main() -> None:
        limit = AdjustableLimit(1)
        await limit.acquire()
        cancelled = asyncio.create_task(limit.acquire())
        later = asyncio.create_task(limit.acquire())
        await asyncio.sleep(0)
        limit.release()  # grants `cancelled`...
        cancelled.cancel()  # ...which is cancelled before it runs
        await later
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert limit.held == 1

    asyncio.run(main())


# -- the start rate --------------------------------------------------------------------------------------


def _most_in_any_window(times: list[float], width: float) -> int:
    return max(sum(1 for t in times if start <= t < start + width) for start in times)


def test_token_bucket_caps_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_per_s=10.0, burst=3, time_fn=clock)
    starts = []
    for _ in range(40):  # callers arrive every 20 ms, twice as fast as the rate
        starts.append(clock.now + bucket.reserve())
        clock.now += 0.02
    assert starts == sorted(starts)
    assert starts[:3] == pytest.approx([0.0, 0.02, 0.04])  # the burst passes at once
    for width in (0.1, 0.5, 1.0):
        assert _most_in_any_window(starts, width) <= 3 + 10 * width + 1e-9
    assert starts[-1] == pytest.approx(3.7)  # 37 starts after the burst, one per 0.1 s


# -- a real dispatcher -----------------------------------------------------------------------------------


@dataclass
class _Trajectory:
    finish_reason: str = "submitted"
    truncated: bool = False


class FakeEngine:
    """Reports a full KV cache until ``drain_after`` episodes have finished, then an empty one."""

    def __init__(self, drain_after: int) -> None:
        self.drain_after = drain_after
        self.finished = 0

    def load(self) -> Load:
        return FULL if self.finished < self.drain_after else EMPTY


class Stages:
    """Fake stages; each agent run records (episodes finished so far, agent runs in flight) as it starts."""

    def __init__(self, engine: FakeEngine, run_s: float = 0.02) -> None:
        self.engine, self.run_s = engine, run_s
        self.running = 0
        self.entries: list[tuple[int, int]] = []
        self.starts: list[float] = []

    async def acquire(self, episode: Episode) -> Sandbox:
        self.starts.append(asyncio.get_running_loop().time())
        return FakeSandbox()

    async def release(self, sandbox: Sandbox) -> None:
        await sandbox.close()

    async def run_agent(self, episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext) -> Any:
        self.running += 1
        self.entries.append((self.engine.finished, self.running))
        try:
            await asyncio.sleep(self.run_s)
        finally:
            self.running -= 1
            self.engine.finished += 1
        return _Trajectory()

    async def grade(self, episode: Episode, sandbox: Sandbox, trajectory: Any) -> GradeResult:
        return GradeResult(1.0, True)

    def dispatcher(self, admission: AdmissionController, limits: StageLimits) -> Dispatcher:
        config = DispatcherConfig(limits=limits)
        llm = ScriptedClient([])
        return Dispatcher(self.acquire, self.run_agent, self.grade, self.release, llm, config, admission=admission)


def _peak(entries: list[tuple[int, int]], first: int, last: int) -> int:
    """The most agent runs in flight when a run started after ``first`` and before ``last`` episodes finished."""
    return max(running for finished, running in entries if first <= finished < last)


def test_dispatcher_holds_episodes_under_a_full_cache_and_rises_when_it_drains() -> None:
    engine = FakeEngine(drain_after=30)
    stages = Stages(engine)
    config = AdmissionConfig(interval_s=0.01, floor=1, increase=2, decrease=0.5)
    admission = engine_admission(engine, config)
    assert admission is not None
    assert admission.follows_load
    limits = StageLimits(acquire=16, run=8, grade=8, prefetch=0, queue_size=64)
    out = asyncio.run(stages.dispatcher(admission, limits).run([Episode(f"e{i}") for i in range(80)]))
    assert {r.outcome for r in out.results} == {Outcome.RESOLVED}
    # The full cache cuts 8 → 4 at once, then 2, then 1; once the first few episodes have drained, one runs at a time.
    assert _peak(stages.entries, 0, 30) <= 4
    assert _peak(stages.entries, 12, 30) == 1
    # Once the cache drains the limit climbs back towards the ceiling, never past it.
    assert _peak(stages.entries, 30, 80) >= 4
    assert _peak(stages.entries, 0, 80) <= 8
    assert 1 <= out.metrics["stage/run/limit"] <= 8


def test_dispatcher_spaces_sandbox_starts() -> None:
    stages = Stages(FakeEngine(drain_after=0), run_s=0.0)
    admission = engine_admission(None, AdmissionConfig(starts_per_s=50.0, start_burst=2))
    assert admission is not None
    assert not admission.follows_load
    limits = StageLimits(acquire=8, run=8, grade=8)
    out = asyncio.run(stages.dispatcher(admission, limits).run([Episode(f"e{i}") for i in range(12)]))
    assert len(out.results) == 12
    assert len(stages.starts) == 12
    starts = sorted(stages.starts)
    for width in (0.02, 0.05, 0.1):
        assert _most_in_any_window(starts, width) <= 2 + 50 * width + 1  # one more for timer rounding
    assert starts[-1] - starts[0] >= (12 - 2) / 50 * 0.9


def test_no_load_and_no_rate_leave_the_fixed_limits() -> None:
    assert engine_admission(object(), AdmissionConfig()) is None
    assert engine_admission(FakeEngine(0), AdmissionConfig(enabled=False)) is None
    assert engine_admission(FakeEngine(0), AdmissionConfig()) is not None
