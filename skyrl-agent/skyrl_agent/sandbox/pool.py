"""A warm pool: started sandboxes of one spec, ready so that ``acquire`` costs no container start.

The pool keeps ``size`` sandboxes started (ready plus being created). Creation is limited twice: by RATE with
``asyncio-throttle`` (the Docker daemon saturates near 4 starts/s) and by CONCURRENCY with a semaphore.
``release`` closes the sandbox (a used sandbox is never handed out again) and the refill replaces it.

Ownership: the pool owns every sandbox it created until ``acquire`` returns it to a caller. A sandbox handed to
an acquirer that is cancelled before it resumes goes back to the pool (it is unused), or is closed once the pool
is closed.

A creation failure is handed to the oldest waiting ``acquire`` (so callers see the ``SandboxError`` instead of
waiting forever) and the refill backs off exponentially: ``BASE_BACKOFF_S * 2**n`` seconds after ``n``
consecutive failures, capped at ``MAX_BACKOFF_S`` however long the streak. Should the refill task die anyway,
every waiting ``acquire``, and every later one that finds no ready sandbox, raises ``SandboxUnavailableError``
whose cause is what killed it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

from asyncio_throttle import Throttler  # type: ignore[attr-defined]

from skyrl_agent.sandbox.base import (
    Sandbox,
    SandboxBackend,
    SandboxClosedError,
    SandboxSpec,
    SandboxUnavailableError,
)

logger = logging.getLogger(__name__)

BASE_BACKOFF_S = 0.5  # the refill waits BASE_BACKOFF_S * 2**n s after n consecutive creation failures ...
MAX_BACKOFF_S = 30.0  # ... and never longer than this


def backoff_s(failures: int) -> float:
    """Seconds the refill waits after ``failures`` consecutive creation failures (0 after none)."""
    if failures <= 0:
        return 0.0
    # Cap the exponent before taking the power: 2.0**1024 does not fit in a float.
    doublings = min(failures, math.ceil(math.log2(MAX_BACKOFF_S / BASE_BACKOFF_S)))
    return min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2.0**doublings)


class WarmPool:
    """Keeps ``size`` started sandboxes of ``spec`` from ``backend``. Call :meth:`start`, then :meth:`close`.

    Args:
        backend: creates the sandboxes; the pool owns what it created until ``acquire`` hands it out.
        spec: what every pooled sandbox starts from.
        size: sandboxes kept ready.
        rate_per_s: creations started per second at most.
        max_concurrent: creations in flight at once.
        sleep: waits out the refill's backoff (inject a fake one in tests).
    """

    def __init__(
        self,
        backend: SandboxBackend,
        spec: SandboxSpec,
        *,
        size: int = 2,
        rate_per_s: float = 4.0,
        max_concurrent: int = 2,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.size = size
        self._throttle = Throttler(rate_limit=max(1, round(rate_per_s)), period=max(1, round(rate_per_s)) / rate_per_s)
        self._slots = asyncio.Semaphore(max_concurrent)
        self._sleep = sleep
        self._ready: collections.deque[Sandbox] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[Sandbox]] = collections.deque()
        self._creating = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._refill: asyncio.Task[None] | None = None
        self._closed = False
        self._failures = 0

    @property
    def ready(self) -> int:
        """Sandboxes ready for ``acquire`` now."""
        return len(self._ready)

    def start(self) -> None:
        """Start refilling in the background (needs a running event loop)."""
        if self._refill is None:
            self._refill = asyncio.create_task(self._refill_loop())
            self._refill.add_done_callback(self._refill_ended)

    async def acquire(self) -> Sandbox:
        """A ready sandbox, now if one is ready, else when the next creation finishes. The caller owns it.

        Raises:
            SandboxClosedError: the pool is closed. SandboxUnavailableError: the refill task died, so no
            sandbox will come. SandboxError: the creation meant for this caller failed.
        """
        if self._closed:
            raise SandboxClosedError("acquire() on a closed WarmPool")
        self.start()
        self._wake.set()  # a taken sandbox leaves a gap to refill
        if self._ready:
            return self._ready.popleft()
        if (broken := self._refill_error()) is not None:
            raise broken
        waiter: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            self._reclaim(waiter)
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    async def release(self, sandbox: Sandbox) -> None:
        """Close ``sandbox`` (used sandboxes are never reused); the refill replaces it."""
        await sandbox.close()
        self._wake.set()

    async def close(self) -> None:
        """Stop refilling, fail waiters, wait for creations in flight and close every pooled sandbox."""
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)  # a dead refill must not stop the close
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(SandboxClosedError("the WarmPool closed while waiting"))
        ready, self._ready = list(self._ready), collections.deque()
        await asyncio.gather(*(s.close() for s in ready), return_exceptions=True)

    async def _refill_loop(self) -> None:
        while not self._closed:
            missing = self.size + len(self._waiters) - len(self._ready) - self._creating
            for _ in range(max(0, missing)):
                self._creating += 1
                self._track(self._create_one())
            self._wake.clear()
            await self._wake.wait()
            if self._failures:
                await self._sleep(backoff_s(self._failures))

    def _track(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _create_one(self) -> None:
        try:
            async with self._slots, self._throttle:
                sandbox = await self.backend.create(self.spec)
        except Exception as exc:
            self._failures += 1
            self._deliver_error(exc)
        else:
            self._failures = 0
            await self._deliver(sandbox)
        finally:
            self._creating -= 1
            self._wake.set()

    async def _deliver(self, sandbox: Sandbox) -> None:
        if self._closed:
            await sandbox.close()
            return
        self._hand_out(sandbox)

    def _hand_out(self, sandbox: Sandbox) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(sandbox)
                return
        self._ready.append(sandbox)

    def _reclaim(self, waiter: asyncio.Future[Sandbox]) -> None:
        """Take back a sandbox that reached ``waiter`` in the loop turn its acquirer was cancelled in."""
        if not waiter.done() or waiter.cancelled() or waiter.exception() is not None:
            return  # nothing arrived; a creation still under way goes to the next waiter or the ready list
        sandbox = waiter.result()
        if self._closed:
            self._track(sandbox.close())
        else:
            self._hand_out(sandbox)  # unused: as good as a fresh one

    def _deliver_error(self, exc: Exception) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)
                return

    def _refill_error(self) -> SandboxUnavailableError | None:
        """Why the refill task died, or None while it runs (or after :meth:`close` stopped it)."""
        refill = self._refill
        if refill is None or not refill.done() or refill.cancelled():
            return None
        cause = refill.exception()
        if cause is None:
            return None
        error = SandboxUnavailableError(
            f"the WarmPool refill stopped ({cause!r}), so no sandbox will come; close this pool and start a new one"
        )
        error.__cause__ = cause
        return error

    def _refill_ended(self, refill: asyncio.Task[None]) -> None:
        if (error := self._refill_error()) is None:
            return
        logger.error("%s; %d waiting acquire() calls fail", error, len(self._waiters))
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(self._refill_error() or error)  # one exception object per caller
