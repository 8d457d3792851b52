"""A test double of the sandbox protocol: host commands in a temporary directory. NOT ISOLATED.

:class:`InMemorySandbox` runs commands as the current host user, with the host's network and filesystem. It
exists so that agents and the dispatcher can be unit-tested without Docker; never give it untrusted commands.

It behaves like the real backends where tests look: the same command runner (``cd`` and ``export`` persist),
timeouts that kill the command's process group, capped output, a command's leftover processes killed (only
those: the runner's descendants), snapshots and forks (copies of the directory).
Relative paths (and the spec's ``workdir``) resolve inside the sandbox's temporary directory; absolute paths in
commands and file calls are host paths.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import sys
import tempfile
from pathlib import Path

from skyrl_agent.sandbox.base import CommandResult, SandboxClosedError, SandboxSpec, Snapshot
from skyrl_agent.sandbox.shell import DEFAULT_OUTPUT_CAP, PersistentShell

_ids = itertools.count()


class InMemorySandbox:
    """A host shell in ``root`` (a directory this sandbox owns and deletes on close). NOT isolated."""

    def __init__(self, root: Path, *, output_cap: int = DEFAULT_OUTPUT_CAP, env: dict[str, str] | None = None) -> None:
        self.id = f"memory-{os.getpid()}-{next(_ids)}"
        self.root = root
        self._env = {**os.environ, **(env or {})}
        self._shell = PersistentShell(
            [],  # a plain host process
            state_path=str(root.parent / "state"),
            output_cap=output_cap,
            env=self._env,
            python=sys.executable,  # the runner is standard library only
        )
        self._closed = False

    async def start(self) -> None:
        """Start the shell; called by :class:`InMemoryBackend`."""
        await self._shell.start(str(self.root))

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        """Run ``command`` in the host shell; the process group is killed at ``timeout_s`` seconds."""
        self._check_open()
        return await self._shell.run(command, timeout_s=timeout_s, workdir=self._path(workdir) if workdir else None)

    async def read_file(self, path: str) -> bytes:
        """The content of ``path`` (relative to the sandbox directory)."""
        self._check_open()
        return await asyncio.to_thread(Path(self._path(path)).read_bytes)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace ``path`` (relative to the sandbox directory), parents created."""
        self._check_open()
        target = Path(self._path(path))
        payload = data.encode() if isinstance(data, str) else data
        await asyncio.to_thread(_write, target, payload, mode)

    async def snapshot(self) -> Snapshot:
        """Copy the sandbox directory; the copy lives until the backend closes."""
        self._check_open()
        dest = Path(tempfile.mkdtemp(prefix="skyrl-memsnap-")) / "root"
        await asyncio.to_thread(shutil.copytree, self.root, dest, symlinks=True)
        return Snapshot(backend="memory", ref=str(dest))

    async def close(self) -> None:
        """Kill the shell and delete the directory; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._shell.close()
        await asyncio.to_thread(shutil.rmtree, self.root.parent, True)

    def _path(self, path: str) -> str:
        return str(self.root / path)  # an absolute ``path`` replaces the root: host paths, as documented

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"{self.id} was used after close()")


def _write(target: Path, data: bytes, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    target.chmod(mode)


class InMemoryBackend:
    """Creates :class:`InMemorySandbox` es (NOT isolated). ``spec.image`` is ignored; ``spec.env`` applies."""

    name = "memory"

    def __init__(self, *, output_cap: int = DEFAULT_OUTPUT_CAP) -> None:
        self._cap = output_cap
        self._snapshots: list[Path] = []

    async def create(self, spec: SandboxSpec | None = None, *, seed: Path | None = None) -> InMemorySandbox:
        """Start a sandbox in a fresh temporary directory (a copy of ``seed`` when given)."""
        spec = spec or SandboxSpec()
        root = Path(tempfile.mkdtemp(prefix="skyrl-mem-")) / "root"
        if seed is None:
            root.mkdir()
        else:
            await asyncio.to_thread(shutil.copytree, seed, root, symlinks=True)
        sandbox = InMemorySandbox(root, output_cap=self._cap, env=spec.env)
        await sandbox.start()
        return sandbox

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec | None = None) -> list[InMemorySandbox]:
        """``n`` sandboxes, each starting from a copy of ``snapshot``."""
        self._snapshots.append(Path(snapshot.ref).parent)
        return list(await asyncio.gather(*(self.create(spec, seed=Path(snapshot.ref)) for _ in range(n))))

    async def close(self) -> None:
        """Delete the snapshots this backend forked from."""
        for path in self._snapshots:
            await asyncio.to_thread(shutil.rmtree, path, True)
        self._snapshots.clear()
