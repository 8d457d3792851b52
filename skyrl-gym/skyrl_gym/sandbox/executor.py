"""``CodeExecutor``: run Python snippets like ``python -c CODE``, sandboxed, from a warm pool of interpreters."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from types import TracebackType

from skyrl_gym.sandbox.errors import SandboxStartError, SandboxUnavailableError
from skyrl_gym.sandbox.interpreter import SYSTEM_PYTHON, Interpreter, default_python, inspect_interpreter
from skyrl_gym.sandbox.isolation import IsolationMode, check_mode, isolation_mode, running_as_root
from skyrl_gym.sandbox.limits import SandboxLimits
from skyrl_gym.sandbox.pool import WorkerPool
from skyrl_gym.sandbox.result import ExecutionResult
from skyrl_gym.sandbox.worker import Exchange, Worker, WorkerConfig, adrive, drive

__all__ = ["CodeExecutor", "get_default_executor"]

logger = logging.getLogger(__name__)


class CodeExecutor:
    """Runs Python snippets in sandboxed, pre-started interpreters; each run gets a fresh one.

    A run behaves like ``subprocess.run([python, "-c", code], input=stdin)``: same ``sys.argv``, ``__main__``,
    output and traceback text, and exit status, but isolated (see :mod:`skyrl_gym.sandbox.isolation`) and
    limited by :class:`SandboxLimits`. The interpreter was started before the call, so a short snippet takes
    milliseconds rather than an interpreter start-up.

    Thread-safe: :meth:`run` may be called from many threads at once and :meth:`arun` from any event loop.
    Ownership: the executor owns ``pool_size`` idle interpreters and one daemon thread that replaces used ones.
    Close it with :meth:`close` (or ``with``); one still open when garbage-collected or at interpreter exit is
    closed then. Not fork-safe: create executors after forking.

    Args:
        limits: Default limits of a run; :meth:`run` may pass others per call.
        pool_size: How many interpreters to keep started and waiting. When more runs arrive at once, the extra
            ones start an interpreter themselves (cold start, tens of milliseconds).
        isolation: Force an isolation mode; default: :func:`~skyrl_gym.sandbox.isolation.isolation_mode`.
        python: The interpreter to run snippets with; default ``sys.executable`` (so a virtual environment's
            packages are importable). Outside bwrap, when running as root, it must be readable by an
            unprivileged uid; the default falls back to ``/usr/bin/python3`` when it is not.
        preload: Modules each interpreter imports before it waits for a job (e.g. ``["numpy"]``), so that
            importing them in a snippet is free. They count toward ``memory_mb``. Each run still gets a freshly
            imported copy: the module state is never shared between runs.
        tmpfs_mb: bwrap only: size of the private ``/tmp`` (the working directory) and ``/dev/shm``, in MiB.
        extra_ro_paths: bwrap only: more host directories to show read-only inside the sandbox.
        env: Extra environment variables; the interpreter inherits nothing else from this process.
        start_timeout_s: How long an interpreter may take to start before the run fails with
            :class:`~skyrl_gym.sandbox.errors.SandboxStartError`.

    Raises:
        SandboxUnavailableError: The requested mode or interpreter cannot be used here.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        pool_size: int = 2,
        isolation: IsolationMode | None = None,
        python: str | None = None,
        preload: Sequence[str] = (),
        tmpfs_mb: int = 256,
        extra_ro_paths: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.limits = limits or SandboxLimits()
        mode = check_mode(isolation) if isolation is not None else isolation_mode()
        config = WorkerConfig(
            mode=mode,
            interpreter=_choose_interpreter(mode, python),
            preload=tuple(preload),
            tmpfs_bytes=tmpfs_mb << 20,
            ro_paths=tuple(extra_ro_paths),
            env=tuple((env or {}).items()),
            start_timeout_s=start_timeout_s,
        )
        self._pool = WorkerPool(config, pool_size)
        self._finalizer = weakref.finalize(self, self._pool.close)

    @property
    def isolation(self) -> IsolationMode:
        """The isolation mode of this executor's runs."""
        return self._pool.config.mode

    @property
    def python(self) -> str:
        """The interpreter that runs the snippets."""
        return self._pool.config.interpreter.path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._pool.closed

    def run(self, code: str, stdin: str | bytes = "", limits: SandboxLimits | None = None) -> ExecutionResult:
        """Run ``code`` as ``python -c code`` would, with ``stdin`` as its standard input; block until it ends.

        Args:
            code: Python source.
            stdin: The snippet's whole standard input (str is sent as UTF-8); it then sees EOF.
            limits: Limits of this run; default: the executor's.

        Returns:
            The outcome. A snippet that raises, exits non-zero, times out or floods its output is a normal
            result, not an exception.

        Raises:
            SandboxStartError: No interpreter could be started for the run.
            ExecutorClosedError: The executor is closed.
        """
        _check_code(code)
        limits = limits or self.limits
        worker = self._pool.take_pooled()
        if worker is not None:
            try:
                return self._run_on(worker, code, stdin, limits)
            except SandboxStartError:
                # A pooled interpreter died while it waited (e.g. killed from outside): one fresh attempt.
                logger.warning("a pooled sandbox interpreter was dead; starting a fresh one", exc_info=True)
        return self._run_on(self._pool.start_worker(), code, stdin, limits)

    async def arun(self, code: str, stdin: str | bytes = "", limits: SandboxLimits | None = None) -> ExecutionResult:
        """The asyncio version of :meth:`run`; waits on the event loop, never on a thread, for pooled runs.

        Cancelling the awaiting task kills the run and reaps its process before the cancellation propagates.
        """
        _check_code(code)
        limits = limits or self.limits
        worker = self._pool.take_pooled()
        if worker is not None:
            try:
                return await self._arun_on(worker, code, stdin, limits)
            except SandboxStartError:
                logger.warning("a pooled sandbox interpreter was dead; starting a fresh one", exc_info=True)
        return await self._arun_on(await self._start_worker_async(), code, stdin, limits)

    def close(self) -> None:
        """Kill the idle interpreters and stop the pool's thread. Runs in progress finish normally."""
        self._finalizer()

    def __enter__(self) -> CodeExecutor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CodeExecutor(isolation={self.isolation!r}, pool_size={self._pool.size}, python={self.python!r})"

    def _run_on(self, worker: Worker, code: str, stdin: str | bytes, limits: SandboxLimits) -> ExecutionResult:
        exchange = Exchange(worker, code, stdin, limits)
        try:
            drive(exchange)
        finally:
            self._pool.retire(worker)
        return exchange.result()

    async def _arun_on(self, worker: Worker, code: str, stdin: str | bytes, limits: SandboxLimits) -> ExecutionResult:
        exchange = Exchange(worker, code, stdin, limits)
        try:
            await adrive(exchange)
        finally:
            self._pool.retire(worker)
        return exchange.result()

    async def _start_worker_async(self) -> Worker:
        # Starting a process blocks for a few milliseconds: do it on a thread. If the caller is cancelled
        # meanwhile, the worker still starts; discard it instead of leaking the process.
        future = asyncio.get_running_loop().run_in_executor(None, self._pool.start_worker)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_discard_started_worker)
            raise


def _discard_started_worker(future: asyncio.Future[Worker]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().discard()


def _check_code(code: object) -> None:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")


def _choose_interpreter(mode: IsolationMode, python: str | None) -> Interpreter:
    interpreter = inspect_interpreter(python or default_python())
    if mode == "bwrap" or not running_as_root() or interpreter.usable_by_any_uid():
        return interpreter
    # Outside bwrap the snippet runs as an unprivileged uid against the host's real file permissions: an
    # interpreter under /root (pyenv's default) cannot even import its standard library there.
    if python is not None:
        raise SandboxUnavailableError(
            f"{python!r} is not readable by an unprivileged uid, which isolation mode {mode!r} needs; "
            "use an interpreter outside private directories (e.g. /usr/bin/python3) or bwrap"
        )
    fallback = inspect_interpreter(SYSTEM_PYTHON)
    if not fallback.usable_by_any_uid():
        raise SandboxUnavailableError(f"no interpreter usable by an unprivileged uid for isolation mode {mode!r}")
    logger.info("sandbox interpreter: %s is private to its owner; using %s", interpreter.path, SYSTEM_PYTHON)
    return fallback


_default: CodeExecutor | None = None
_default_pid = -1
_default_lock = threading.Lock()


def get_default_executor() -> CodeExecutor:
    """The process-wide executor with default settings, created on first use and closed at exit.

    Importing the package starts nothing; the first call starts the pool (its thread and interpreters). A
    forked child that calls it gets its own executor.
    """
    global _default, _default_pid
    with _default_lock:
        if _default is None or _default.closed or _default_pid != os.getpid():
            _default, _default_pid = CodeExecutor(), os.getpid()
        return _default
