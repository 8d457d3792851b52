"""A warm pool of started sandboxed processes, refilled and cleaned up by one background thread.

Two kinds of pool, chosen by ``WorkerConfig.fork_server``:

- one interpreter per run: ``size`` :class:`~skyrl_gym.sandbox.worker.Worker` s wait; each serves one run and is
  replaced in the background;
- fork servers: ``size`` :class:`~skyrl_gym.sandbox.forkserver.ForkServer` s, idle or busy; each serves one job at a
  time and goes back to the pool after a job that left it clean, or is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import threading
import time
from typing import Final

from skyrl_gym.sandbox.errors import ExecutorClosedError, SandboxError
from skyrl_gym.sandbox.forkserver import ForkedJob, ForkServer
from skyrl_gym.sandbox.worker import Run, Worker, WorkerConfig

__all__ = ["WorkerPool"]

logger = logging.getLogger(__name__)

# After a failed start the thread waits this long before trying again (callers then start processes themselves
# and see the error directly).
_RETRY_AFTER_S: Final = 1.0

_Slot = Worker | ForkServer  # what waits in the pool
_Leftover = Worker | ForkServer | ForkedJob  # what the thread cleans up


class WorkerPool:
    """Keeps ``size`` sandboxed processes started; hands out runs on them and takes the runs back.

    Ownership: the pool owns its idle processes and one daemon thread, started by the constructor. A run returned
    by :meth:`take_pooled` or :meth:`start_worker` belongs to the caller until it is passed back to :meth:`retire`;
    what it leaves is cleaned up on the pool's thread. :meth:`close` kills the idle processes and stops the thread;
    it is idempotent.
    """

    def __init__(self, config: WorkerConfig, size: int) -> None:
        if size < 0:
            raise ValueError(f"pool size must be >= 0, got {size}")
        self.config = config
        self.size = size
        self._ready: list[_Slot] = []
        self._busy = 0  # the pool's own fork servers, handed out with a job
        self._starting = 0  # processes the thread is starting for the pool
        self._retiring: list[_Leftover] = []
        lock = threading.Lock()
        # Two conditions on one lock, so that a run going back to the pool wakes only whoever waits for it: the
        # thread waits for work (leftovers to clean up, a process to start), callers for an idle fork server.
        self._work = threading.Condition(lock)
        self._idle = threading.Condition(lock)
        self._idle_futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []  # asyncio waiters
        self._closed = False
        self._pid = os.getpid()
        # The thread sleeps in poll(2) on this pipe and on the pidfds of the pool's fork servers, so that a server
        # that dies while idle (it exits when it cannot restore its sandbox after a job) is replaced at once.
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._servers: list[ForkServer] = []  # the pool's own live fork servers, idle or busy
        self._thread = threading.Thread(target=self._maintain, name="skyrl-sandbox-pool", daemon=True)
        self._thread.start()

    def take_pooled(self, wait_s: float = 0.0) -> Run | None:
        """A run on a pooled process, or None when none is idle (never starts a process).

        Args:
            wait_s: Fork servers only: how long to wait for a busy (or starting) server to become idle, in
                seconds. A server is busy for one job, usually milliseconds, while starting a fresh one costs tens
                of milliseconds of CPU.
        """
        deadline = time.monotonic() + wait_s
        with self._idle:
            self._check_open()
            while (slot := self._pick()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.config.fork_server or not self._busy + self._starting:
                    return None
                self._idle.wait(remaining)
                self._check_open()
        return self._open(slot)

    def _pick(self) -> _Slot | None:
        """Take an idle process out of the pool (call with the lock held), or None.

        Workers: the oldest first. Fork servers: the most recently used one that is ready (its memory is warm),
        else the most recently used one (it is still restoring its sandbox after its last job, which takes well
        under a millisecond: its job starts then). A server that exited meanwhile goes to the thread for disposal.
        """
        if not self.config.fork_server:
            if not self._ready:
                return None
            self._wake_thread()  # a worker serves one run: start its replacement
            return self._ready.pop(0)
        chosen = None
        for index in range(len(self._ready) - 1, -1, -1):
            server = self._ready[index]
            assert isinstance(server, ForkServer)
            server.refresh()
            if not server.reusable:
                self._retiring.append(self._ready.pop(index))
                self._wake_thread()
            elif server.ready:
                chosen = self._ready.pop(index)
                break
        if chosen is None and self._ready:
            chosen = self._ready.pop()
        if chosen is not None:
            self._busy += 1
        return chosen

    def busy_or_starting(self) -> bool:
        """Fork servers only: whether one of the pool's servers is busy or being started (so may become idle)."""
        with self._work:
            return self.config.fork_server and not self._closed and self._busy + self._starting > 0

    def when_idle(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future of ``loop`` (call on its thread) that completes when a pooled process may be idle for it.

        Waiters are woken one per idle process, first come first served; a woken waiter must try
        :meth:`take_pooled` (another caller may be faster) and, if it stops waiting without a run, call
        :meth:`stop_waiting`.
        """
        future = loop.create_future()
        with self._work:
            if self._ready or self._closed:
                future.set_result(None)
            else:
                self._idle_futures.append((loop, future))
        return future

    def stop_waiting(self, future: asyncio.Future[None]) -> None:
        """The waiter of ``future`` gives up without a run: forget it, or pass its wake-up on to the next waiter."""
        with self._work:
            queued = [(loop, f) for loop, f in self._idle_futures if f is not future]
            if len(queued) < len(self._idle_futures):
                self._idle_futures = queued
            elif self._ready:
                self._wake_idle_waiters()

    def start_worker(self) -> Run:
        """A run on a process started outside the pool, on the calling thread (tens of milliseconds).

        The process serves this run only: the calling thread may not outlive it (see ``ForkServer``).
        """
        self._check_open()
        if not self.config.fork_server:
            return Worker(self.config)
        return self._open(ForkServer(self.config))

    def retire(self, run: Run) -> None:
        """Take back a finished run (already reaped); its process returns to the pool or is cleaned up."""
        leftovers: list[_Leftover] = []
        with self._work:
            if isinstance(run, ForkedJob):
                if run.server.long_lived:
                    self._busy -= 1
                if run.server_reusable and not self._closed:
                    self._ready.append(run.server)
                    self._wake_idle_waiters()
                else:
                    leftovers.append(run.server)  # the thread disposes of it (and starts a replacement)
                if run.needs_cleanup_thread:
                    leftovers.append(run)
            else:
                leftovers.append(run)  # type: ignore[arg-type]
            if leftovers and not self._closed:
                self._retiring += leftovers
                self._wake_thread()
                leftovers = []
        if isinstance(run, ForkedJob) and not run.needs_cleanup_thread:
            run.cleanup()  # only gives the uid back: not worth waking the thread
        for leftover in leftovers:
            _dispose(leftover)

    def close(self) -> None:
        """Kill the idle processes, clean up retired ones and stop the thread (waits up to a few seconds)."""
        with self._work:
            if self._closed:
                return
            self._closed = True
            self._work.notify_all()
            self._wake_thread()
            self._wake_idle_waiters(every=True)
        if os.getpid() != self._pid:
            return  # a forked child: the processes and the thread belong to the parent
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        with self._work:
            leftovers: list[_Leftover] = [*self._ready, *self._retiring]
            self._ready, self._retiring = [], []
        for leftover in leftovers:
            _dispose(leftover)
        if not self._thread.is_alive():
            os.close(self._wake_r)
            os.close(self._wake_w)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def idle_count(self) -> int:
        """How many started processes are waiting in the pool."""
        with self._work:
            return len(self._ready)

    def _open(self, slot: _Slot) -> Run:
        if isinstance(slot, Worker):
            return slot
        try:
            return slot.open_job()
        except BaseException:
            if slot.long_lived:
                with self._work:
                    self._busy -= 1
                    self._work.notify()
            slot.discard()
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorClosedError("the sandbox pool is closed")
        if os.getpid() != self._pid:
            raise ExecutorClosedError("this sandbox pool belongs to the parent process; create one after fork")

    def _maintain(self) -> None:
        while True:
            with self._work:
                if self._closed:
                    return
                retiring, self._retiring = self._retiring, []
                self._servers = [server for server in self._servers if server not in retiring]
                wanted = self._wants_more()
                watched = [server for server in self._servers if server.reusable]
            for leftover in retiring:
                _dispose(leftover)
            if wanted:
                self._refill_one()
            elif not retiring:
                self._sleep(watched)

    def _sleep(self, servers: list[ForkServer]) -> None:
        """Wait until woken or one of ``servers`` dies; an idle server that died goes to the leftovers."""
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        by_pidfd = {server.pidfd: server for server in servers}
        for pidfd in by_pidfd:
            poller.register(pidfd, select.POLLIN)
        events = poller.poll()
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        with self._work:
            for fd, _mask in events:
                server = by_pidfd.get(fd)
                if server is None:
                    continue
                server.reusable = False  # a busy one is retired by its job, which sees the death too
                if server in self._ready:
                    self._ready.remove(server)
                    self._retiring.append(server)

    def _wake_thread(self) -> None:
        """Wake the pool's thread (call with the lock held): there are leftovers, or a process to start."""
        self._work.notify()
        with contextlib.suppress(BlockingIOError):  # full: it is woken already
            os.write(self._wake_w, b"w")

    def _wake_idle_waiters(self, *, every: bool = False) -> None:
        """A process became idle: wake one waiter (a thread and an asyncio one); ``every``: wake them all.

        Call with the lock held. Woken waiters retry :meth:`take_pooled` themselves.
        """
        if every:
            self._idle.notify_all()
            woken, self._idle_futures = self._idle_futures, []
        else:
            self._idle.notify()
            woken, self._idle_futures = self._idle_futures[:1], self._idle_futures[1:]
        for loop, future in woken:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there any more
                loop.call_soon_threadsafe(_resolve, future)

    def _wants_more(self) -> bool:
        return len(self._ready) + self._busy + self._starting < self.size

    def _refill_one(self) -> None:
        with self._work:
            self._starting += 1
        try:
            slot: _Slot = ForkServer(self.config, long_lived=True) if self.config.fork_server else Worker(self.config)
        except (SandboxError, OSError):
            logger.exception("could not start a sandboxed interpreter; retrying in %s s", _RETRY_AFTER_S)
            with self._work:
                self._starting -= 1
                self._wake_idle_waiters(every=True)  # whoever waits for it: start one yourself
                self._work.wait(_RETRY_AFTER_S)
            return
        with self._work:
            self._starting -= 1
            if not self._closed:
                self._ready.append(slot)
                if isinstance(slot, ForkServer):
                    self._servers.append(slot)
                self._wake_idle_waiters()
                return
        slot.discard()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _dispose(leftover: _Leftover) -> None:
    """Clean up what a run left: kill and reap a process that will not serve again, or a job's host residue."""
    if isinstance(leftover, ForkedJob):
        leftover.cleanup()
    elif isinstance(leftover, Worker) and leftover.returncode is not None:
        leftover.cleanup()  # a used worker: reaped by its run
    else:
        leftover.discard()
