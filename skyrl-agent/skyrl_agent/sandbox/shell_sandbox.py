"""What the sandboxes whose requests go through a :class:`~.shell.PersistentShell` (Docker, local) do alike.

:class:`ShellSandbox` holds the sandbox's shell and whether it was closed. Its ``run``, ``read_file`` and
``write_file`` refuse a closed sandbox (:class:`~.base.SandboxClosedError`, before anything is sent) and pass the
request to the shell, which enforces the timeout, the output cap and file limits inside the sandbox (:mod:`.shell`
says how); a relative path is taken from the spec's working directory. A subclass starts the shell, snapshots and
closes in its backend's way, sets ``_closed`` as its ``close`` begins, and may check more before each use by
extending :meth:`ShellSandbox._check_open` (Docker checks its backend's lease).
"""

from __future__ import annotations

from typing import ClassVar

from skyrl_agent.sandbox.base import CommandResult, SandboxClosedError, SandboxSpec, Snapshot
from skyrl_agent.sandbox.shell import PersistentShell

__all__ = ["ShellSandbox", "check_snapshot_backend"]


class ShellSandbox:
    """A sandbox's requests through its command runner.

    Args:
        sandbox_id: The sandbox's ``id``.
        spec: What it was started from (``workdir`` resolves relative paths).
        shell: Its command runner's host side; the subclass starts it and closes it in ``close``.
    """

    # The SandboxClosedError message; {id} is the sandbox's id.
    closed_message: ClassVar[str] = "{id} was used after close()"

    def __init__(self, sandbox_id: str, spec: SandboxSpec, shell: PersistentShell) -> None:
        self.id = sandbox_id
        self.spec = spec
        self._shell = shell
        self._closed = False  # no more use: set as close() begins

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        """Run ``command``; its process group is killed inside the sandbox at ``timeout_s`` seconds."""
        self._check_open()
        return await self._shell.run(command, timeout_s=timeout_s, workdir=workdir)

    async def read_file(self, path: str) -> bytes:
        """The bytes of ``path`` (relative paths from the workdir), read as the sandbox user."""
        self._check_open()
        return await self._shell.read_file(self._abs(path))

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace ``path`` as the sandbox user (``PermissionError`` outside writable places)."""
        self._check_open()
        payload = data.encode() if isinstance(data, str) else data
        await self._shell.write_file(self._abs(path), payload, mode)

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec.workdir.rstrip('/')}/{path}"

    def _check_open(self) -> None:
        """Raise :class:`SandboxClosedError` once ``close`` has begun; subclasses add their own checks."""
        if self._closed:
            raise SandboxClosedError(self.closed_message.format(id=self.id))


def check_snapshot_backend(snapshot: Snapshot, backend: str) -> None:
    """Refuse to fork ``snapshot`` in ``backend`` unless that backend made it.

    Raises:
        ValueError: ``snapshot.backend`` is another backend.
    """
    if snapshot.backend != backend:
        raise ValueError(f"a {snapshot.backend} snapshot cannot be forked by the {backend} backend")
