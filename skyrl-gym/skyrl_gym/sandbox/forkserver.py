"""Fork servers: long-lived sandboxed interpreters that fork one fresh child per job.

A :class:`ForkServer` is started like a one-run interpreter (bwrap, unshare or plain; modules preloaded;
``gc.freeze()``), but it never runs a snippet itself. For each job it receives four descriptors (job pipe, stdin,
stdout, stderr), a private uid and (outside bwrap) a private working directory over a control socket, and forks;
the child becomes a session leader on those streams, in that directory, as that uid, and runs the snippet
exactly as a one-run interpreter would (``bootstrap/serve.py``). The server waits for the child, then restores its
sandbox before it takes the next job: it kills every process the job left (everything in its PID namespace but
init and itself under bwrap, every process of the job's uid elsewhere), empties ``/tmp`` and ``/dev/shm`` (bwrap;
outside bwrap the library removes the job's directory and what its uid left in the world-writable directories),
and checks that the IPC namespace holds no System V object (bwrap, unshare) or POSIX message queue (bwrap). In
rlimits mode each child gets an IPC namespace of its own where the kernel allows it (CAP_SYS_ADMIN), and the server
removes the System V objects the job's uid created in the host's namespace. If it cannot restore that state, it
exits and the pool replaces it. A job that times out, floods its output or is cancelled is killed together with
its server. The child's exit report (which lets the library skip waiting for the kernel to tear the child down) is
believed only once the kernel shows the child exiting: the snippet can write on that pipe too, but a false report
neither ends its run nor frees the server.

A child costs a ``fork()`` of a warm interpreter instead of an interpreter start, and since the server never ran
user code, the child's modules are as fresh as a new interpreter's. Fork servers need a root caller: a private
uid per job is what keeps a job from signalling or tracing its server and from reaching the next job.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
from typing import Final

from skyrl_gym.sandbox.errors import SandboxStartError
from skyrl_gym.sandbox.interpreter import sandbox_env
from skyrl_gym.sandbox.isolation import bwrap_command, running_as_root, uid_pool, unshare_command
from skyrl_gym.sandbox.worker import (
    Event,
    Run,
    WorkerConfig,
    bootstrap_source,
    has_exited,
    kill_every_process_of,
    make_private_dir,
    remove_files_of,
    remove_ipc_of,
)

__all__ = ["ForkServer", "ForkedJob", "fork_server_supported"]

logger = logging.getLogger(__name__)

# Under bwrap, the directories private to the server that a job can write to; emptied after every job.
_BWRAP_TIDY_DIRS: Final = ("/tmp", "/dev/shm")
_STARTUP_OUTPUT_LIMIT: Final = 1 << 16


def fork_server_supported() -> bool:
    """Whether fork servers can run here: they need private uids, hence a root caller (any isolation mode)."""
    return running_as_root()


class ForkServer:
    """A started sandboxed interpreter that forks a child per job (one job at a time).

    Ownership: the server process belongs to whoever holds this object: the pool while it is idle, a
    :class:`ForkedJob` (see :meth:`open_job`) while a job runs on it. The holder ends it with :meth:`discard`.

    Args:
        config: How to start it.
        long_lived: Whether the calling thread outlives the pool. Under bwrap the server dies with the *thread*
            that started it (``--die-with-parent`` is the kernel's parent-death signal, which follows the thread),
            so only a server started on the pool's own thread may serve more than one job.
    """

    def __init__(self, config: WorkerConfig, *, long_lived: bool = False) -> None:
        self.config = config
        self.long_lived = long_lived
        self.ready = False  # the server reported that it waits for a job
        self.reusable = True  # false once it exited, was killed, or reported that it could not clean up
        self.returncode: int | None = None
        self._fds: list[int] = []
        try:
            self._spawn()
        except BaseException:
            if hasattr(self, "proc"):
                self.kill()
                self.proc.wait()
            self._close_fds()
            raise

    def _spawn(self) -> None:
        config = self.config
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control = ours
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)  # an empty pipe, as a one-run interpreter's stdin is a pipe
        self.output_r, output_w = os.pipe2(os.O_CLOEXEC)  # start-up output and a crashing server's traceback
        self._fds.append(self.output_r)
        os.close(stdin_w)
        in_namespace = config.mode == "bwrap"
        server = (theirs.fileno(), in_namespace, _BWRAP_TIDY_DIRS if in_namespace else (), config.mode != "rlimits")
        source = bootstrap_source(config, uid=-1, job_fd=-1, status_fd=-1, server=server)
        argv = [config.interpreter.path, "-c", source]
        home = "/tmp"
        if config.mode == "bwrap":
            roots = (*config.interpreter.roots, *config.ro_paths)
            argv = bwrap_command(argv, ro_paths=roots, tmpfs_bytes=config.tmpfs_bytes, fork_server=True)
        elif config.mode == "unshare":
            argv = unshare_command(argv)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=stdin_r,
                stdout=output_w,
                stderr=output_w,
                pass_fds=(theirs.fileno(),),
                cwd="/",
                env=sandbox_env(home, dict(config.env)),
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxStartError(f"cannot start a {config.mode} fork server: {exc}") from exc
        finally:
            os.close(stdin_r)
            os.close(output_w)
            theirs.close()
        ours.setblocking(False)
        os.set_blocking(self.output_r, False)
        self.pidfd = os.pidfd_open(self.proc.pid)
        self._fds.append(self.pidfd)

    @property
    def pid(self) -> int:
        """The pid of the process this library started (bwrap, unshare or the interpreter itself)."""
        return self.proc.pid

    def open_job(self) -> ForkedJob:
        """A job on this server (which must not have another one running)."""
        return ForkedJob(self)

    def refresh(self) -> None:
        """While idle: take in what the server reported since (ready again, or gone); non-blocking."""
        for message in self.read_messages():
            if message == b"R":
                self.ready = True

    def read_messages(self) -> list[bytes]:
        """The messages waiting on the control socket; ``b""`` last if the server hung up (non-blocking)."""
        messages: list[bytes] = []
        while True:
            try:
                message = self.control.recv(64)
            except BlockingIOError:
                return messages
            except OSError:
                message = b""
            messages.append(message)
            if not message:
                self.reusable = False
                return messages

    def startup_output(self) -> bytes:
        """What the server printed so far (start-up errors, or the traceback of a crash); non-blocking."""
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := os.read(self.output_r, _STARTUP_OUTPUT_LIMIT):
                chunks.append(chunk)
        return b"".join(chunks)[-_STARTUP_OUTPUT_LIMIT:]

    def kill(self) -> None:
        """SIGKILL the server (under bwrap: with its PID namespace, so with any job running on it)."""
        self.reusable = False
        if self.returncode is None:
            # Not yet reaped, so the pid (= process group id) cannot have been reused.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def discard(self) -> None:
        """Kill and reap the server and close its descriptors. Idempotent."""
        self.kill()
        if self.returncode is None:
            self.returncode = self.proc.wait()
        output = self.startup_output()
        if output:
            logger.debug("a sandbox fork server printed: %r", output[-2000:])
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if hasattr(self, "control"):
            self.control.close()


class ForkedJob(Run):
    """One job on a :class:`ForkServer`: its own pipes, private uid and (outside bwrap) working directory.

    Ownership: the job owns its pipes, uid and directory, and borrows the server (its control socket and pidfd)
    until the run ends. After :meth:`reap`, whoever holds the job returns the server to the pool if
    :attr:`server_reusable`, else discards it, and calls :meth:`cleanup` (possibly later, on another thread).
    """

    def __init__(self, server: ForkServer) -> None:
        super().__init__()
        self.server = server
        self.config = server.config
        self.uid = uid_pool().acquire()
        self.tmpdir = make_private_dir(self.uid) if self.config.mode != "bwrap" else None
        self.exit_code: int | None = None
        self._started = False  # the server forked the job's child
        self._over = False  # the child's exit was reported, or the server is gone
        self._killed = False
        try:
            self._job_r, self.job_w = self._pipe()
            self._stdin_r, self.stdin_w = self._pipe()
            self.stdout_r, self._stdout_w = self._pipe()
            self.stderr_r, self._stderr_w = self._pipe()
        except BaseException:
            self._close_fds()
            self.cleanup()
            raise
        for fd in (self.job_w, self.stdin_w, self.stdout_r, self.stderr_r):
            os.set_blocking(fd, False)

    @property
    def ready(self) -> bool:
        """Whether the server waits for a job."""
        return self.server.ready

    @property
    def server_reusable(self) -> bool:
        """Whether the server may take the next job once it reports ready (it restores its sandbox first)."""
        return self.server.long_lived and self.server.reusable and not self._killed

    def signal_fds(self) -> list[int]:
        """The server's control socket and pidfd, until the job's end was reported or the server died."""
        return [] if self._over else [self.server.control.fileno(), self.server.pidfd]

    def on_signal(self, fd: int) -> list[Event]:
        """Translate the server's messages (``R``, ``S``, ``X status``) or its death into events."""
        events: list[Event] = []
        if fd == self.server.pidfd:
            self.server.reusable = False
            return [self._server_gone()]
        for message in self.server.read_messages():
            if message == b"R":  # before the job: the server waits for it; after: it restored its sandbox
                self.server.ready = True
                if not self._over:
                    events.append("ready")
            elif self._over:
                # The job is over; a hang-up after it is the server's own business (it could not clean up).
                self.server.reusable = self.server.reusable and bool(message)
            elif message == b"S":
                self._started = True
                events.append("started")
            elif message.startswith(b"X "):
                self.exit_code = int(message[2:])
                self._over = True
                events.append("exited")
            else:  # hang-up (or garbage): the server is gone
                self.server.reusable = False
                events.append(self._server_gone())
        return events

    def _server_gone(self) -> Event:
        """The server died: before the child was forked the job never started ("lost"), else it was killed."""
        self._over = True
        if not self._started:
            return "lost"
        self.exit_code = -signal.SIGKILL
        self._killed = True
        return "exited"

    def begin(self, timeout_s: float) -> None:
        """Send the job's descriptors, uid and timeout to the server's waiting child."""
        server = self.server
        child_ends = [self._job_r, self._stdin_r, self._stdout_w, self._stderr_w]
        try:
            if not server.reusable or has_exited(server.pidfd):
                raise SandboxStartError("the sandbox fork server exited before it got the job")
            message = f"{self.uid}\n{self.tmpdir or ''}\n{timeout_s!r}".encode()
            fds = array.array("i", child_ends)
            server.control.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError as exc:
            server.reusable = False
            raise SandboxStartError(f"the sandbox fork server did not take the job: {exc}") from exc
        finally:
            for fd in child_ends:
                self.close_fd(fd)
        server.ready = False

    def stop(self, *, kill: bool) -> None:
        """After a reported exit there is nothing left to end; otherwise kill the server and the job's uid."""
        if not kill and not self._killed:
            return
        self._killed = True
        self.server.kill()
        if self.config.mode != "bwrap":
            # Outside a PID namespace the job's processes do not die with the server.
            kill_every_process_of(self.uid, besides=-1)
        if self.config.private_ipc:
            remove_ipc_of(self.uid)  # what the server would have removed before its next job

    def reap(self) -> int:
        """Close the job's descriptors; the child's exit status (``-9`` if it was killed with its server)."""
        self._close_fds()
        return self.exit_code if self.exit_code is not None and not self._killed else -signal.SIGKILL

    def startup_output(self) -> bytes:
        """The server's own output (start-up errors)."""
        return self.server.startup_output()

    @property
    def needs_cleanup_thread(self) -> bool:
        """Whether :meth:`cleanup` has host work to do (outside bwrap, or after a kill), or only frees the uid."""
        return self.tmpdir is not None or self._killed

    def cleanup(self) -> None:
        """Remove what the job left on the host and give its uid back. Call after :meth:`reap`."""
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        if self.uid >= 0:
            if self.config.mode != "bwrap":
                kill_every_process_of(self.uid, besides=-1)
                remove_files_of(self.uid)
            if self.config.private_ipc:
                remove_ipc_of(self.uid)
            uid_pool().release(self.uid)
            self.uid = -1
