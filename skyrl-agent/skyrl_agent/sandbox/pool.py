"""A warm pool: started sandboxes of one spec, ready so that ``acquire`` costs no container start.

The pool keeps ``size`` sandboxes started (ready plus being created). Creation is limited twice: by RATE with
``asyncio-throttle`` (the Docker daemon saturates near 4 starts/s) and by CONCURRENCY with a semaphore.
``release`` closes the sandbox (a used sandbox is never handed out again) and the refill replaces it.

A creation failure is handed to the oldest waiting ``acquire`` (so callers see ``SandboxUnavailableError``
instead of waiting forever) and the refill backs off exponentially (up to ``MAX_BACKOFF_S``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

from asyncio_throttle import Throttler  # type: ignore[attr-defined]

from skyrl_agent.sandbox.base import Sandbox, SandboxBackend, SandboxClosedError, SandboxSpec

MAX_BACKOFF_S = 30.0


class WarmPool:
    """Keeps ``size`` started sandboxes of ``spec`` from ``backend``. Call :meth:`start`, then :meth:`close`.

    Args:
        backend: creates the sandboxes; the pool owns what it created until ``acquire`` hands it out.
        spec: what every pooled sandbox starts from.
        size: sandboxes kept ready.
        rate_per_s: creations started per second at most.
        max_concurrent: creations in flight at once.
    """

    def __init__(
        self,
        backend: SandboxBackend,
        spec: SandboxSpec,
        *,
        size: int = 2,
        rate_per_s: float = 4.0,
        max_concurrent: int = 2,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.size = size
        self._throttle = Throttler(rate_limit=max(1, round(rate_per_s)), period=max(1, round(rate_per_s)) / rate_per_s)
        self._slots = asyncio.Semaphore(max_concurrent)
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

    async def acquire(self) -> Sandbox:
        """A ready sandbox, now if one is ready, else when the next creation finishes. The caller owns it.

        Raises:
            SandboxClosedError: the pool is closed. SandboxError: the creation meant for this caller failed.
        """
        if self._closed:
            raise SandboxClosedError("acquire() on a closed WarmPool")
        self.start()
        self._wake.set()  # a taken sandbox leaves a gap to refill
        if self._ready:
            return self._ready.popleft()
        waiter: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
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
            with contextlib.suppress(asyncio.CancelledError):
                await self._refill
        if self._tasks:
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
                task = asyncio.create_task(self._create_one())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            self._wake.clear()
            await self._wake.wait()
            if self._failures:
                await asyncio.sleep(min(MAX_BACKOFF_S, 0.5 * 2**self._failures))

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
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(sandbox)
                return
        self._ready.append(sandbox)

    def _deliver_error(self, exc: Exception) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)
                return
