"""Retries for infrastructure failures: exponential backoff with jitter, and a circuit breaker.

Only infrastructure errors (:func:`is_infra_error`: sandbox start, daemon and connection errors) are retried;
the model's own mistakes never are. The circuit breaker stops a retry storm when the infrastructure is down:
after ``threshold`` consecutive infrastructure failures every attempt fails fast with :class:`CircuitOpenError`
for ``cooldown_s`` seconds, then one probe is let through.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from skyrl_agent.sandbox.base import SandboxClosedError, SandboxError, SandboxUnavailableError

T = TypeVar("T")

__all__ = ["Backoff", "CircuitBreaker", "CircuitOpenError", "is_infra_error", "retry_infra"]


class CircuitOpenError(SandboxUnavailableError):
    """Too many consecutive infrastructure failures; attempts fail fast until the cooldown ends."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: try ``n`` (1-based) waits ``min(max_s, base_s * factor**(n-1))``.

    The wait is then scaled by a uniform factor in ``[1 - jitter, 1]`` so that failed attempts of many
    episodes do not retry in lockstep.
    """

    base_s: float = 0.5  # wait after the first failure
    factor: float = 2.0  # growth per further failure
    max_s: float = 30.0  # no wait is longer
    jitter: float = 0.5  # fraction of the wait that is randomised (0 = none, 1 = full jitter)
    max_attempts: int = 3  # tries in all, the first included

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed try ``attempt`` (1-based)."""
        raw = min(self.max_s, self.base_s * self.factor ** (attempt - 1))
        return raw * (1.0 - self.jitter * rng.random())


class CircuitBreaker:
    """Counts consecutive infrastructure failures and opens after ``threshold`` of them.

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
        self.trips = 0  # how often it opened (a metric)

    @property
    def is_open(self) -> bool:
        """True while attempts fail fast."""
        return self._opened_at is not None and self._time() - self._opened_at < self.cooldown_s

    def check(self) -> None:
        """Raise :class:`CircuitOpenError` while open; after the cooldown let one probe through."""
        if self.is_open:
            raise CircuitOpenError(
                f"{self.failures} consecutive infrastructure failures; not retrying for {self.cooldown_s} s. "
                "Check the sandbox backend (is the Docker daemon up?)."
            )
        if self._opened_at is not None:
            # Half-open: one more failure reopens the circuit at once.
            self._opened_at = None
            self.failures = self.threshold - 1

    def record_success(self) -> None:
        """An attempt succeeded: close the circuit."""
        self.failures = 0
        self._opened_at = None

    def record_failure(self) -> None:
        """An infrastructure failure happened."""
        self.failures += 1
        if self.failures >= self.threshold and self._opened_at is None:
            self._opened_at = self._time()
            self.trips += 1


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
) -> T:
    """Call ``attempt_fn`` up to ``backoff.max_attempts`` times, retrying infrastructure errors only.

    Other exceptions propagate at once. ``on_retry(attempt, error, delay_s)`` is called before each wait.
    """
    for attempt in range(1, backoff.max_attempts + 1):
        breaker.check()
        try:
            result = await attempt_fn()
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
        else:
            breaker.record_success()
            return result
    raise AssertionError("unreachable: the loop returns or raises")
