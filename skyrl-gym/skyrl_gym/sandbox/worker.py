"""What a sandboxed run runs on: the :class:`Run` contract, and :class:`Worker`, one interpreter per run.

A :class:`Run` is one job on a sandboxed process, seen as the descriptors :class:`~skyrl_gym.sandbox.exchange.Exchange`
drives (job, stdin, stdout, stderr) plus lifecycle descriptors that report *ready* (the process may get the job),
*started*, *exited* (with a status) and *lost* (the process died without reporting). Two kinds exist:

- :class:`Worker`: an interpreter started, isolation and all, before there is a job for it. Its bootstrap
  (:mod:`skyrl_gym.sandbox.bootstrap`) drops to the run's uid, imports the configured modules, writes ``R`` on a
  status pipe and blocks reading a job pipe. It serves exactly one job and exits.
- :class:`~skyrl_gym.sandbox.forkserver.ForkedJob`: a job on a long-lived fork server that forks a fresh child
  for it (see :mod:`skyrl_gym.sandbox.forkserver`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from skyrl_gym.sandbox.bootstrap import bootstrap_text
from skyrl_gym.sandbox.errors import SandboxStartError
from skyrl_gym.sandbox.interpreter import Interpreter, sandbox_env
from skyrl_gym.sandbox.isolation import (
    WORLD_WRITABLE_DIRS,
    IsolationMode,
    bwrap_command,
    running_as_root,
    uid_pool,
    unshare_command,
)

__all__ = [
    "Event",
    "Run",
    "Worker",
    "WorkerConfig",
    "bootstrap_source",
    "has_exited",
    "kill_every_process_of",
    "make_private_dir",
    "remove_files_of",
    "remove_ipc_of",
]

# What a lifecycle descriptor reported (see Run.on_signal).
Event = Literal["ready", "started", "exited", "lost"]


@dataclass(frozen=True)
class WorkerConfig:
    """How sandboxed processes are started; fixed for a pool. Per-run limits travel with each job instead.

    Attributes:
        mode: Isolation mode (see :mod:`skyrl_gym.sandbox.isolation`).
        interpreter: The Python to run.
        preload: Modules the bootstrap imports before it reports ready (e.g. ``("numpy",)``).
        tmpfs_bytes: bwrap only: size cap of the private ``/tmp`` and ``/dev/shm``, in bytes.
        ro_paths: bwrap only: extra host directories to show read-only.
        env: Extra environment variables for the interpreter.
        start_timeout_s: Seconds a process may take to become ready before it counts as failed.
        fork_server: Serve runs from long-lived fork servers (:mod:`~skyrl_gym.sandbox.forkserver`) rather than
            one interpreter per run.
    """

    mode: IsolationMode
    interpreter: Interpreter
    preload: tuple[str, ...] = ()
    tmpfs_bytes: int = 256 << 20
    ro_paths: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    start_timeout_s: float = 30.0
    fork_server: bool = False

    @property
    def private_uid(self) -> bool:
        """Whether each run gets its own uid (only a root caller can arrange that)."""
        return running_as_root()

    @property
    def no_new_privs(self) -> bool:
        """Whether the bootstrap sets no_new_privs itself (bwrap has set it already)."""
        return self.mode != "bwrap"

    @property
    def private_ipc(self) -> bool:
        """Whether runs lack an IPC namespace from their mode (rlimits, as root).

        They then get one each where the kernel allows it; otherwise the System V objects their uid created are
        removed from the host's namespace after them.
        """
        return self.mode == "rlimits" and self.private_uid


def bootstrap_source(
    config: WorkerConfig,
    *,
    uid: int,
    job_fd: int,
    status_fd: int,
    server: tuple[int, bool, tuple[str, ...], bool] | None = None,
) -> str:
    """The ``-c`` text of one sandboxed interpreter: the bootstrap plus the call that starts it."""
    args = (uid, uid, config.preload, job_fd, status_fd, config.interpreter.recursion_depth, server)
    hardening = (config.no_new_privs, config.private_ipc)
    call = f"_run_job(_serve(_pristine, {', '.join(map(repr, args + hardening))}))\n"
    return bootstrap_text() + "\n" + call


class Run(ABC):
    """One job on a sandboxed process: the descriptors an Exchange drives, and the process's lifecycle.

    Ownership: the descriptors in ``_fds`` belong to the run and are closed by :meth:`reap`; lifecycle descriptors
    that :meth:`signal_fds` returns may belong to a longer-lived process (a fork server) and are never closed here.
    """

    config: WorkerConfig
    uid: int  # the run's private uid, or -1 (not running as root)
    job_w: int
    stdin_w: int
    stdout_r: int
    stderr_r: int
    # Whether start-up output arrives on stdout/stderr (one interpreter per run) before "ready".
    startup_on_streams: bool = False

    def __init__(self) -> None:
        self._fds: list[int] = []
        # Called with a descriptor just before it is closed (the asyncio driver unregisters it there).
        self.before_close: Callable[[int], None] | None = None

    @abstractmethod
    def signal_fds(self) -> list[int]:
        """Lifecycle descriptors to wait on for reading; empty once the run exited or was lost."""

    @abstractmethod
    def on_signal(self, fd: int) -> list[Event]:
        """``fd`` (from :meth:`signal_fds`) is readable: what it reported, in order (nothing, if it was spurious)."""

    @property
    @abstractmethod
    def ready(self) -> bool:
        """Whether the process has reported ready and the job may be handed over with :meth:`begin`."""

    @abstractmethod
    def begin(self, timeout_s: float) -> None:
        """Hand the job (with its wall-clock timeout) to the ready process; :class:`SandboxStartError` if it is gone."""

    @abstractmethod
    def stop(self, *, kill: bool) -> None:
        """End the run's processes: all of them if ``kill``, else (it exited by itself) only what it left."""

    @abstractmethod
    def reap(self) -> int:
        """After :meth:`stop` or an exit: collect the run's process, close its descriptors; the exit status.

        Returns:
            The snippet's exit status, ``-N`` for death by signal N.
        """

    @abstractmethod
    def startup_output(self) -> bytes:
        """What the process printed while starting, for error messages (non-blocking)."""

    def is_open(self, fd: int) -> bool:
        """Whether ``fd`` is one of the run's own descriptors and still open."""
        return fd in self._fds

    def close_fd(self, fd: int) -> None:
        """Close one of the run's descriptors (idempotent)."""
        if fd in self._fds:
            if self.before_close is not None:
                self.before_close(fd)
            self._fds.remove(fd)
            os.close(fd)

    def _close_fds(self) -> None:
        for fd in list(self._fds):
            self.close_fd(fd)

    def _pipe(self) -> tuple[int, int]:
        # O_CLOEXEC: a process spawned concurrently on another thread must not inherit this run's pipes, or this
        # run would never see EOF on them. Popen re-opens pass_fds for its own child only.
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        self._fds += [read_end, write_end]
        return read_end, write_end


class Worker(Run):
    """A started sandboxed interpreter that will run at most one job (one interpreter per run).

    Ownership: the process (and, outside bwrap, its temporary directory and uid) belongs to whoever holds the
    Worker: the pool while it waits, then the run. The holder must end it with :meth:`stop` + :meth:`reap`, then
    :meth:`cleanup` (which may run later, on another thread).
    """

    startup_on_streams = True

    def __init__(self, config: WorkerConfig) -> None:
        super().__init__()
        self.config = config
        self.uid = uid_pool().acquire() if config.private_uid else -1
        self.tmpdir: str | None = None
        self.returncode: int | None = None
        self._ready = False
        try:
            self._spawn()
        except BaseException:
            if hasattr(self, "proc"):
                self.stop(kill=True)
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
        source = bootstrap_source(config, uid=self.uid, job_fd=job_r, status_fd=status_w)
        argv = [config.interpreter.path, "-c", source]
        if config.mode == "bwrap":
            home = "/tmp"
            roots = (*config.interpreter.roots, *config.ro_paths)
            argv = bwrap_command(argv, ro_paths=roots, tmpfs_bytes=config.tmpfs_bytes)
        else:
            home = self.tmpdir = make_private_dir(self.uid)
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

    @property
    def pid(self) -> int:
        """The pid of the process this library started (bwrap, unshare or the interpreter itself)."""
        return self.proc.pid

    @property
    def ready(self) -> bool:
        """Whether the interpreter wrote its ``R``."""
        return self._ready

    def signal_fds(self) -> list[int]:
        """The status pipe until ``R`` arrived, and the interpreter's pidfd until it exited."""
        return [fd for fd in (self.status_r, self.pidfd) if self.is_open(fd)]

    def on_signal(self, fd: int) -> list[Event]:
        """``R`` on the status pipe is "ready" (unless the interpreter already died: "lost"); the pidfd, "exited"."""
        if fd == self.pidfd:
            self.close_fd(self.pidfd)
            return ["exited"]
        try:
            ready = os.read(self.status_r, 1) == b"R"
        except BlockingIOError:
            return []
        self.close_fd(self.status_r)
        # Also an interpreter that was ready but died while it waited in the pool (killed from outside): the job
        # must not be reported as a run that was killed.
        if not ready or not self.is_open(self.pidfd) or has_exited(self.pidfd):
            return ["lost"]
        self._ready = True
        return ["ready"]

    def begin(self, timeout_s: float) -> None:
        """Nothing to hand over: the job pipe already belongs to the interpreter, which the library times."""

    def stop(self, *, kill: bool) -> None:
        """SIGKILL every process of the run (also after a normal exit: what it left). Safe to repeat.

        The process group goes first (bwrap/unshare and the interpreter share it; in bwrap mode the PID
        namespace dies with bwrap's init). Outside bwrap, with a private uid, a ``kill(-1, SIGKILL)`` as that uid
        then reaches daemons that called setsid() and left the group. In rlimits mode the System V objects the
        run created go too, before the result is returned (unless it had an IPC namespace of its own, which dies
        with its processes).
        """
        if self.returncode is None:
            # Not yet reaped, so the pid (= process group id) cannot have been reused.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.uid >= 0 and self.config.mode != "bwrap":
            kill_every_process_of(self.uid, besides=self.proc.pid)
        if self.uid >= 0 and self.config.private_ipc:
            remove_ipc_of(self.uid)

    def reap(self) -> int:
        """Wait for the started process to exit (after :meth:`stop`, promptly); close all pipes."""
        if self.returncode is None:
            raw = self.proc.wait()
            # bwrap reports a child killed by signal N as exit status 128 + N; map it back like subprocess does.
            if self.config.mode == "bwrap" and 128 < raw < 128 + signal.NSIG:
                raw = -(raw - 128)
            self.returncode = raw
        self._close_fds()
        return self.returncode

    def startup_output(self) -> bytes:
        """Nothing besides the streams, which the exchange reads itself."""
        return b""

    def cleanup(self) -> None:
        """Remove what the run left on the host and give its uid back. Call after :meth:`reap`."""
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        if self.uid >= 0:
            if self.config.mode != "bwrap":
                # Once more before the uid can be handed out again, in case a fork raced the sweep in stop().
                kill_every_process_of(self.uid, besides=self.proc.pid if hasattr(self, "proc") else -1)
                remove_files_of(self.uid)
            if self.config.private_ipc:
                remove_ipc_of(self.uid)
            uid_pool().release(self.uid)
            self.uid = -1

    def discard(self) -> None:
        """Kill, reap and clean up a worker that will not run a job."""
        self.stop(kill=True)
        self.reap()
        self.cleanup()


def has_exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited (a poll that does not wait)."""
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def make_private_dir(uid: int) -> str:
    """A fresh host directory (mode 0700) for one run, owned by its uid (when >= 0); the caller removes it."""
    path = tempfile.mkdtemp(prefix="skyrl-sandbox-")
    if uid >= 0:
        os.chown(path, uid, uid)
    os.chmod(path, 0o700)
    return path


def kill_every_process_of(uid: int, *, besides: int) -> None:
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


def remove_ipc_of(uid: int) -> None:
    """Remove the System V IPC objects of this process's IPC namespace that ``uid`` created (their ``cuid``).

    The creator uid is the one thing about an object its owner cannot change. The removal runs as ``uid``
    (``ipcrm``): root may remove other users' objects only with CAP_SYS_ADMIN, which a root caller that gets
    rlimits mode usually lacks. A shared memory segment still attached (by a process not yet dead) is destroyed
    when it is detached.
    """
    options = []
    for kind, option in (("shm", "-m"), ("sem", "-s"), ("msg", "-q")):
        try:
            with open(f"/proc/sysvipc/{kind}", "rb") as table:
                header, *rows = (line.split() for line in table)
            cuid = header.index(b"cuid")
        except (OSError, ValueError):  # a kernel without System V IPC, or a table we cannot read
            continue
        options += [arg for row in rows if int(row[cuid]) == uid for arg in (option, row[1].decode())]
    if not options:
        return  # the common case, decided with three reads
    ipcrm = shutil.which("ipcrm") or "/usr/bin/ipcrm"
    with contextlib.suppress(OSError):
        subprocess.run([ipcrm, *options], user=uid, group=uid, extra_groups=[], capture_output=True, check=False)


def remove_files_of(uid: int) -> None:
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
