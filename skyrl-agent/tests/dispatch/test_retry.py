"""The circuit breaker: open after a failure streak, then exactly one probe while half-open."""

from __future__ import annotations

import asyncio

import pytest

from skyrl_agent.dispatch import CircuitBreaker, CircuitOpenError


def tripped(now: list[float], cooldown_s: float = 10.0) -> CircuitBreaker:
    breaker = CircuitBreaker(threshold=2, cooldown_s=cooldown_s, time_fn=lambda: now[0])
    breaker.record_failure()
    breaker.record_failure()
    return breaker


def test_half_open_admits_exactly_one_probe() -> None:
    now = [0.0]
    breaker = tripped(now)
    assert breaker.state == "open"
    now[0] = 11.0
    assert breaker.state == "half_open"
    breaker.check()  # the probe
    for _ in range(3):
        with pytest.raises(CircuitOpenError, match="probe"):
            breaker.check()
    breaker.record_success()
    assert breaker.state == "closed"
    breaker.check()
    breaker.check()


def test_failed_probe_reopens_the_circuit() -> None:
    now = [0.0]
    breaker = tripped(now)
    now[0] = 11.0
    breaker.check()
    breaker.record_failure()
    assert breaker.is_open
    assert breaker.trips == 2
    with pytest.raises(CircuitOpenError):
        breaker.check()
    now[0] = 22.0
    breaker.check()  # the next cooldown is over: one new probe


def test_probe_is_one_task_whose_own_checks_pass() -> None:
    now = [0.0]
    breaker = tripped(now)
    now[0] = 11.0
    gate = asyncio.Event()
    admitted: list[str] = []

    async def attempt(name: str) -> None:
        breaker.check()
        admitted.append(name)
        await gate.wait()
        breaker.check()  # the probe checks again (e.g. after waiting for a start slot)
        admitted.append(f"{name} again")

    async def main() -> list[BaseException | None]:
        tasks = [asyncio.create_task(attempt(f"t{i}")) for i in range(5)]
        await asyncio.sleep(0)  # every task has reached its first check
        gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(main())
    assert admitted == ["t0", "t0 again"]
    assert results[0] is None
    assert all(isinstance(r, CircuitOpenError) for r in results[1:])


def test_probe_without_a_verdict_is_written_off() -> None:
    now = [0.0]
    breaker = tripped(now)
    now[0] = 11.0

    async def probe_then_give_up() -> None:
        breaker.check()  # admitted, then ends without recording success or failure

    async def main() -> None:
        await asyncio.create_task(probe_then_give_up())
        breaker.check()  # the probe's task ended: the next caller probes

    asyncio.run(main())
    breaker.record_failure()
    now[0] = 22.0
    breaker.check()  # a probe with no task (called outside a loop) ...
    with pytest.raises(CircuitOpenError):
        breaker.check()
    now[0] = 32.5
    breaker.check()  # ... is written off after another cooldown
