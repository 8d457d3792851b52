"""``CodeExecutor``: run Python snippets like ``python -c CODE``, sandboxed, from a warm pool of interpreters."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Final

from skyrl_gym.sandbox.batch import Batch
from skyrl_gym.sandbox.errors import SandboxUnavailableError
from skyrl_gym.sandbox.exchange import Exchange
from skyrl_gym.sandbox.forkserver import fork_server_supported
from skyrl_gym.sandbox.interpreter import SYSTEM_PYTHON, Interpreter, default_python, inspect_interpreter
from skyrl_gym.sandbox.isolation import IsolationMode, check_mode, isolation_mode, mode_requested, running_as_root
from skyrl_gym.sandbox.jobs import arun_job, run_job
from skyrl_gym.sandbox.limits import SandboxLimits
from skyrl_gym.sandbox.pool import WorkerPool
from skyrl_gym.sandbox.result import ExecutionResult
from skyrl_gym.sandbox.worker import WorkerConfig

__all__ = ["DEFAULT_PRELOAD", "CodeExecutor", "get_default_executor"]

logger = logging.getLogger(__name__)


class CodeExecutor:
    """Runs Python snippets in sandboxed, pre-started interpreters; each run starts from a clean one.

    A run behaves like ``subprocess.run([python, "-c", code], input=stdin)``: same ``sys.argv``, ``__main__``,
    output and traceback text, and exit status, but isolated (see :mod:`skyrl_gym.sandbox.isolation`) and
    limited by :class:`SandboxLimits`. The interpreter was started before the call, so a short snippet takes
    milliseconds rather than an interpreter start-up.

    Two ways to keep interpreters warm. Fork servers (the default where supported, i.e. for a root caller): each
    pooled interpreter forks a fresh child per run, and restores its sandbox after each (see
    :mod:`skyrl_gym.sandbox.forkserver`), so back-to-back runs cost a ``fork()`` rather than an interpreter
    start. One interpreter per run (``fork_server=False``): each pooled interpreter serves one run and exits;
    a background thread starts replacements.

    Thread-safe: :meth:`run` may be called from many threads at once and :meth:`arun` from any event loop.
    Ownership: the executor owns ``pool_size`` pooled interpreters and one daemon thread that replaces used ones.
    Close it with :meth:`close` (or ``with``); one still open when garbage-collected or at interpreter exit is
    closed then. Not fork-safe: create executors after forking.

    Args:
        limits: Default limits of a run; :meth:`run` may pass others per call.
        pool_size: How many interpreters to keep started. When more runs arrive at once, the extra ones wait up to
            0.5 s for a fork server to become idle, then start an interpreter themselves (cold start, tens of
            milliseconds); with one interpreter per run they start one at once.
        isolation: Force an isolation mode; default: :func:`~skyrl_gym.sandbox.isolation.isolation_mode`.
        python: The interpreter to run snippets with; default ``sys.executable`` (so a virtual environment's
            packages are importable). Its directories are resolved (``..`` and linked directories, relative to
            the current directory; :func:`~skyrl_gym.sandbox.interpreter.normalize_interpreter_path`) but not the
            file itself, so a virtual environment anywhere works. Outside bwrap, when running as root, it must be
            readable by an unprivileged uid; the default falls back to ``/usr/bin/python3`` when it is not.
        preload: Modules each interpreter imports before it waits for a job (e.g. ``["numpy"]``), so that
            importing them in a snippet is free. They count toward ``memory_mb``. Each run still gets a freshly
            imported copy: the module state is never shared between runs.
        tmpfs_mb: bwrap only: size of the private ``/tmp`` (the working directory) and ``/dev/shm``, in MiB.
        extra_ro_paths: bwrap only: more host directories to show read-only inside the sandbox.
        env: Extra environment variables; the interpreter inherits nothing else from this process.
        start_timeout_s: How long an interpreter may take to start before the run fails with
            :class:`~skyrl_gym.sandbox.errors.SandboxStartError`.
        fork_server: True: serve runs from fork servers; False: one interpreter per run; None (default): fork
            servers where supported (a root caller, any isolation mode).

    Raises:
        SandboxUnavailableError: The requested mode, interpreter or fork server cannot be used here.
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
        fork_server: bool | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        mode = check_mode(isolation) if isolation is not None else isolation_mode()
        # Auto-detection settled on a weaker mode because bwrap does not work here (it logged why, once).
        self._fallback = mode != "bwrap" and isolation is None and not mode_requested()
        if fork_server is None:
            fork_server = fork_server_supported()
        elif fork_server and not fork_server_supported():
            raise SandboxUnavailableError("fork servers need a root caller (a private uid per run); pass False")
        config = WorkerConfig(
            mode=mode,
            interpreter=_choose_interpreter(mode, python),
            preload=tuple(preload),
            tmpfs_bytes=tmpfs_mb << 20,
            ro_paths=tuple(extra_ro_paths),
            env=tuple((env or {}).items()),
            start_timeout_s=start_timeout_s,
            fork_server=fork_server,
        )
        self._pool = WorkerPool(config, pool_size)
        self._finalizer = weakref.finalize(self, self._pool.close)

    @property
    def isolation(self) -> IsolationMode:
        """The isolation mode of this executor's runs."""
        return self._pool.config.mode

    @property
    def fork_server(self) -> bool:
        """Whether runs are served by fork servers (else: one interpreter per run)."""
        return self._pool.config.fork_server

    @property
    def python(self) -> str:
        """The interpreter that runs the snippets."""
        return self._pool.config.interpreter.path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._pool.closed

    def metrics(self) -> dict[str, str | bool]:
        """What an env can merge into its ``get_metrics()`` (numbers are averaged across episodes, text is dropped).

        ``sandbox_mode``: the isolation mode of the runs (each :class:`ExecutionResult` carries it as
        ``isolation``). ``sandbox_fallback``: True when bwrap does not work here and auto-detection chose a weaker
        mode (not when the mode was asked for); its mean over episodes is the share that ran on such a fallback.
        """
        return {"sandbox_mode": self.isolation, "sandbox_fallback": self._fallback}

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
        return self._execute(code, stdin, limits or self.limits).result()

    async def arun(self, code: str, stdin: str | bytes = "", limits: SandboxLimits | None = None) -> ExecutionResult:
        """The asyncio version of :meth:`run`; waits on the event loop, never on a thread, for pooled runs.

        Cancelling the awaiting task kills the run and reaps its process before the cancellation propagates.
        """
        _check_code(code)
        return (await self._aexecute(code, stdin, limits or self.limits)).result()

    def run_many(
        self,
        code: str,
        stdins: Sequence[str | bytes],
        limits: SandboxLimits | None = None,
        *,
        setup: str = "",
        stop_on_failure: bool = False,
        max_total_output_bytes: int | None = None,
    ) -> list[ExecutionResult]:
        """Run ``code`` once per standard input, each run as ``python -c code`` would; faster than one run each.

        All inputs are served by one sandboxed run: its process runs ``setup`` once (e.g. imports), then forks a
        fresh process per input, in order, which runs ``code`` in a copy of the namespace ``setup`` left, with that
        input on its standard input. Each input's run is limited by ``limits`` (``timeout_s`` and the output caps
        per input; memory, CPU time and file size per process) and killed at its timeout or output cap; whatever it
        left running is killed before the next input starts. Inputs of one batch share the sandbox's files and uid
        (an input can see files an earlier one wrote, and can kill the batch's process: its result then carries
        that death, and the list ends there). Runs of different batches are isolated as :meth:`run` runs are.

        Args:
            code: Python source, run per input (tracebacks and exit statuses as under ``python -c``).
            stdins: The inputs, in order (str is sent as UTF-8).
            limits: Limits of each input's run; default: the executor's.
            setup: Source run once before the inputs, in the namespace each input's run starts from; its output is
                discarded. If it fails, its output and exit status 1 are the first input's result, and no input
                runs.
            stop_on_failure: Stop after the first input whose result is not ``ok`` (the list is then shorter).
            max_total_output_bytes: Budget for all inputs' output together: each stream of an input is capped
                at what earlier inputs left of it (and at ``max_output_bytes``). None: no budget.

        Returns:
            One result per input that ran, in order.

        Raises:
            SandboxStartError: No interpreter could be started for the batch.
            ExecutorClosedError: The executor is closed.
        """
        batch = self._batch(code, stdins, limits, setup, stop_on_failure, max_total_output_bytes)
        if not batch.stdins:
            return []
        body, job_limits = batch.job(private_uid=self._pool.config.private_uid)
        exchange = self._execute(body, b"", job_limits, batch=True)
        return batch.results(exchange.raw_stdout(), exchange.result())

    async def arun_many(
        self,
        code: str,
        stdins: Sequence[str | bytes],
        limits: SandboxLimits | None = None,
        *,
        setup: str = "",
        stop_on_failure: bool = False,
        max_total_output_bytes: int | None = None,
    ) -> list[ExecutionResult]:
        """The asyncio version of :meth:`run_many` (cancellation kills the batch, as for :meth:`arun`)."""
        batch = self._batch(code, stdins, limits, setup, stop_on_failure, max_total_output_bytes)
        if not batch.stdins:
            return []
        body, job_limits = batch.job(private_uid=self._pool.config.private_uid)
        exchange = await self._aexecute(body, b"", job_limits, batch=True)
        return batch.results(exchange.raw_stdout(), exchange.result())

    def _batch(
        self,
        code: str,
        stdins: Sequence[str | bytes],
        limits: SandboxLimits | None,
        setup: str,
        stop_on_failure: bool,
        max_total_output_bytes: int | None,
    ) -> Batch:
        """The :class:`Batch` of a ``run_many``/``arun_many`` call, with the executor's limits as default."""
        return Batch.of(
            code,
            stdins,
            limits or self.limits,
            setup=setup,
            stop_on_failure=stop_on_failure,
            max_total_output_bytes=max_total_output_bytes,
        )

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
        return (
            f"CodeExecutor(isolation={self.isolation!r}, pool_size={self._pool.size}, python={self.python!r}, "
            f"fork_server={self.fork_server!r})"
        )

    def _execute(
        self, code: str | bytes, stdin: str | bytes, limits: SandboxLimits, *, batch: bool = False
    ) -> Exchange:
        """Run one job to its end on a pooled or fresh process (see :func:`~skyrl_gym.sandbox.jobs.run_job`)."""
        return run_job(self._pool, code, stdin, limits, batch=batch, wait_s=_WAIT_FOR_IDLE_S)

    async def _aexecute(
        self, code: str | bytes, stdin: str | bytes, limits: SandboxLimits, *, batch: bool = False
    ) -> Exchange:
        return await arun_job(self._pool, code, stdin, limits, batch=batch, wait_s=_WAIT_FOR_IDLE_S)


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


# How long a run waits for a busy fork server to become idle before it starts one of its own, in seconds. A server
# is usually busy for milliseconds, and under many concurrent runs (an RL generator's episodes) a queue of tens of
# runs drains in well under this; starting a server instead costs tens of milliseconds of CPU each. The price: a
# run that arrives while every server runs a long job starts up to this much later.
_WAIT_FOR_IDLE_S: Final = 0.5

# Standard-library modules that generated code imports most (the lcb env's preamble imports exactly these): the
# default executor preloads them, so that importing them in a snippet costs nothing.
DEFAULT_PRELOAD: Final = (
    "bisect",
    "collections",
    "functools",
    "heapq",
    "itertools",
    "math",
    "operator",
    "random",
    "re",
    "string",
    "typing",
)

_default: CodeExecutor | None = None
_default_pid = -1
_default_lock = threading.Lock()


def get_default_executor() -> CodeExecutor:
    """The process-wide executor: default settings, :data:`DEFAULT_PRELOAD` preloaded; closed at exit.

    Importing the package starts nothing; the first call starts the pool (its thread and interpreters). A
    forked child that calls it gets its own executor.
    """
    global _default, _default_pid
    with _default_lock:
        if _default is None or _default.closed or _default_pid != os.getpid():
            _default, _default_pid = CodeExecutor(preload=DEFAULT_PRELOAD), os.getpid()
        return _default
