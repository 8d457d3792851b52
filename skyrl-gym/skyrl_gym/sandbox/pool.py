"""A warm pool of started workers, refilled and cleaned up by one background thread."""

from __future__ import annotations

import collections
import logging
import os
import threading
from typing import Final

from skyrl_gym.sandbox.errors import ExecutorClosedError, SandboxError
from skyrl_gym.sandbox.worker import Worker, WorkerConfig

__all__ = ["WorkerPool"]

logger = logging.getLogger(__name__)

# After a failed start the thread waits this long before trying again (callers then start workers themselves
# and see the error directly).
_RETRY_AFTER_S: Final = 1.0


class WorkerPool:
    """Keeps ``size`` workers started and ready; each is handed out once and replaced in the background.

    Ownership: the pool owns its idle workers and one daemon thread, started by the constructor. A worker
    returned by :meth:`take` belongs to the caller until it is passed back to :meth:`retire`, which cleans it
    up on the pool's thread. :meth:`close` kills the idle workers and stops the thread; it is idempotent.
    """

    def __init__(self, config: WorkerConfig, size: int) -> None:
        if size < 0:
            raise ValueError(f"pool size must be >= 0, got {size}")
        self.config = config
        self.size = size
        self._ready: collections.deque[Worker] = collections.deque()
        self._retiring: list[Worker] = []
        self._cond = threading.Condition()
        self._closed = False
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._maintain, name="skyrl-sandbox-pool", daemon=True)
        self._thread.start()

    def take(self) -> Worker:
        """A ready (or starting) worker from the pool, or a newly started one when the pool is empty.

        Raises:
            ExecutorClosedError: The pool is closed, or was created in another process (before a fork).
            SandboxStartError: A new worker could not be started.
        """
        worker = self.take_pooled()
        return worker if worker is not None else self.start_worker()

    def take_pooled(self) -> Worker | None:
        """A pooled worker, or None when none is waiting (never blocks, never starts a process)."""
        with self._cond:
            self._check_open()
            if not self._ready:
                return None
            worker = self._ready.popleft()
            self._cond.notify_all()
            return worker

    def start_worker(self) -> Worker:
        """Start a worker outside the pool, on the calling thread (a few milliseconds)."""
        self._check_open()
        return Worker(self.config)

    def retire(self, worker: Worker) -> None:
        """Take back a used worker (already reaped) and clean it up on the pool's thread."""
        with self._cond:
            if not self._closed:
                self._retiring.append(worker)
                self._cond.notify_all()
                return
        worker.cleanup()

    def close(self) -> None:
        """Kill the idle workers, clean up retired ones and stop the thread (waits up to a few seconds)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if os.getpid() != self._pid:
            return  # a forked child: the workers and the thread belong to the parent
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        with self._cond:
            idle, self._ready = list(self._ready), collections.deque()
            retiring, self._retiring = self._retiring, []
        for worker in idle:
            worker.discard()
        for worker in retiring:
            worker.cleanup()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def idle_count(self) -> int:
        """How many started workers are waiting in the pool."""
        with self._cond:
            return len(self._ready)

    def _check_open(self) -> None:
        if self._closed:
            raise ExecutorClosedError("the sandbox pool is closed")
        if os.getpid() != self._pid:
            raise ExecutorClosedError("this sandbox pool belongs to the parent process; create one after fork")

    def _maintain(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._retiring and len(self._ready) >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
                retiring, self._retiring = self._retiring, []
                wanted = len(self._ready) < self.size
            for worker in retiring:
                worker.cleanup()
            if wanted:
                self._refill_one()

    def _refill_one(self) -> None:
        try:
            worker = Worker(self.config)
        except (SandboxError, OSError):
            logger.exception("could not start a sandboxed interpreter; retrying in %s s", _RETRY_AFTER_S)
            with self._cond:
                self._cond.wait(_RETRY_AFTER_S)
            return
        with self._cond:
            if not self._closed:
                self._ready.append(worker)
                return
        worker.discard()
