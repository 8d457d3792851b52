"""A sandbox backend of plain subprocesses in temporary directories: fast, and NOT isolated.

Each sandbox is a fresh temporary directory standing in for the root filesystem: an absolute sandbox path such as
``/workspace/x.py`` maps to ``<tmp>/workspace/x.py`` and commands run there with ``bash``. Commands see the host
(network, files, processes), so use it only for trusted code, such as validating the shipped task suite or tests.
Commands must use paths relative to their ``workdir``.
"""

from __future__ import annotations

import asyncio
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
        env = {**os.environ, **self.spec.env, "PATH": path, "TMPDIR": str(self.host_path("/tmp"))}
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=self.host_path(workdir or self.spec.workdir), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
            timed_out = False
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = await proc.communicate()
            timed_out = True
        text = out[-OUTPUT_CAP:].decode(errors="replace")
        code = -1 if timed_out else (proc.returncode if proc.returncode is not None else -1)
        return CommandResult(text, code, timed_out, len(out) > OUTPUT_CAP, time.monotonic() - start)

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

    async def close(self) -> None:
        """Nothing to release: each sandbox deletes its own directory."""
