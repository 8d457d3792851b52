"""One job from start to end: take a process from the pool, exchange the job with it, give the process back.

:func:`run_job` blocks the calling thread; :func:`arun_job` waits on the event loop, never on a thread, for a
pooled process. Either way a pooled process that turns out dead is replaced by one fresh attempt, and when no
pooled process becomes idle within ``wait_s`` seconds the job starts a process of its own (see
:class:`~skyrl_gym.sandbox.pool.WorkerPool`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from skyrl_gym.sandbox.errors import SandboxStartError
from skyrl_gym.sandbox.exchange import Exchange, adrive, drive
from skyrl_gym.sandbox.limits import SandboxLimits
from skyrl_gym.sandbox.pool import WorkerPool
from skyrl_gym.sandbox.worker import Run

__all__ = ["arun_job", "run_job"]

logger = logging.getLogger(__name__)


def run_job(
    pool: WorkerPool, code: str | bytes, stdin: str | bytes, limits: SandboxLimits, *, batch: bool, wait_s: float
) -> Exchange:
    """Run one job to its end on a pooled process (or a fresh one, if none waits or the pooled one was dead).

    Args:
        pool: Where the process comes from and goes back to.
        code: The snippet's source, or a batch's job body (``batch``).
        stdin: The job's whole standard input.
        limits: The job's limits.
        batch: Whether ``code`` is a batch (see :class:`~skyrl_gym.sandbox.batch.Batch`).
        wait_s: How long to wait for a busy fork server to become idle before starting a process.

    Raises:
        SandboxStartError: No process could be started for the job.
        ExecutorClosedError: The pool is closed.
    """
    run = pool.take_pooled(wait_s=wait_s)
    if run is not None:
        try:
            return _exchange_on(pool, run, code, stdin, limits, batch)
        except SandboxStartError:
            # A pooled interpreter died while it waited (e.g. killed from outside): one fresh attempt.
            logger.warning("a pooled sandbox interpreter was dead; starting a fresh one", exc_info=True)
    return _exchange_on(pool, pool.start_worker(), code, stdin, limits, batch)


async def arun_job(
    pool: WorkerPool, code: str | bytes, stdin: str | bytes, limits: SandboxLimits, *, batch: bool, wait_s: float
) -> Exchange:
    """The asyncio version of :func:`run_job`; cancellation kills the job and reaps its process first."""
    run = pool.take_pooled()
    if run is None:
        run = await _take_when_idle(pool, wait_s)
    if run is not None:
        try:
            return await _aexchange_on(pool, run, code, stdin, limits, batch)
        except SandboxStartError:
            logger.warning("a pooled sandbox interpreter was dead; starting a fresh one", exc_info=True)
    started = await _in_thread(pool, pool.start_worker)
    assert started is not None
    return await _aexchange_on(pool, started, code, stdin, limits, batch)


def _exchange_on(
    pool: WorkerPool, run: Run, code: str | bytes, stdin: str | bytes, limits: SandboxLimits, batch: bool
) -> Exchange:
    exchange = Exchange(run, code, stdin, limits, batch=batch)
    try:
        drive(exchange)
    finally:
        pool.retire(run)
    exchange.result()  # raises SandboxStartError if the process never took the job
    return exchange


async def _aexchange_on(
    pool: WorkerPool, run: Run, code: str | bytes, stdin: str | bytes, limits: SandboxLimits, batch: bool
) -> Exchange:
    exchange = Exchange(run, code, stdin, limits, batch=batch)
    try:
        await adrive(exchange)
    finally:
        pool.retire(run)
    exchange.result()
    return exchange


async def _take_when_idle(pool: WorkerPool, wait_s: float) -> Run | None:
    """A run on a pooled fork server that becomes idle within ``wait_s``, or None; awaits on the event loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while (remaining := deadline - loop.time()) > 0 and pool.busy_or_starting():
        woken = pool.when_idle(loop)
        try:
            await asyncio.wait({woken}, timeout=remaining)
            run = pool.take_pooled()
        finally:
            # Forget this waiter, or hand its wake-up on if it used none (timed out, cancelled, or another
            # caller took the process first).
            pool.stop_waiting(woken)
        if run is not None:
            return run
    return None


async def _in_thread(pool: WorkerPool, take: Callable[[], Run | None]) -> Run | None:
    # Waiting for a pooled process or starting one blocks: do it on a thread. If the caller is cancelled
    # meanwhile, the thread still gets its run; discard it instead of leaking the process.
    future = asyncio.get_running_loop().run_in_executor(None, take)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(lambda done: _discard_started_run(pool, done))
        raise


def _discard_started_run(pool: WorkerPool, future: asyncio.Future[Run | None]) -> None:
    run = future.result() if not future.cancelled() and future.exception() is None else None
    if run is not None:
        run.stop(kill=True)
        run.reap()
        pool.retire(run)
