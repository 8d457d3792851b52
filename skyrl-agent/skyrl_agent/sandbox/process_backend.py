"""A sandbox backend of plain subprocesses in temporary directories: fast, and NOT isolated.

Each sandbox is a fresh temporary directory standing in for the root filesystem: an absolute sandbox path such as
``/workspace/x.py`` maps to ``<tmp>/workspace/x.py`` and commands run there with ``bash``. Commands see the host
(network, files, processes), so use it only for trusted code, such as validating the shipped task suite or tests.
Commands must use paths relative to their ``workdir``.

A command's processes do not outlive it, as in the other backends: when ``bash`` exits or the timeout fires, its
process group is killed, and so is every process whose environment carries the command's mark (``MARK``, a fresh
token per command), which is how a daemon that left the session with ``setsid`` is found. The output is read
until then and for at most ``DRAIN_S`` more, so a process that still holds the pipe (one that dropped the mark)
cannot hold the command. Commands read ``/dev/null`` as stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

from skyrl_agent.sandbox.base import CommandResult, Sandbox, SandboxClosedError, SandboxSpec, Snapshot

OUTPUT_CAP = 1 << 20  # bytes of command output kept (the tail)
MARK = "SKYRL_PROCESS_COMMAND"  # environment variable naming the command a process belongs to
DRAIN_S = 1.0  # seconds the output is still read for once the command's processes are killed


class ProcessSandbox:
    """One temporary directory; see the module docstring for the path mapping."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.id = f"process-{uuid.uuid4().hex[:12]}"
        self.spec = spec
        self.root = Path(tempfile.mkdtemp(prefix="skyrl-sbx-"))
        self._closed = False
        self.host_path(spec.workdir).mkdir(parents=True, exist_ok=True)
        self.host_path("/tmp").mkdir(exist_ok=True)

    def host_path(self, path: str) -> Path:
        """Where the sandbox path ``path`` (absolute, or relative to the workdir) lives on the host."""
        absolute = path if path.startswith("/") else f"{self.spec.workdir}/{path}"
        return self.root / absolute.lstrip("/")

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        """Run ``command`` with bash in the mapped workdir; its process group is killed at ``timeout_s``."""
        self._check_open()
        start = time.monotonic()
        # The interpreter running us goes first on PATH so that `python3` has the same packages (pytest).
        # TMPDIR: the sandbox's /tmp, so that "${TMPDIR:-/tmp}" in a command names what write_file("/tmp/…") wrote.
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        mark = uuid.uuid4().hex
        env = {**os.environ, **self.spec.env, "PATH": path, "TMPDIR": str(self.host_path("/tmp")), MARK: mark}
        # The pipe is ours, not asyncio's: Process.wait() then returns when bash exits, not when the last holder of
        # the pipe (a daemon) closes it.
        read_fd, write_fd = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                "bash", "-c", command, cwd=self.host_path(workdir or self.spec.workdir), env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, start_new_session=True,
            )  # fmt: skip
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        transport, tail = await _read_tail(read_fd, OUTPUT_CAP)
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
        finally:
            _kill_command(proc.pid, mark)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(tail.eof), DRAIN_S)
            transport.close()
        returncode = await proc.wait()  # at once: bash has exited or was killed
        code = -1 if timed_out else returncode
        text = tail.data.decode(errors="replace")
        return CommandResult(text, code, timed_out, tail.total > OUTPUT_CAP, time.monotonic() - start)

    async def read_file(self, path: str) -> bytes:
        """The content of ``path`` (``FileNotFoundError`` if absent)."""
        self._check_open()
        return self.host_path(path).read_bytes()

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace ``path`` with ``data``, creating parent directories."""
        self._check_open()
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)

    async def snapshot(self) -> Snapshot:
        """Copy the directory tree; :meth:`ProcessBackend.fork` starts sandboxes from the copy."""
        self._check_open()
        copy = Path(tempfile.mkdtemp(prefix="skyrl-snap-"))
        shutil.copytree(self.root, copy, dirs_exist_ok=True, symlinks=True)
        return Snapshot(backend="process", ref=str(copy))

    async def close(self) -> None:
        """Delete the directory; idempotent."""
        if not self._closed:
            self._closed = True
            shutil.rmtree(self.root, ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} was used after close()")


class _Tail(asyncio.Protocol):
    """The last ``cap`` bytes read from a pipe, how many were read in all, and a future set at end of file."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.total = 0
        self.eof: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        """Keep the tail."""
        self.total += len(data)
        self.data += data
        if len(self.data) > self.cap:
            del self.data[: -self.cap]

    def connection_lost(self, exc: Exception | None) -> None:
        """The pipe ended (every writer closed it) or was closed here."""
        if not self.eof.done():
            self.eof.set_result(None)


async def _read_tail(fd: int, cap: int) -> tuple[asyncio.ReadTransport, _Tail]:
    """Start reading the pipe ``fd`` (now owned by the returned transport) into a :class:`_Tail`."""
    pipe = os.fdopen(fd, "rb", buffering=0)
    return await asyncio.get_running_loop().connect_read_pipe(lambda: _Tail(cap), pipe)


def _kill_command(pgid: int, mark: str) -> None:
    """SIGKILL the process group ``pgid`` and every process whose environment has ``MARK=mark``, until none is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    needle = f"\0{MARK}={mark}\0".encode()
    for _ in range(100):  # a process forking as it is killed shows up in the next listing
        marked = [pid for pid in _pids() if needle in b"\0" + _environ(pid) + b"\0"]
        if not marked:
            return
        for pid in marked:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _environ(pid: int) -> bytes:
    """The environment ``pid`` was started with (empty for zombies and processes we may not read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            return file.read()
    except OSError:
        return b""


class ProcessBackend:
    """Creates :class:`ProcessSandbox` instances (``spec.image`` and resource limits are ignored)."""

    name = "process"

    async def create(self, spec: SandboxSpec) -> ProcessSandbox:
        """A fresh, empty sandbox."""
        return ProcessSandbox(spec)

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[Sandbox]:
        """``n`` sandboxes starting as copies of ``snapshot``."""
        sandboxes = [ProcessSandbox(spec) for _ in range(n)]
        for sandbox in sandboxes:
            shutil.copytree(snapshot.ref, sandbox.root, dirs_exist_ok=True, symlinks=True)
        return list(sandboxes)

    async def discard_snapshot(self, snapshot: Snapshot) -> None:
        """Delete the copy ``snapshot`` names; the sandboxes forked from it are copies of their own."""
        shutil.rmtree(snapshot.ref, ignore_errors=True)

    async def close(self) -> None:
        """Nothing to release: each sandbox deletes its own directory."""
