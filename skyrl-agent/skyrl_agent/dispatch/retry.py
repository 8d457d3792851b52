"""Retries for infrastructure failures: exponential backoff with jitter, and a circuit breaker.

Only infrastructure errors (:func:`is_infra_error`: sandbox start, daemon and connection errors) are retried;
the model's own mistakes never are. The circuit breaker stops a retry storm when the infrastructure is down:
after ``threshold`` consecutive infrastructure failures every attempt fails fast with :class:`CircuitOpenError`
for ``cooldown_s`` seconds, then exactly one probe is let through::

    closed ──threshold consecutive failures──► open ──cooldown_s──► half-open ──probe succeeds──► closed
                                                ▲                       │
                                                └────probe fails────────┘   (every other caller fails fast)

Failing fast protects the daemon, but a queue of episodes that all fail at once during a 2 s daemon restart turns
a whole batch into masked errors. :meth:`CircuitBreaker.admit` therefore lets a caller *wait* for the circuit
while the outage is young: until ``wait_s`` seconds after the circuit first opened (one budget per outage, not
per caller, so a dead daemon fails the queue fast once the budget is spent), then it fails fast as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from skyrl_agent.backoff import Backoff
from skyrl_agent.sandbox.base import SandboxClosedError, SandboxError, SandboxUnavailableError

T = TypeVar("T")

__all__ = ["Backoff", "CircuitBreaker", "CircuitOpenError", "is_infra_error", "retry_infra"]


class CircuitOpenError(SandboxUnavailableError):
    """Too many consecutive infrastructure failures; attempts fail fast until the cooldown ends."""


class CircuitBreaker:
    """Counts consecutive infrastructure failures and opens after ``threshold`` of them.

    Half-open (the cooldown is over, no verdict yet), exactly one caller passes :meth:`check`: the probe. The
    probe is the asyncio task that was admitted, so its own further checks pass (the dispatcher checks before
    and after waiting for a start slot). Its :meth:`record_success` closes the circuit and its
    :meth:`record_failure` reopens it for another ``cooldown_s``. A probe that ends without a verdict (its task
    finished, e.g. cancelled) or is still out after another ``cooldown_s`` is written off, and the next caller
    becomes the probe.

    Args:
        threshold: Consecutive failures that open the circuit.
        cooldown_s: Seconds the circuit stays open before one probe is let through.
        time_fn: Monotonic clock in seconds (wall time: an outage does not pause).
    """

    def __init__(self, threshold: int = 10, cooldown_s: float = 30.0, time_fn: Callable[[], float] = time.monotonic):
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._time = time_fn
        self.failures = 0
        self._opened_at: float | None = None
        self._probe: tuple[asyncio.Task[Any] | None, float] | None = None  # (its task, when it was admitted)
        self._outage_since: float | None = None  # when the circuit first opened since it was last closed
        self._verdict: asyncio.Event | None = None  # set (and replaced) on every success or failure
        self.trips = 0  # how often it opened (a metric)

    @property
    def is_open(self) -> bool:
        """True during the cooldown, while every attempt fails fast."""
        return self._opened_at is not None and self._time() - self._opened_at < self.cooldown_s

    @property
    def state(self) -> Literal["closed", "open", "half_open"]:
        """``closed`` (attempts pass), ``open`` (the cooldown runs) or ``half_open`` (one probe may pass)."""
        if self._opened_at is None:
            return "closed"
        return "open" if self.is_open else "half_open"

    def check(self) -> None:
        """Return if the caller may attempt; raise :class:`CircuitOpenError` if it must fail fast.

        Closed: every caller passes. Open: none does. Half-open: the first caller becomes the probe and passes,
        as do its own later checks; every other caller fails fast until the probe's verdict.
        """
        state = self.state
        if state == "closed":
            return
        if state == "open":
            raise CircuitOpenError(
                f"{self.failures} consecutive infrastructure failures; not retrying for {self.cooldown_s} s. "
                "Check the sandbox backend (is the Docker daemon up?)."
            )
        caller, now = _current_task(), self._time()
        if self._probe is not None:
            owner, since = self._probe
            if owner is not None and owner is caller:
                return
            if (owner is None or not owner.done()) and now - since < self.cooldown_s:
                raise CircuitOpenError(
                    f"after {self.failures} consecutive infrastructure failures one probe is testing the sandbox "
                    "backend; failing fast until it succeeds."
                )
        self._probe = (caller, now)

    @property
    def outage_s(self) -> float:
        """Seconds since the circuit first opened, through any failed probes; 0 while closed."""
        return 0.0 if self._outage_since is None else self._time() - self._outage_since

    async def admit(self, wait_s: float) -> None:
        """Like :meth:`check`, but wait for the circuit while the outage is younger than ``wait_s`` seconds.

        Wakes on every verdict and at the end of each cooldown (and of a probe's allowance), so a waiter that is
        admitted becomes the probe or finds the circuit closed.

        Raises:
            CircuitOpenError: The circuit is open and the outage is ``wait_s`` seconds old or more.
        """
        while True:
            try:
                self.check()
                return
            except CircuitOpenError:
                budget_s = wait_s - self.outage_s
                if budget_s <= 0:
                    raise
            verdict = self._verdict_event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(verdict.wait(), timeout=min(budget_s, self._next_change_s()))

    def _next_change_s(self) -> float:
        """Seconds until the state may change without a verdict: the cooldown's end, or a probe's write-off."""
        now = self._time()
        since = self._probe[1] if self._probe is not None else (self._opened_at or now)
        return max(since + self.cooldown_s - now, 0.001)

    def _verdict_event(self) -> asyncio.Event:
        if self._verdict is None:
            self._verdict = asyncio.Event()
        return self._verdict

    def _announce(self) -> None:
        if self._verdict is not None:
            self._verdict.set()
            self._verdict = None

    def record_success(self) -> None:
        """An attempt succeeded: close the circuit."""
        self.failures = 0
        self._opened_at = None
        self._outage_since = None
        self._probe = None
        self._announce()

    def record_failure(self) -> None:
        """An infrastructure failure happened; while a probe is out it reopens the circuit at once."""
        self.failures += 1
        if self._probe is not None or (self._opened_at is None and self.failures >= self.threshold):
            self._opened_at = self._time()
            if self._outage_since is None:
                self._outage_since = self._opened_at
            self._probe = None
            self.trips += 1
        self._announce()


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running event loop
        return None


def is_infra_error(exc: BaseException) -> bool:
    """True for failures of the infrastructure that a retry may fix (never for a tripped breaker)."""
    if isinstance(exc, CircuitOpenError | SandboxClosedError):
        return False
    return isinstance(exc, SandboxError | ConnectionError)


async def retry_infra(
    attempt_fn: Callable[[], Awaitable[T]],
    backoff: Backoff,
    breaker: CircuitBreaker,
    rng: random.Random,
    *,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    admit: Callable[[], Awaitable[None]] | None = None,
) -> T:
    """Call ``attempt_fn`` up to ``backoff.max_attempts`` times, retrying infrastructure errors only.

    Other exceptions propagate at once. ``on_retry(attempt, error, delay_s)`` is called before each wait.
    ``admit()`` is awaited before each try (default: ``breaker.check``, failing fast while the circuit is open).
    A try that raises :class:`CircuitOpenError` itself (the circuit opened while it waited for a slot) is not
    counted: it is admitted again, and ``admit`` decides whether to wait or fail.
    """
    attempt = 1
    while attempt <= backoff.max_attempts:
        if admit is None:
            breaker.check()
        else:
            await admit()
        try:
            result = await attempt_fn()
        except CircuitOpenError:
            if admit is None:
                raise
            continue
        except Exception as exc:
            if not is_infra_error(exc):
                raise
            breaker.record_failure()
            if attempt >= backoff.max_attempts:
                raise
            delay = backoff.delay_s(attempt, rng)
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            await sleep(delay)
            attempt += 1
        else:
            breaker.record_success()
            return result
    raise AssertionError("unreachable: the loop returns or raises")
