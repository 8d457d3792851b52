"""The sandbox protocol: an isolated machine an agent episode runs commands in.

A sandbox is owned by exactly one episode at a time. Every method is a coroutine (backends that block, such as
the Docker SDK, run their calls in threads) and ``close`` is idempotent and safe on every exit path.

Exceptions (``SandboxError`` tree) are infrastructure failures only: the daemon is unreachable, a container
could not start, the sandbox died. A command that fails, times out or floods its output is NOT an exception:
it is a :class:`CommandResult` the agent sees.

::

    SandboxError
    ├── SandboxStartError        creating or starting a sandbox failed (retryable)
    ├── SandboxUnavailableError  the backend itself is unreachable (e.g. no Docker daemon)
    └── SandboxClosedError       the sandbox was used after close()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

MODEL_SOCKET_MOUNT = "/run/skyrl-model"  # where a sandbox sees the directory of SandboxSpec.model_socket_dir


class SandboxError(RuntimeError):
    """An infrastructure failure of a sandbox or its backend; the message says what failed and what to do."""


class SandboxStartError(SandboxError):
    """A sandbox could not be created or started."""


class SandboxUnavailableError(SandboxError):
    """The backend cannot be reached (e.g. no Docker engine)."""


class SandboxClosedError(SandboxError):
    """The sandbox was used after it was closed."""


@dataclass(frozen=True)
class SandboxSpec:
    """What to start: the image and the limits every command runs under."""

    image: str = "skyrl-sandbox:base"
    workdir: str = "/workspace"
    user: str = "sandbox"  # commands run as this non-root user
    memory_mb: int = 1024
    cpus: float = 1.0
    pids_limit: int = 256  # processes at most (fork bombs stop here)
    network: bool = False  # no network unless asked for
    # A host directory holding the unix socket to the episode's model server (.session_socket), mounted read-only at
    # MODEL_SOCKET_MOUNT by a backend that says ``mounts_model_socket``; the sandbox still has no network.
    model_socket_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # e.g. run and episode ids, for the reaper


@dataclass(frozen=True)
class CommandResult:
    """What one command did. ``output`` is stdout and stderr interleaved, capped at the sandbox's limit."""

    output: str
    exit_code: int  # -1 when the command was killed at its timeout
    timed_out: bool = False
    truncated: bool = False  # the output hit the cap and was cut
    duration_s: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    """An opaque handle to a sandbox's filesystem state, from which ``fork`` starts new sandboxes."""

    backend: str  # the backend that made it ("docker", "local", …)
    ref: str  # backend-specific: an image id, a directory, …


@runtime_checkable
class Sandbox(Protocol):
    """One isolated machine. Timeouts are in seconds and enforced inside the sandbox."""

    id: str

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        """Run a shell command; its whole process group is killed at ``timeout_s``."""
        ...

    async def read_file(self, path: str) -> bytes:
        """The content of ``path`` (``FileNotFoundError`` if absent)."""
        ...

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace ``path`` (parents created) with ``data``."""
        ...

    async def snapshot(self) -> Snapshot:
        """Capture the filesystem state for :meth:`SandboxBackend.fork`."""
        ...

    async def close(self) -> None:
        """Stop and remove the sandbox; idempotent."""
        ...


@runtime_checkable
class ExpiringSandbox(Protocol):
    """A sandbox its backend ends on its own once it is not kept alive (a lifetime; hosted platforms have one).

    The dispatcher says how long it still needs the sandbox at each point where that changes (started, run slot,
    grade slot, resumed after a pause); the backend must not end it sooner. Seconds are wall seconds from now.
    """

    def keep_alive(self, seconds: float) -> None:
        """Do not end this sandbox for at least ``seconds`` from now (an earlier promise is never shortened)."""
        ...


@runtime_checkable
class SandboxBackend(Protocol):
    """Creates sandboxes (and their forks) of one kind."""

    name: str

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox from ``spec`` and return it ready for commands."""
        ...

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[Sandbox]:
        """Start ``n`` sandboxes whose filesystems begin as ``snapshot``."""
        ...

    async def close(self) -> None:
        """Release the backend's resources (pools, snapshots it made); idempotent."""
        ...
