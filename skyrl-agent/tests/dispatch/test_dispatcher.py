from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from skyrl_agent.agents import AgentConfig, ReActAgent
from skyrl_agent.dispatch import (
    Backoff,
    CircuitBreaker,
    CircuitOpenError,
    Dispatcher,
    DispatcherConfig,
    Episode,
    FailurePolicy,
    GradeResult,
    GradingError,
    Outcome,
    PausableClock,
    RunContext,
    StageLimits,
    Timeouts,
    Treatment,
)
from skyrl_agent.dispatch.outcomes import DEFAULT_POLICY
from skyrl_agent.dispatch.retry import retry_infra
from skyrl_agent.llm.base import LLMClient, LLMServerError
from skyrl_agent.sandbox.base import Sandbox, SandboxError, SandboxStartError
from skyrl_agent.testing import CountingEnv, FakeSandbox, ScriptedClient


class Harness:
    """Counts sandboxes and lets each test inject failures into one stage."""

    def __init__(self, acquire_delay: float = 0.0, run_delay: float = 0.0, grade_delay: float = 0.0) -> None:
        self.acquired: list[FakeSandbox] = []
        self.released: list[str] = []
        self.acquire_calls = 0
        self.acquire_failures = 0  # the first N acquire calls fail
        self.acquire_delay, self.run_delay, self.grade_delay = acquire_delay, run_delay, grade_delay

    async def acquire(self, episode: Episode) -> Sandbox:
        self.acquire_calls += 1
        await asyncio.sleep(self.acquire_delay)
        if self.acquire_calls <= self.acquire_failures or episode.data.get("acquire") == "fail":
            raise SandboxStartError("daemon said no")
        sandbox = FakeSandbox()
        self.acquired.append(sandbox)
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        self.released.append(sandbox.id)
        await sandbox.close()

    async def run_agent(self, episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext) -> Any:
        mode = episode.data.get("run")
        if mode == "sandbox_dies":
            raise SandboxError("container vanished")
        if mode == "bug":
            raise KeyError("oops")
        await asyncio.sleep(self.run_delay)
        env = CountingEnv()
        if mode == "slow_tool":
            env.step = _slow(env.step)  # type: ignore[method-assign]
        turns = int(episode.data.get("max_turns", 10))
        return await ReActAgent(llm, env, AgentConfig(max_turns=turns, parse=None)).run(
            [{"role": "user", "content": "go"}], ctx
        )

    async def grade(self, episode: Episode, sandbox: Sandbox, trajectory: Any) -> GradeResult:
        await asyncio.sleep(self.grade_delay)
        if episode.data.get("grade") == "fail":
            raise GradingError("harness crashed")
        resolved = episode.data.get("resolved", True)
        return GradeResult(1.0 if resolved else 0.0, bool(resolved))

    def dispatcher(self, llm: LLMClient | None = None, clock: PausableClock | None = None, **config: Any) -> Dispatcher:
        cfg = DispatcherConfig(backoff=Backoff(base_s=0.001, max_s=0.01), **config)
        llm = llm or ScriptedClient(["thinking", "submit"])
        return Dispatcher(self.acquire, self.run_agent, self.grade, self.release, llm, cfg, clock=clock)

    def assert_all_released(self) -> None:
        assert sorted(self.released) == sorted(s.id for s in self.acquired)
        assert all(s.closed for s in self.acquired)


def _slow(step: Any) -> Any:
    def slow(action: str) -> Any:
        import time

        time.sleep(0.3)
        return step(action)

    return slow


def episodes(n: int, **data: Any) -> list[Episode]:
    return [Episode(f"e{i}", dict(data), group_id=f"g{i // 2}") for i in range(n)]


def test_n_in_n_out_all_released_with_traces() -> None:
    h = Harness()
    out = asyncio.run(h.dispatcher().run(episodes(25)))
    assert [r.episode.id for r in out.results] == [f"e{i}" for i in range(25)]
    assert {r.outcome for r in out.results} == {Outcome.RESOLVED}
    assert all(r.reward == 1.0 and r.treatment is Treatment.TRAIN for r in out.results)
    h.assert_all_released()
    names = {s.name for s in out.results[0].trace.spans}  # type: ignore[union-attr]
    assert {"queue_wait", "sandbox_start", "agent", "env_init", "llm_call", "tool_call", "grade", "release"} <= names
    assert out.metrics["outcome/resolved/count"] == 25


@pytest.mark.parametrize(
    ("data", "outcome"),
    [
        ({"resolved": True}, Outcome.RESOLVED),
        ({"resolved": False}, Outcome.UNRESOLVED),
        ({"max_turns": 1}, Outcome.TRUNCATED),
        ({"run": "slow_tool"}, Outcome.TIMED_OUT),
        ({"acquire": "fail"}, Outcome.SANDBOX_ERROR),
        ({"run": "sandbox_dies"}, Outcome.SANDBOX_ERROR),
        ({"grade": "fail"}, Outcome.GRADING_ERROR),
        ({"run": "bug"}, Outcome.AGENT_ERROR),
    ],
)
def test_each_outcome_reachable(data: dict[str, Any], outcome: Outcome) -> None:
    h = Harness()
    timeouts = Timeouts(tool_call_s=0.1)
    out = asyncio.run(h.dispatcher(timeouts=timeouts).run([Episode("e", data)]))
    (result,) = out.results
    assert result.outcome is outcome
    assert sum(out.metrics[f"outcome/{o}/count"] for o in Outcome) == 1
    h.assert_all_released()


def test_model_error_outcome_and_no_retry() -> None:
    class Broken:
        calls = 0

        async def complete(self, prompt: Any, params: Any, *, timeout_s: float | None = None) -> Any:
            Broken.calls += 1
            raise LLMServerError("engine died", 500)

    h = Harness()
    out = asyncio.run(h.dispatcher(llm=Broken()).run([Episode("e")]))
    assert out.results[0].outcome is Outcome.MODEL_ERROR
    assert Broken.calls == 1
    assert out.results[0].attempts == 1
    h.assert_all_released()


def test_llm_and_episode_deadlines() -> None:
    class Slow:
        async def complete(self, prompt: Any, params: Any, *, timeout_s: float | None = None) -> Any:
            await asyncio.sleep(5)

    h = Harness()
    out = asyncio.run(h.dispatcher(llm=Slow(), timeouts=Timeouts(llm_call_s=0.05)).run([Episode("e")]))
    assert out.results[0].outcome is Outcome.TIMED_OUT
    assert "llm" in (out.results[0].error or "")
    out = asyncio.run(h.dispatcher(llm=Slow(), timeouts=Timeouts(episode_s=0.05)).run([Episode("e")]))
    assert out.results[0].outcome is Outcome.TIMED_OUT
    assert "episode" in (out.results[0].error or "")
    h.assert_all_released()


def test_pause_does_not_count_against_deadline() -> None:
    h = Harness(run_delay=0.3)

    async def main() -> Any:
        d = h.dispatcher(timeouts=Timeouts(episode_s=0.5))
        task = asyncio.create_task(d.run([Episode("e")]))
        await asyncio.sleep(0.05)
        d.pause()
        await asyncio.sleep(0.6)  # longer than the whole budget
        d.resume()
        return await task

    out = asyncio.run(main())
    assert out.results[0].outcome is Outcome.RESOLVED


def test_paused_dispatcher_holds_llm_calls() -> None:
    client = ScriptedClient(["submit"])
    h = Harness()

    async def main() -> Any:
        d = h.dispatcher(llm=client)
        d.pause()
        task = asyncio.create_task(d.run([Episode("e")]))
        await asyncio.sleep(0.1)
        assert client.calls == 0
        d.resume()
        return await task

    assert asyncio.run(main()).results[0].outcome is Outcome.RESOLVED


def test_infra_retries_with_backoff() -> None:
    h = Harness()
    h.acquire_failures = 2
    out = asyncio.run(h.dispatcher().run([Episode("e")]))
    assert out.results[0].outcome is Outcome.RESOLVED
    assert h.acquire_calls == 3
    assert len(out.results[0].trace.named("sandbox_start")) == 3  # type: ignore[union-attr]


def test_sandbox_death_reruns_episode_then_masks() -> None:
    h = Harness()
    out = asyncio.run(h.dispatcher().run([Episode("e", {"run": "sandbox_dies"})]))
    (result,) = out.results
    assert result.attempts == DEFAULT_POLICY.max_episode_attempts
    assert result.treatment is Treatment.MASK
    assert out.metrics["retries"] == 1
    h.assert_all_released()


def test_circuit_breaker_stops_retry_storm() -> None:
    h = Harness()
    limits = StageLimits(acquire=1, run=1, grade=1)
    d = h.dispatcher(breaker_threshold=3, breaker_cooldown_s=60, breaker_wait_s=0.0, limits=limits)
    out = asyncio.run(d.run(episodes(30, acquire="fail")))
    assert {r.outcome for r in out.results} == {Outcome.SANDBOX_ERROR}
    assert h.acquire_calls <= 3 + 1  # the threshold, then at most one probe
    assert out.metrics["breaker_trips"] >= 1
    assert any("CircuitOpenError" in (r.error or "") for r in out.results)


def test_retry_infra_never_retries_model_mistakes_and_breaker_half_opens() -> None:
    calls = 0

    async def bad() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("the model's fault")

    breaker = CircuitBreaker(threshold=2, cooldown_s=0.0)
    with pytest.raises(ValueError, match="model"):
        asyncio.run(retry_infra(bad, Backoff(base_s=0), breaker, random.Random(0)))
    assert calls == 1
    now = [0.0]
    breaker = CircuitBreaker(threshold=2, cooldown_s=10.0, time_fn=lambda: now[0])
    breaker.record_failure()
    breaker.record_failure()
    with pytest.raises(CircuitOpenError):
        breaker.check()
    now[0] = 11.0
    breaker.check()  # half-open: one probe passes
    breaker.record_failure()
    assert breaker.is_open


def test_backoff_grows_with_jitter() -> None:
    backoff = Backoff(base_s=1.0, factor=2.0, max_s=5.0, jitter=0.5)
    rng = random.Random(1)
    delays = [backoff.delay_s(n, rng) for n in (1, 2, 3, 4, 5)]
    assert 0.5 <= delays[0] <= 1.0
    assert 1.0 <= delays[1] <= 2.0
    assert 2.0 <= delays[2] <= 4.0
    assert all(d <= 5.0 for d in delays)
    assert len({backoff.delay_s(1, rng) for _ in range(5)}) > 1


def test_stage_concurrency_limits_respected() -> None:
    h = Harness(acquire_delay=0.02, run_delay=0.02, grade_delay=0.02)
    limits = StageLimits(acquire=2, run=3, grade=1, prefetch=1, queue_size=2)
    d = h.dispatcher(limits=limits)
    out = asyncio.run(d.run(episodes(20)))
    assert len(out.results) == 20
    assert 1 <= d.gauges["acquire"].peak <= 2
    assert 1 <= d.gauges["run"].peak <= 3
    assert d.gauges["grade"].peak == 1
    assert d.gauges["held"].peak <= 4  # run + prefetch: started sandboxes never pile up


def test_cancellation_releases_every_sandbox() -> None:
    h = Harness(run_delay=10)

    async def main() -> None:
        task = asyncio.create_task(h.dispatcher().run(episodes(10)))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert h.acquired
    h.assert_all_released()


def test_stop_returns_cancelled_results_for_all() -> None:
    h = Harness(run_delay=10)

    async def main() -> Any:
        d = h.dispatcher(limits=StageLimits(acquire=2, run=2, grade=1, prefetch=0, queue_size=1))
        task = asyncio.create_task(d.run(episodes(12)))
        await asyncio.sleep(0.1)
        d.stop()
        return await task

    out = asyncio.run(main())
    assert len(out.results) == 12
    assert {r.outcome for r in out.results} == {Outcome.CANCELLED}
    assert {r.treatment for r in out.results} == {Treatment.DROP_GROUP}
    h.assert_all_released()


def test_policy_table_and_group_drop() -> None:
    policy = FailurePolicy()
    assert policy.treatment(Outcome.RESOLVED) is Treatment.TRAIN
    assert policy.treatment(Outcome.TRUNCATED) is Treatment.ZERO_REWARD
    assert policy.treatment(Outcome.TIMED_OUT) is Treatment.MASK
    assert policy.should_retry(Outcome.SANDBOX_ERROR, 1)
    assert not policy.should_retry(Outcome.MODEL_ERROR, 1)
    outcomes = [Outcome.RESOLVED, Outcome.CANCELLED, Outcome.RESOLVED, Outcome.TIMED_OUT]
    assert policy.group_treatments(outcomes, ["a", "a", "b", "b"]) == [
        Treatment.DROP_GROUP,
        Treatment.DROP_GROUP,
        Treatment.TRAIN,
        Treatment.MASK,
    ]
    strict = FailurePolicy(max_masked_fraction=0.4)
    assert strict.group_treatments(outcomes[2:], ["b", "b"]) == [Treatment.DROP_GROUP] * 2


def test_sandbox_arriving_as_the_episode_is_stopped_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness()
    d = h.dispatcher()
    record_success = d.breaker.record_success

    def stop_on_arrival() -> None:
        # The breaker hears of the new sandbox in the very turn it is returned: stopping here cancels the
        # episode between the sandbox's arrival and the dispatcher taking ownership of it.
        d.stop()
        record_success()

    monkeypatch.setattr(d.breaker, "record_success", stop_on_arrival)
    out = asyncio.run(d.run([Episode("e")]))
    assert out.results[0].outcome is Outcome.CANCELLED
    assert len(h.acquired) == 1
    h.assert_all_released()


class SlowDaemon(Harness):
    """The first sandbox start takes longer than its deadline; records when each start begins and ends."""

    def __init__(self, first_start_s: float) -> None:
        super().__init__()
        self.first_start_s = first_start_s
        self.events: list[str] = []
        self.in_flight = 0
        self.peak_in_flight = 0

    async def acquire(self, episode: Episode) -> Sandbox:
        self.acquire_calls += 1
        n = self.acquire_calls
        self.events.append(f"start {n}")
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if n == 1:
                await asyncio.sleep(self.first_start_s)
            sandbox = FakeSandbox()
            self.acquired.append(sandbox)
            return sandbox
        finally:
            self.in_flight -= 1
            self.events.append(f"end {n}")


def test_start_timeout_keeps_the_slot_until_the_late_create_ends_and_releases_its_sandbox() -> None:
    h = SlowDaemon(first_start_s=0.3)
    d = h.dispatcher(limits=StageLimits(acquire=1), timeouts=Timeouts(sandbox_start_s=0.05))
    out = asyncio.run(d.run([Episode("e")]))
    (result,) = out.results
    assert result.outcome is Outcome.RESOLVED
    starts = result.trace.named("sandbox_start")  # type: ignore[union-attr]
    assert [s.error for s in starts] == ["SandboxStartError", None]
    assert h.events == ["start 1", "end 1", "start 2", "end 2"]  # the retry waited for the slot
    assert h.peak_in_flight == 1 == d.gauges["acquire"].peak
    h.assert_all_released()  # the late sandbox too, before run() returned


def test_half_open_breaker_lets_one_probe_reach_the_daemon() -> None:
    h = Harness(acquire_delay=0.01)
    d = h.dispatcher(limits=StageLimits(acquire=8, run=8, grade=1), breaker_wait_s=0.0)
    now = [0.0]
    d.breaker = CircuitBreaker(threshold=1, cooldown_s=10.0, time_fn=lambda: now[0])
    d.breaker.record_failure()  # the daemon was down
    now[0] = 11.0  # the cooldown is over: half-open
    out = asyncio.run(d.run(episodes(8, acquire="fail")))
    assert h.acquire_calls == 1
    assert {r.outcome for r in out.results} == {Outcome.SANDBOX_ERROR}
    assert all("CircuitOpenError" in (r.error or "") for r in out.results)
    assert d.breaker.is_open  # the probe failed: open again


def test_queue_time_is_reported_and_not_charged_to_the_episode_deadline() -> None:
    now = [0.0]

    class Slow(Harness):
        async def run_agent(self, episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext) -> Any:
            now[0] += 40.0  # each agent run takes 40 s of the episode's 50 s
            return await super().run_agent(episode, sandbox, llm, ctx)

    h = Slow()
    limits = StageLimits(acquire=2, run=1, grade=2, prefetch=0)  # the second episode queues behind the first
    d = h.dispatcher(clock=PausableClock(lambda: now[0]), limits=limits, timeouts=Timeouts(episode_s=50.0))
    out = asyncio.run(d.run(episodes(2)))
    assert [r.outcome for r in out.results] == [Outcome.RESOLVED, Outcome.RESOLVED]
    assert [r.queue_s for r in out.results] == [0.0, 40.0]
    waits = out.results[1].trace.named("queue_wait")  # type: ignore[union-attr]
    assert sum(s.duration_s for s in waits) == 40.0
    assert {s.attrs["slot"] for s in waits} >= {"input", "held", "acquire", "run", "grade"}
    assert out.metrics["queue_s/max"] == 40.0
    assert out.metrics["queue_s/mean"] == 20.0


class Outage(Harness):
    """A daemon that is down from the first failed start for ``down_s`` seconds, then answers again."""

    def __init__(self, down_s: float) -> None:
        super().__init__(acquire_delay=0.001)
        self.down_s = down_s
        self.down_since: float | None = None
        self.failed_calls = 0

    async def acquire(self, episode: Episode) -> Sandbox:
        loop = asyncio.get_running_loop()
        if self.down_since is None:
            self.down_since = loop.time()
        if loop.time() - self.down_since < self.down_s:
            self.failed_calls += 1
            raise SandboxStartError("connection refused: the daemon restarts")
        return await super().acquire(episode)


def test_an_outage_shorter_than_the_breaker_wait_does_not_drain_the_queue() -> None:
    h = Outage(down_s=0.3)
    limits = StageLimits(acquire=2, run=2, grade=2, prefetch=0)
    d = h.dispatcher(breaker_threshold=3, breaker_cooldown_s=0.1, breaker_wait_s=30.0, limits=limits)
    out = asyncio.run(d.run(episodes(40)))
    assert [r.outcome for r in out.results] == [Outcome.RESOLVED] * 40
    assert out.metrics["breaker_trips"] >= 1
    assert h.failed_calls <= 3 + 4  # the open circuit kept the queue off the daemon: the threshold, then probes
    waited = [s for r in out.results for s in r.trace.named("queue_wait") if s.attrs["slot"] == "breaker"]  # type: ignore[union-attr]
    assert waited, "episodes waited for the circuit as queue time"
    h.assert_all_released()


def test_an_outage_longer_than_the_breaker_wait_fails_fast_after_it() -> None:
    h = Outage(down_s=3600.0)
    limits = StageLimits(acquire=2, run=2, grade=2, prefetch=0)
    d = h.dispatcher(breaker_threshold=3, breaker_cooldown_s=0.05, breaker_wait_s=0.3, limits=limits)
    loop_time: list[float] = []

    async def timed() -> Any:
        start = asyncio.get_running_loop().time()
        out = await d.run(episodes(200))
        loop_time.append(asyncio.get_running_loop().time() - start)
        return out

    out = asyncio.run(timed())
    assert {r.outcome for r in out.results} == {Outcome.SANDBOX_ERROR}
    # One outage budget for the whole run, not one per episode: 200 episodes do not wait 0.3 s each in turn.
    assert loop_time[0] < 0.3 * 200 / 8
    assert h.failed_calls < 30


def test_breaker_wait_zero_keeps_failing_fast() -> None:
    h = Outage(down_s=3600.0)
    d = h.dispatcher(breaker_threshold=3, breaker_cooldown_s=60, breaker_wait_s=0.0)
    out = asyncio.run(d.run(episodes(30)))
    assert {r.outcome for r in out.results} == {Outcome.SANDBOX_ERROR}
    assert not [s for r in out.results for s in r.trace.named("queue_wait") if s.attrs["slot"] == "breaker"]  # type: ignore[union-attr]


def test_a_sandbox_lost_in_grading_is_the_infrastructures_and_retried_a_broken_one_the_agents() -> None:
    from skyrl_agent.dispatch.clock import DeadlineExceeded
    from skyrl_agent.dispatch.outcomes import classify_error
    from skyrl_agent.sandbox.shell import CommandBrokeSandboxError, ShellDiedError

    assert classify_error(ShellDiedError("the container was killed"), "grade") is Outcome.SANDBOX_ERROR
    assert classify_error(CommandBrokeSandboxError("ended from the inside"), "grade") is Outcome.AGENT_BROKE_SANDBOX
    assert classify_error(GradingError("harness crashed"), "grade") is Outcome.GRADING_ERROR
    assert classify_error(DeadlineExceeded("grade", 1.0), "grade") is Outcome.GRADING_ERROR
    assert classify_error(KeyError("bug"), "grade") is Outcome.GRADING_ERROR

    class DiesInGrading(Harness):
        async def grade(self, episode: Episode, sandbox: Sandbox, trajectory: Any) -> GradeResult:
            if len(self.acquired) == 1:
                raise ShellDiedError("the agent's container was killed from the host")
            return await super().grade(episode, sandbox, trajectory)

    h = DiesInGrading()
    out = asyncio.run(h.dispatcher().run([Episode("e")]))
    (result,) = out.results
    assert (result.outcome, result.attempts) == (Outcome.RESOLVED, 2)
    h.assert_all_released()

    class BrokenInGrading(Harness):
        async def grade(self, episode: Episode, sandbox: Sandbox, trajectory: Any) -> GradeResult:
            raise CommandBrokeSandboxError("the sandbox ended from the inside while its diff was taken")

    out = asyncio.run(BrokenInGrading().dispatcher().run([Episode("e")]))
    (result,) = out.results
    assert (result.outcome, result.attempts) == (Outcome.AGENT_BROKE_SANDBOX, 1)
    assert result.treatment is Treatment.ZERO_REWARD
    assert result.trajectory is not None  # its tokens are trained on


class ExpiringFake(FakeSandbox):
    """A hosted-style sandbox that its platform ends once the wall-clock promise of :meth:`keep_alive` passes."""

    def __init__(self, clock: PausableClock, keeps: bool) -> None:
        super().__init__()
        self.clock, self.keeps = clock, keeps
        self.expires_at = clock.wall_s()  # nothing promised yet
        self.promises: list[float] = []

    def keep_alive(self, seconds: float) -> None:
        self.promises.append(seconds)
        if self.keeps:
            self.expires_at = max(self.expires_at, self.clock.wall_s() + seconds)

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> Any:
        if self.clock.wall_s() > self.expires_at:
            raise SandboxError(f"the platform ended sandbox {self.id}: its lifetime passed")
        return await super().run(command, timeout_s=timeout_s, workdir=workdir)


@pytest.mark.parametrize("keeps", [True, False])
def test_sandbox_lifetime_covers_episode_and_grading_and_excludes_pauses(keeps: bool) -> None:
    now = [0.0]
    clock = PausableClock(lambda: now[0])
    made: list[ExpiringFake] = []
    d: Dispatcher

    class Hosted(Harness):
        async def acquire(self, episode: Episode) -> Sandbox:
            made.append(ExpiringFake(clock, keeps))
            return made[-1]

        async def run_agent(self, episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext) -> Any:
            now[0] += 45.0  # most of the 50 s episode deadline
            d.pause()  # a weight sync far longer than the whole lifetime
            now[0] += 1000.0
            d.resume()
            await sandbox.run("echo after the sync")
            now[0] += 4.0
            return await super().run_agent(episode, sandbox, llm, ctx)

        async def grade(self, episode: Episode, sandbox: Sandbox, trajectory: Any) -> GradeResult:
            now[0] += 18.0  # most of the 20 s grading deadline
            await sandbox.run("pytest")
            return GradeResult(1.0, True)

    h = Hosted()
    d = h.dispatcher(clock=clock, timeouts=Timeouts(episode_s=50.0, grade_s=20.0))
    assert d.config.timeouts.sandbox_lifetime_s == 70.0
    (result,) = asyncio.run(d.run([Episode("e")])).results
    if keeps:
        assert result.outcome is Outcome.RESOLVED, result.error
        assert made[0].promises[:2] == [70.0, 70.0]  # started, then its run slot
        assert made[0].promises[2] == pytest.approx(70.0 - 45.0)  # resumed: what is left, in active time
    else:  # a platform that ignores the promises ends the sandbox during the sync: the test can tell
        assert result.outcome is Outcome.SANDBOX_ERROR
