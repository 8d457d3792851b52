"""One pre-started sandboxed interpreter (:class:`Worker`) and the exchange that runs one job on it.

A worker is started, isolation and all, before there is a job for it. Its bootstrap (``_bootstrap.py``) drops to
the run's uid, imports the configured modules, writes ``R`` on a status pipe and blocks reading a job pipe. A
run writes the job (rlimits + source) and stdin, reads stdout/stderr until the interpreter exits, and ends by
killing whatever the run left. A worker serves exactly one job: every run starts from a fresh interpreter.

:class:`Exchange` is that conversation as a state machine over non-blocking file descriptors. It does no
waiting itself: :func:`drive` (threads) and :func:`adrive` (asyncio) wait for the descriptors it names, so the
sync and async paths behave identically.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from skyrl_gym.sandbox.errors import SandboxStartError
from skyrl_gym.sandbox.interpreter import Interpreter, bootstrap_text, sandbox_env
from skyrl_gym.sandbox.isolation import (
    WORLD_WRITABLE_DIRS,
    IsolationMode,
    bwrap_command,
    running_as_root,
    uid_pool,
    unshare_command,
)
from skyrl_gym.sandbox.limits import SandboxLimits
from skyrl_gym.sandbox.result import ExecutionResult

__all__ = ["Exchange", "Worker", "WorkerConfig", "adrive", "drive"]

_READ_CHUNK: Final = 1 << 16
# After the interpreter exits (or is killed), how long to keep reading pipes that something else still holds.
_DRAIN_GRACE_S: Final = 1.0


@dataclass(frozen=True)
class WorkerConfig:
    """How workers are started; fixed for a pool. Per-run limits travel with each job instead.

    Attributes:
        mode: Isolation mode (see :mod:`skyrl_gym.sandbox.isolation`).
        interpreter: The Python to run.
        preload: Modules the bootstrap imports before it reports ready (e.g. ``("numpy",)``).
        tmpfs_bytes: bwrap only: size cap of the private ``/tmp`` and ``/dev/shm``, in bytes.
        ro_paths: bwrap only: extra host directories to show read-only.
        env: Extra environment variables for the interpreter.
        start_timeout_s: Seconds a worker may take to become ready before it counts as failed.
    """

    mode: IsolationMode
    interpreter: Interpreter
    preload: tuple[str, ...] = ()
    tmpfs_bytes: int = 256 << 20
    ro_paths: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    start_timeout_s: float = 30.0

    @property
    def private_uid(self) -> bool:
        """Whether each worker runs as its own uid (only a root caller can arrange that)."""
        return running_as_root()


def bootstrap_source(*, uid: int, preload: tuple[str, ...], job_fd: int, status_fd: int, depth: int) -> str:
    """The ``-c`` text of one worker: the bootstrap plus the call that starts it."""
    call = f"_serve(_pristine, {uid}, {uid}, {preload!r}, {job_fd}, {status_fd}, {depth})\n"
    return bootstrap_text() + "\n" + call


class Worker:
    """A started sandboxed interpreter that will run at most one job.

    Ownership: the process (and, outside bwrap, its temporary directory and uid) belongs to whoever holds the
    Worker: the pool while it waits, then the run. The holder must end it with :meth:`kill` + :meth:`reap`, then
    :meth:`cleanup` (which may run later, on another thread).
    """

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.uid = uid_pool().acquire() if config.private_uid else -1
        self.tmpdir: str | None = None
        self._fds: list[int] = []
        self.returncode: int | None = None
        # Called with a descriptor just before it is closed (the asyncio driver unregisters it there).
        self.before_close: Callable[[int], None] | None = None
        try:
            self._spawn()
        except BaseException:
            if hasattr(self, "proc"):
                self.kill()
                self.proc.wait()
            self._close_fds()
            self.cleanup()
            raise

    def _spawn(self) -> None:
        config = self.config
        job_r, self.job_w = self._pipe()
        self.status_r, status_w = self._pipe()
        stdin_r, self.stdin_w = self._pipe()
        self.stdout_r, stdout_w = self._pipe()
        self.stderr_r, stderr_w = self._pipe()
        child_ends = (job_r, status_w, stdin_r, stdout_w, stderr_w)
        source = bootstrap_source(
            uid=self.uid,
            preload=config.preload,
            job_fd=job_r,
            status_fd=status_w,
            depth=config.interpreter.recursion_depth,
        )
        argv = [config.interpreter.path, "-c", source]
        if config.mode == "bwrap":
            home = "/tmp"
            roots = (*config.interpreter.roots, *config.ro_paths)
            argv = bwrap_command(argv, ro_paths=roots, tmpfs_bytes=config.tmpfs_bytes)
        else:
            home = self.tmpdir = self._make_tmpdir()
            if config.mode == "unshare":
                argv = unshare_command(argv)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=stdin_r,
                stdout=stdout_w,
                stderr=stderr_w,
                pass_fds=(job_r, status_w),
                cwd=home if self.tmpdir else "/",
                env=sandbox_env(home, dict(config.env)),
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxStartError(f"cannot start a {config.mode} sandbox: {exc}") from exc
        finally:
            for fd in child_ends:
                os.close(fd)
                self._fds.remove(fd)
        for fd in (self.job_w, self.status_r, self.stdin_w, self.stdout_r, self.stderr_r):
            os.set_blocking(fd, False)
        # A pidfd tells us the moment the interpreter exits, even while something else keeps its pipes open.
        self.pidfd = os.pidfd_open(self.proc.pid)
        self._fds.append(self.pidfd)

    def _pipe(self) -> tuple[int, int]:
        # O_CLOEXEC: a worker spawned concurrently on another thread must not inherit this worker's pipes,
        # or this worker would never see EOF on its job pipe. Popen re-opens pass_fds for its own child only.
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        self._fds += [read_end, write_end]
        return read_end, write_end

    def _make_tmpdir(self) -> str:
        path = tempfile.mkdtemp(prefix="skyrl-sandbox-")
        if self.uid >= 0:
            os.chown(path, self.uid, self.uid)
        os.chmod(path, 0o700)
        return path

    @property
    def pid(self) -> int:
        """The pid of the process this library started (bwrap, unshare or the interpreter itself)."""
        return self.proc.pid

    def is_open(self, fd: int) -> bool:
        """Whether ``fd`` is one of the worker's descriptors and still open."""
        return fd in self._fds

    def close_fd(self, fd: int) -> None:
        """Close one of the worker's descriptors (idempotent)."""
        if fd in self._fds:
            if self.before_close is not None:
                self.before_close(fd)
            self._fds.remove(fd)
            os.close(fd)

    def kill(self) -> None:
        """SIGKILL every process of the run. Safe to call repeatedly and after the interpreter exited.

        The process group goes first (bwrap/unshare and the interpreter share it; in bwrap mode the PID
        namespace dies with bwrap's init). Outside bwrap, with a private uid, a ``kill(-1, SIGKILL)`` as that uid
        then reaches daemons that called setsid() and left the group.
        """
        if self.returncode is None:
            # Not yet reaped, so the pid (= process group id) cannot have been reused.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.uid >= 0 and self.config.mode != "bwrap":
            _kill_every_process_of(self.uid, besides=self.proc.pid)

    def reap(self) -> int:
        """Wait for the started process to exit (after :meth:`kill`, promptly); close all pipes.

        Returns:
            The interpreter's exit status, ``-N`` for death by signal N.
        """
        if self.returncode is None:
            raw = self.proc.wait()
            # bwrap reports a child killed by signal N as exit status 128 + N; map it back like subprocess does.
            if self.config.mode == "bwrap" and 128 < raw < 128 + signal.NSIG:
                raw = -(raw - 128)
            self.returncode = raw
        self._close_fds()
        return self.returncode

    def cleanup(self) -> None:
        """Remove what the run left on the host and give its uid back. Call after :meth:`reap`."""
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        if self.uid >= 0:
            if self.config.mode != "bwrap":
                # Once more before the uid can be handed out again, in case a fork raced the sweep in kill().
                _kill_every_process_of(self.uid, besides=self.proc.pid if hasattr(self, "proc") else -1)
                _remove_files_of(self.uid)
            uid_pool().release(self.uid)
            self.uid = -1

    def discard(self) -> None:
        """Kill, reap and clean up a worker that will not run a job."""
        self.kill()
        self.reap()
        self.cleanup()

    def _close_fds(self) -> None:
        for fd in list(self._fds):
            self.close_fd(fd)


def _kill_every_process_of(uid: int, *, besides: int) -> None:
    """``kill(-1, SIGKILL)`` as ``uid``: every process of that uid dies, in one atomic sweep of the task list.

    Repeated while it still finds processes, in case one was forking during the sweep. ``besides`` is the
    interpreter's pid: once it exited it stays a zombie (of the same uid) until we reap it.
    """
    if not _has_processes(uid, besides=besides):
        return  # the common case, found in well under a millisecond without starting a process
    kill = shutil.which("kill") or "/bin/kill"
    for _ in range(3):
        try:
            done = subprocess.run(
                [kill, "-9", "-1"], user=uid, group=uid, extra_groups=[], capture_output=True, check=False
            )
        except OSError:
            return
        if done.returncode != 0:  # ESRCH: nothing left to kill
            return


def _has_processes(uid: int, *, besides: int) -> bool:
    """Whether a process of ``uid`` other than ``besides`` exists (a /proc scan; new ones only come from forks)."""
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit() and entry.name != str(besides):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        return True
    return False


def _remove_files_of(uid: int) -> None:
    """Delete the entries owned by ``uid`` at the top of the world-writable directories."""
    for directory in {*WORLD_WRITABLE_DIRS, tempfile.gettempdir()}:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)


class Exchange:
    """One job on one worker, as a state machine: starting → running → draining → done.

    starting: wait for the worker's ``R`` (bounded by ``start_timeout_s``). Output seen before it belongs to
        start-up and is only used in error messages; the job is not sent before ``R``, so no snippet output
        can be mistaken for start-up output.
    running: send the job and stdin, collect stdout/stderr. Ends when the interpreter exits, at the wall-clock
        deadline, or when a stream exceeds ``max_output_bytes``; in the last two cases the run is killed.
    draining: after killing the leftovers, read what is still buffered in the pipes (up to a short grace).

    Handlers take the current ``time.monotonic()`` value; nothing here blocks except the final reap of a process
    that has already exited or been SIGKILLed.
    """

    def __init__(self, worker: Worker, code: str, stdin: str | bytes, limits: SandboxLimits) -> None:
        self.worker = worker
        self.limits = limits
        header = limits.rlimit_header(max_processes=worker.uid >= 0)
        data = stdin.encode("utf-8", "surrogateescape") if isinstance(stdin, str) else stdin
        self._outgoing = {
            worker.job_w: memoryview(header + code.encode("utf-8", "surrogatepass")),
            worker.stdin_w: memoryview(data),
        }
        self._streams = {worker.stdout_r: bytearray(), worker.stderr_r: bytearray()}
        self._startup_output = bytearray()
        self._truncated = {worker.stdout_r: False, worker.stderr_r: False}
        self.phase = "starting"
        self._deadline: float | None = time.monotonic() + worker.config.start_timeout_s
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._exited = False
        self._timed_out = False
        self._start_error: str | None = None
        self._result: ExecutionResult | None = None

    # What to wait for -------------------------------------------------------------------------------------------

    def readers(self) -> list[int]:
        """Descriptors to wait on for reading."""
        if self.phase == "done":
            return []
        fds = list(self._streams_open())
        if not self._exited:
            fds.append(self.worker.pidfd)
        if self.phase == "starting":
            fds.append(self.worker.status_r)
        return fds

    def writers(self) -> list[int]:
        """Descriptors to wait on for writing (only while running)."""
        return list(self._outgoing) if self.phase == "running" else []

    def deadline(self) -> float | None:
        """The monotonic time at which :meth:`on_tick` has something to do, or None."""
        return self._deadline if self.phase != "done" else None

    @property
    def done(self) -> bool:
        """Whether the run is over and the worker reaped."""
        return self.phase == "done"

    # Events ----------------------------------------------------------------------------------------------------

    def on_readable(self, fd: int, now: float) -> None:
        """``fd`` (one of :meth:`readers`) is readable or closed."""
        if self.phase == "done" or not self.worker.is_open(fd):
            return  # a stale event for a descriptor this run already closed
        if fd == self.worker.pidfd:
            self._exited = True
            self._end(now, kill=self.phase in ("starting", "running"))
        elif fd == self.worker.status_r:
            self._on_status(now)
        elif fd in self._streams:
            self._read_stream(fd, now)
        self._maybe_finish()

    def on_writable(self, fd: int, now: float) -> None:
        """``fd`` (one of :meth:`writers`) accepts data or its reader went away."""
        buffer = self._outgoing.get(fd)
        if buffer is None or not self.worker.is_open(fd):
            return
        try:
            written = os.write(fd, buffer[:_READ_CHUNK])
        except BlockingIOError:
            return
        except OSError as exc:  # EPIPE: the interpreter exited or closed stdin without reading it all
            if exc.errno != errno.EPIPE:
                raise
            written = len(buffer)
        self._outgoing[fd] = buffer = buffer[written:]
        if not buffer:
            del self._outgoing[fd]
            self.worker.close_fd(fd)  # EOF: the job is complete / stdin ends

    def on_tick(self, now: float) -> None:
        """Act on an expired deadline, if any. Call after each wait."""
        if self._deadline is None or now < self._deadline or self.phase == "done":
            return
        if self.phase == "starting":
            self._start_error = f"the sandboxed interpreter was not ready after {self.worker.config.start_timeout_s} s"
            self._end(now, kill=True)
        elif self.phase == "running":
            self._timed_out = True
            self._end(now, kill=True)
        else:  # draining: something outside our reach still holds a pipe; stop reading it
            self._finish()
        self._maybe_finish()

    def abort(self) -> None:
        """Stop the run now (the caller was cancelled): kill, reap and close. The result is never read."""
        self.worker.kill()
        self.worker.reap()
        self.phase = "done"

    # Outcome ---------------------------------------------------------------------------------------------------

    def result(self) -> ExecutionResult:
        """The outcome, once :attr:`done`.

        Raises:
            SandboxStartError: The interpreter died or hung before it was ready.
        """
        assert self._result is not None or self._start_error is not None, "result() before the run is done"
        if self._result is None:
            output = bytes(self._startup_output + self._streams[self.worker.stderr_r]).decode(errors="replace")
            raise SandboxStartError(f"{self._start_error}; its output: {output.strip()!r}")
        return self._result

    # Internals -------------------------------------------------------------------------------------------------

    def _streams_open(self) -> list[int]:
        return [fd for fd in self._streams if self.worker.is_open(fd)]

    def _on_status(self, now: float) -> None:
        try:
            ready = os.read(self.worker.status_r, 1) == b"R"
        except BlockingIOError:
            return
        self.worker.close_fd(self.worker.status_r)
        if not ready or _has_exited(self.worker.pidfd):
            # Also an interpreter that was ready but died while it waited in the pool (killed from outside):
            # the job must not be reported as a run that was killed.
            self._start_error = "the sandboxed interpreter exited before it got the job"
            self._end(now, kill=True)
            return
        # Whatever start-up wrote is already in the pipes (writes complete before the R was written).
        for fd in self._streams:
            self._read_stream(fd, now, startup=True)
        self.phase = "running"
        self._started_at = now
        self._deadline = now + self.limits.timeout_s

    def _read_stream(self, fd: int, now: float, *, startup: bool = False) -> None:
        while self.worker.is_open(fd):
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.worker.close_fd(fd)
                return
            if startup or self.phase == "starting":
                self._startup_output += chunk
                continue
            self._keep(fd, chunk, now)

    def _keep(self, fd: int, chunk: bytes, now: float) -> None:
        buffer, cap = self._streams[fd], self.limits.max_output_bytes
        room = cap - len(buffer)
        if len(chunk) > room and self.phase in ("starting", "running"):
            self._truncated[fd] = True
            buffer += chunk[: max(room, 0)]
            self._end(now, kill=True)
        elif room > 0:
            buffer += chunk[:room]

    def _end(self, now: float, *, kill: bool) -> None:
        """Leave starting/running: stop the clock, kill the leftovers, and drain the pipes."""
        if self.phase in ("starting", "running"):
            if self.phase == "starting" and self._start_error is None:
                self._start_error = "the sandboxed interpreter exited before it was ready"
            self._ended_at = now
            self.phase = "draining"
            self._deadline = now + _DRAIN_GRACE_S
            for fd in list(self._outgoing):
                self.worker.close_fd(fd)
            self._outgoing.clear()
        if kill:
            self.worker.kill()

    def _maybe_finish(self) -> None:
        if self.phase == "draining" and self._exited and not self._streams_open():
            self._finish()

    def _finish(self) -> None:
        exit_code = self.worker.reap()
        self.phase = "done"
        if self._start_error is not None:
            return
        assert self._started_at is not None
        assert self._ended_at is not None
        out, err = self._streams[self.worker.stdout_r], self._streams[self.worker.stderr_r]
        self._result = ExecutionResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            exit_code=exit_code,
            timed_out=self._timed_out,
            stdout_truncated=self._truncated[self.worker.stdout_r],
            stderr_truncated=self._truncated[self.worker.stderr_r],
            duration_s=self._ended_at - self._started_at,
            isolation=self.worker.config.mode,
        )


def _has_exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def drive(exchange: Exchange) -> None:
    """Run ``exchange`` to completion on this thread (poll(2) on its descriptors)."""
    try:
        while not exchange.done:
            poller = select.poll()
            readers, writers = exchange.readers(), exchange.writers()
            for fd in readers:
                poller.register(fd, select.POLLIN)
            for fd in writers:
                poller.register(fd, select.POLLOUT)
            deadline = exchange.deadline()
            timeout_ms = None if deadline is None else max(0.0, (deadline - time.monotonic()) * 1000)
            events = poller.poll(timeout_ms)
            now = time.monotonic()
            for fd, _mask in events:
                # Any event (data, hang-up, error) means "try the operation"; the handlers tell them apart and
                # ignore descriptors an earlier event of this batch closed.
                if fd in readers:
                    exchange.on_readable(fd, now)
                elif fd in writers:
                    exchange.on_writable(fd, now)
            exchange.on_tick(now)
    finally:
        if not exchange.done:
            exchange.abort()


async def adrive(exchange: Exchange) -> None:
    """Run ``exchange`` to completion on the running event loop (its reader/writer callbacks).

    Cancellation kills the run and reaps its process before the CancelledError propagates.
    """
    loop = asyncio.get_running_loop()
    wakeup = asyncio.Event()
    watched_r: set[int] = set()
    watched_w: set[int] = set()

    def readable(fd: int) -> None:
        exchange.on_readable(fd, time.monotonic())
        wakeup.set()

    def writable(fd: int) -> None:
        exchange.on_writable(fd, time.monotonic())
        wakeup.set()

    def unwatch(fd: int) -> None:
        # The selector must forget a descriptor before it is closed: its number may be reused at once.
        if fd in watched_r:
            watched_r.discard(fd)
            loop.remove_reader(fd)
        if fd in watched_w:
            watched_w.discard(fd)
            loop.remove_writer(fd)

    def sync_watches() -> None:
        wanted_r, wanted_w = set(exchange.readers()), set(exchange.writers())
        for fd in watched_r - wanted_r:
            loop.remove_reader(fd)
        for fd in wanted_r - watched_r:
            loop.add_reader(fd, readable, fd)
        for fd in watched_w - wanted_w:
            loop.remove_writer(fd)
        for fd in wanted_w - watched_w:
            loop.add_writer(fd, writable, fd)
        watched_r.clear()
        watched_r.update(wanted_r)
        watched_w.clear()
        watched_w.update(wanted_w)

    exchange.worker.before_close = unwatch
    try:
        while not exchange.done:
            sync_watches()
            deadline = exchange.deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), timeout)
            wakeup.clear()
            exchange.on_tick(time.monotonic())
    finally:
        for fd in [*watched_r, *watched_w]:
            unwatch(fd)
        if not exchange.done:
            exchange.abort()
        exchange.worker.before_close = None
