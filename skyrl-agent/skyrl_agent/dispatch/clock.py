"""Pausable time and deadlines: the episode's own time, excluding time spent paused.

The trainer pauses generation while it syncs weights. A deadline measured in wall time would punish episodes
for that pause, so every deadline here reads a :class:`PausableClock` whose ``active_s()`` stands still while
paused. All times are in seconds.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["Deadline", "DeadlineExceeded", "PausableClock", "within"]


class DeadlineExceeded(TimeoutError):
    """A deadline passed. ``kind`` names it: ``"episode"``, ``"llm"``, ``"tool"``, ``"sandbox_start"``, ``"grade"``."""

    def __init__(self, kind: str, budget_s: float | None) -> None:
        super().__init__(f"the {kind} deadline of {budget_s} s (active time, pauses excluded) passed")
        self.kind = kind
        self.budget_s = budget_s


class PausableClock:
    """Monotonic seconds that stand still between :meth:`pause` and :meth:`resume`.

    Args:
        time_fn: The underlying monotonic clock in seconds (inject a fake one in tests).
    """

    def __init__(self, time_fn: Callable[[], float] = time.monotonic) -> None:
        self._time = time_fn
        self._paused_total = 0.0
        self._paused_at: float | None = None
        self._running: asyncio.Event | None = None

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._paused_at is not None

    @property
    def paused_total_s(self) -> float:
        """Seconds spent paused so far, the current pause included."""
        current = 0.0 if self._paused_at is None else self._time() - self._paused_at
        return self._paused_total + current

    def wall_s(self) -> float:
        """The underlying monotonic seconds, pauses included (what traces and queue times are measured in)."""
        return self._time()

    def active_s(self) -> float:
        """Seconds since an arbitrary origin, not counting time spent paused."""
        return self._time() - self.paused_total_s

    def pause(self) -> None:
        """Stop the clock; idempotent."""
        if self._paused_at is None:
            self._paused_at = self._time()
            self._event().clear()

    def resume(self) -> None:
        """Restart the clock; idempotent."""
        if self._paused_at is not None:
            self._paused_total += self._time() - self._paused_at
            self._paused_at = None
            self._event().set()

    async def wait_running(self) -> None:
        """Return at once when running; otherwise wait for :meth:`resume`."""
        if self.paused:
            await self._event().wait()

    def _event(self) -> asyncio.Event:
        # Created lazily so that a clock can be built outside a running loop.
        if self._running is None:
            self._running = asyncio.Event()
            if not self.paused:
                self._running.set()
        return self._running


class Deadline:
    """A budget of active seconds on a clock, started at construction. ``budget_s=None`` never expires."""

    def __init__(self, clock: PausableClock, budget_s: float | None, kind: str = "episode") -> None:
        self.clock = clock
        self.budget_s = budget_s
        self.kind = kind
        self._start = clock.active_s()

    def elapsed_s(self) -> float:
        """Active seconds since the deadline started."""
        return self.clock.active_s() - self._start

    def remaining_s(self) -> float:
        """Active seconds left (``math.inf`` without a budget); negative once passed."""
        if self.budget_s is None:
            return math.inf
        return self.budget_s - self.elapsed_s()

    def expired(self) -> bool:
        """True once the budget is spent."""
        return self.remaining_s() <= 0


async def within(awaitable: Awaitable[T], *deadlines: Deadline, discard: Callable[[T], object] | None = None) -> T:
    """Await ``awaitable`` until the nearest of ``deadlines`` passes, then cancel it.

    Pauses do not count: while the clock is paused the remaining time stays put and the wait is renewed.
    Cancelling an awaitable that runs in a thread does not stop the thread.

    Ownership: a result that is produced but never returned, because this call was cancelled in the same loop
    turn as the awaitable finished, or because the awaitable finished despite being cancelled at a deadline,
    is passed to ``discard`` (e.g. a function that closes a sandbox); without ``discard`` it is dropped.

    Raises:
        DeadlineExceeded: The nearest deadline passed first; its ``kind`` says which one.
    """
    task = asyncio.ensure_future(awaitable)
    returned = False
    try:
        while True:
            nearest = min(deadlines, key=lambda d: d.remaining_s()) if deadlines else None
            remaining = math.inf if nearest is None else nearest.remaining_s()
            if nearest is not None and remaining <= 0:
                raise DeadlineExceeded(nearest.kind, nearest.budget_s)
            done, _ = await asyncio.wait({task}, timeout=None if math.isinf(remaining) else remaining)
            if done:
                result = task.result()
                returned = True
                return result
    finally:
        if not returned:
            await _abandon(task, discard)


async def _abandon(task: asyncio.Future[T], discard: Callable[[T], object] | None) -> None:
    """Cancel ``task``, wait for it, and hand a result it still produced to ``discard``."""

    def hand_over(done: asyncio.Future[T]) -> None:
        if done.cancelled() or done.exception() is not None:  # exception() also marks it retrieved
            return
        if discard is not None:
            discard(done.result())

    try:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    finally:
        if task.done():
            hand_over(task)
        else:  # a second cancellation interrupted the wait: hand over whenever it ends
            task.add_done_callback(hand_over)
