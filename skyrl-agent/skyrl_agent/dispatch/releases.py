"""The dispatcher's side of "released exactly once on every exit path": releases that finish, and are waited for.

The dispatcher hands each sandbox it owns to :class:`Releases` once: :meth:`Releases.release` when an attempt ends
(success, error, timeout, cancellation), :meth:`Releases.release_late` for a start that outlived its deadline and
may still return a sandbox. A release runs as a task of its own, shielded, so cancelling the attempt a second time
cannot abandon it half-way; :meth:`Releases.drain` waits for all of them, also those that begin meanwhile. A
``release`` call that raises is logged and counted, never raised: the reaper finds what it left by label.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from skyrl_agent.dispatch.trace import Trace
from skyrl_agent.sandbox.base import Sandbox

__all__ = ["ReleaseFn", "Releases"]

logger = logging.getLogger(__name__)

ReleaseFn = Callable[[Sandbox], Awaitable[None]]


class Releases:
    """Calls ``release`` once per sandbox handed to it, tracks the calls in flight and counts those that failed.

    Args:
        release: Stops or returns a sandbox (the dispatcher's ``release`` function).
    """

    def __init__(self, release: ReleaseFn) -> None:
        self._release_fn = release
        self.errors = 0  # release calls that raised
        self._pending: set[asyncio.Future[None]] = set()

    async def release(self, sandbox: Sandbox, trace: Trace) -> None:
        """Release ``sandbox`` now and wait for it (a ``release`` span of ``trace``); cancelled, the release runs on."""
        with trace.span("release", sandbox=sandbox.id):
            # Shielded: a second cancellation must not abandon the release half-way.
            await asyncio.shield(self._track(self._release_quietly(sandbox)))

    def release_late(self, create: asyncio.Future[Sandbox]) -> None:
        """Release the sandbox ``create`` produces (if any) once it ends; nobody else will own it."""
        if create.done() and (create.cancelled() or create.exception() is not None):
            return  # it failed: nothing to release

        async def release_when_done() -> None:
            await asyncio.wait({create})
            if not create.cancelled() and create.exception() is None:
                await self._release_quietly(create.result())

        self._track(release_when_done())

    async def drain(self) -> None:
        """Return once no release is in flight, waiting also for those that begin meanwhile (late starts)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def _track(self, release: Awaitable[None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(release)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _release_quietly(self, sandbox: Sandbox) -> None:
        try:
            await self._release_fn(sandbox)
        except Exception:
            self.errors += 1
            logger.exception("releasing sandbox %s failed; the reaper will find it by label", sandbox.id)
