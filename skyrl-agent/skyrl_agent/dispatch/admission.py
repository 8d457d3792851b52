"""Admission: how many episodes may run at once, following the engines' load, and how fast sandboxes start.

An :class:`AdmissionController` holds the number of episodes admitted to the dispatcher's run stage between
``AdmissionConfig.floor`` and the stage's configured limit (``StageLimits.run``, the ceiling). Every ``interval_s``
it reads the engines' load and adjusts the number, additive increase and multiplicative decrease as in TCP
congestion control::

    saturated  KV use >= kv_high_water, or more than waiting_high requests waiting   limit · decrease, rounded down
    headroom   otherwise, when no request waits and KV use or waiting is known       limit + increase
    steady     some requests wait (waiting_high at most), or nothing is known       unchanged

and keeps the result between the floor and the ceiling. An unknown value (None) never counts as saturated.

It starts at the ceiling and reads the load at once. Lowering the limit preempts nothing: running episodes finish,
and new ones start only once fewer than the limit run (:class:`AdjustableLimit`). Without a load source the limit
stays at the ceiling.

The controller also spaces sandbox creations with a token bucket (``starts_per_s``): every dispatcher given the same
controller draws from the one bucket, so with one controller per process the rate holds for the whole host.

Everything here is deterministic given the clock (``time_fn``) and the load source, so it is tested with fakes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

logger = logging.getLogger(__name__)

__all__ = [
    "AdjustableLimit",
    "AdmissionConfig",
    "AdmissionConfigError",
    "AdmissionController",
    "LoadReport",
    "LoadSource",
    "Pressure",
    "Slots",
    "TokenBucket",
    "next_limit",
    "pressure",
]


@dataclass(frozen=True)
class AdmissionConfig:
    """How the run-stage limit follows the engines' load, and how fast sandboxes may start.

    Raises:
        AdmissionConfigError: a field is out of range; the error names every such field.
    """

    enabled: bool = True  # follow the load when a load source is given (False: the run limit stays at the ceiling)
    floor: int = 1  # episodes admitted at least, however loaded the engines are
    interval_s: float = 5.0  # seconds between two adjustments (a few LLM calls, so a change shows in the load)
    increase: int = 1  # episodes added per interval while the engines have headroom
    decrease: float = 0.5  # the limit is multiplied by this when the engines are saturated
    kv_high_water: float = 0.9  # KV-cache use (0..1) at or above which the engines count as saturated
    waiting_high: int = 4  # more requests than this waiting for a batch slot: saturated
    starts_per_s: float | None = None  # sandbox creations per second at most, shared by every dispatcher (None: any)
    start_burst: int = 1  # creations allowed at once after an idle spell (the token bucket's size)

    def __post_init__(self) -> None:
        checks = {
            "floor": (self.floor >= 1, "must be at least 1"),
            "interval_s": (self.interval_s > 0, "must be positive"),
            "increase": (self.increase >= 1, "must be at least 1"),
            "decrease": (0 < self.decrease < 1, "must be in (0, 1)"),
            "kv_high_water": (0 < self.kv_high_water <= 1, "must be in (0, 1]"),
            "waiting_high": (self.waiting_high >= 0, "must be at least 0"),
            "starts_per_s": (self.starts_per_s is None or self.starts_per_s > 0, "must be positive or None"),
            "start_burst": (self.start_burst >= 1, "must be at least 1"),
        }
        problems = {name: f"{rule} (got {getattr(self, name)})" for name, (ok, rule) in checks.items() if not ok}
        if problems:
            raise AdmissionConfigError(problems)


class AdmissionConfigError(ValueError):
    """Fields of an :class:`AdmissionConfig` out of range, all of them at once.

    Attributes:
        problems: Each such field's name and what is wrong with it (e.g. ``{"floor": "must be at least 1 (got 0)"}``),
            so that a caller whose keys have other names (a run config's) can name its own.
    """

    def __init__(self, problems: dict[str, str]) -> None:
        super().__init__("invalid AdmissionConfig: " + "; ".join(f"{name} {what}" for name, what in problems.items()))
        self.problems = problems


class LoadReport(Protocol):
    """What the controller reads of the engines' load (``skyrl_train.inference.base.EngineLoad`` is one)."""

    @property
    def waiting(self) -> int | None:
        """Requests waiting for a slot in the engines' batches; None: not known."""
        ...

    @property
    def kv_cache_usage(self) -> float | None:
        """Fraction (0..1) of the KV cache in use; None: not known."""
        ...


LoadSource = Callable[[], LoadReport | None]
"""Reads the engines' load now. Called on the event loop, so it must not block; None: nothing known now."""

Pressure = Literal["saturated", "headroom", "steady", "unknown"]


def pressure(load: LoadReport | None, config: AdmissionConfig) -> Pressure:
    """How loaded the engines are, by the rules in the module docstring."""
    if load is None:
        return "unknown"
    kv, waiting = load.kv_cache_usage, load.waiting
    if (kv is not None and kv >= config.kv_high_water) or (waiting is not None and waiting > config.waiting_high):
        return "saturated"
    if kv is None and waiting is None:
        return "unknown"
    return "headroom" if not waiting else "steady"


def next_limit(limit: int, load: LoadReport | None, config: AdmissionConfig, ceiling: int) -> int:
    """The run limit after one interval under ``load``, between ``config.floor`` and ``ceiling`` (module docstring)."""
    state = pressure(load, config)
    if state == "saturated":
        limit = math.floor(limit * config.decrease)
    elif state == "headroom":
        limit += config.increase
    return max(min(config.floor, ceiling), min(limit, ceiling))


class Slots(Protocol):
    """What a dispatcher stage waits on: an ``asyncio.Semaphore`` or an :class:`AdjustableLimit`."""

    async def acquire(self) -> bool:
        """Take a slot, waiting for one."""
        ...

    def release(self) -> None:
        """Give a slot back."""
        ...


class AdjustableLimit:
    """A semaphore whose limit can change while it is held; waiters are served in arrival order.

    Raising the limit wakes waiters at once. Lowering it takes nothing away: holders keep their slots, and no waiter
    gets one until fewer than the new limit hold one, so once the excess has drained at most ``limit`` hold a slot.
    """

    def __init__(self, limit: int) -> None:
        _check_limit(limit)
        self._limit = limit
        self._held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()  # cancelled ones are skipped when reached

    @property
    def limit(self) -> int:
        """Slots allowed now."""
        return self._limit

    @property
    def held(self) -> int:
        """Slots held now (more than ``limit`` only while a lowered limit drains)."""
        return self._held

    async def acquire(self) -> bool:
        """Take a slot, waiting for one; returns True (as ``asyncio.Semaphore.acquire`` does)."""
        if self._held < self._limit and not self._waiters:
            self._held += 1
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted in the same turn as cancelled: pass it on
                self.release()
            raise
        return True

    def release(self) -> None:
        """Give a slot back (exactly once per :meth:`acquire` that returned)."""
        if self._held <= 0:
            raise ValueError("AdjustableLimit released more often than acquired")
        self._held -= 1
        self._wake()

    def set_limit(self, limit: int) -> None:
        """Allow ``limit`` slots from now on; waiters get the slots a raise frees at once."""
        _check_limit(limit)
        self._limit = limit
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._held < self._limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._held += 1  # counted at the grant, so a woken waiter cannot be overtaken
                waiter.set_result(None)


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise ValueError(f"a limit must be at least 0 (got {limit})")


class TokenBucket:
    """At most ``rate_per_s`` takes per second on average and ``burst`` at once; takes are served in call order.

    Over any span of ``w`` seconds at most ``burst + rate_per_s · w`` takes proceed.
    """

    def __init__(self, rate_per_s: float, burst: int = 1, time_fn: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self._time = time_fn
        self._tokens = float(burst)  # negative: takes already promised to waiters
        self._at = time_fn()

    def reserve(self) -> float:
        """Take a token; return the seconds to wait before using it (0.0: now). A reservation is never returned."""
        now = self._time()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate_per_s) - 1.0
        self._at = now
        return max(0.0, -self._tokens / self.rate_per_s)

    async def take(self) -> None:
        """Wait for a token (a cancelled wait keeps the rate: its token is spent)."""
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)


class AdmissionController:
    """The run-stage limit and the sandbox start rate of the dispatchers that share it (see the module docstring).

    Args:
        config: Floor, interval, AIMD steps, saturation thresholds and the start rate.
        load: Reads the engines' load; it must not block. None (or ``config.enabled`` False): the limit stays at the
            ceiling, and only the start rate applies.
        time_fn: Monotonic seconds (inject a fake clock in tests).
    """

    def __init__(
        self,
        config: AdmissionConfig | None = None,
        load: LoadSource | None = None,
        *,
        time_fn: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or AdmissionConfig()
        self._load = load if self.config.enabled else None
        self._time = time_fn
        self._limit: int | None = None  # None until the first adjustment: the ceiling
        self._next_at = -math.inf  # when the next adjustment is due
        rate = self.config.starts_per_s
        self.starts = TokenBucket(rate, self.config.start_burst, time_fn) if rate is not None else None

    @property
    def follows_load(self) -> bool:
        """Whether the limit follows a load source."""
        return self._load is not None

    def limit(self, ceiling: int) -> int:
        """Episodes admitted to the run stage now, for a stage configured with ``ceiling`` slots."""
        return ceiling if self._limit is None else min(self._limit, ceiling)

    def due_in_s(self) -> float:
        """Seconds until the next adjustment is due (0.0: now)."""
        return max(0.0, self._next_at - self._time())

    def poll(self, ceiling: int) -> int:
        """Adjust the limit when an adjustment is due (at most once per interval); return :meth:`limit`."""
        now = self._time()
        if self._load is not None and now >= self._next_at:
            self._next_at = now + self.config.interval_s
            self._limit = next_limit(self.limit(ceiling), self._read(), self.config, ceiling)
        return self.limit(ceiling)

    async def follow(self, ceiling: int, apply: Callable[[int], None]) -> None:
        """Call ``apply(limit)`` each time an adjustment is due, until cancelled; returns at once without a load."""
        while self._load is not None:
            await asyncio.sleep(self.due_in_s())
            apply(self.poll(ceiling))

    async def admit_start(self) -> None:
        """Wait until the start rate allows one more sandbox creation (at once without ``starts_per_s``)."""
        if self.starts is not None:
            await self.starts.take()

    def _read(self) -> LoadReport | None:
        assert self._load is not None  # poll() reads only with a source
        try:
            return self._load()
        except Exception:  # an engine that cannot say holds the limit where it is
            logger.exception("reading the engines' load failed; the run limit stays at %s", self._limit)
            return None
