"""One sandbox host: the body of the Ray actor that :mod:`.ray_hosts` starts on each sandbox node.

A :class:`SandboxHost` owns an inner backend of its node (``docker``, ``local`` or ``process``, made by
:func:`~skyrl_agent.sandbox.backends.make_machine_backend`) and the sandboxes it made, by the key the driver gave
each one.
Its methods are coroutines, so Ray runs it as an async actor: the commands of many sandboxes run at once.

Exceptions of the inner backend and sandboxes (``SandboxError``, ``FileNotFoundError``, …) go back to the driver
as they were raised. A sandbox whose driver gave up on it while it was being made (``close`` of a key that is not
open yet) is closed as soon as it exists, so that nothing the driver no longer knows of stays open.

This module imports no Ray: the driver wraps the class with ``ray.remote`` at run time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Sequence

from skyrl_agent.sandbox.backends import MACHINE_BACKENDS, make_machine_backend
from skyrl_agent.sandbox.base import CommandResult, Sandbox, SandboxBackend, SandboxClosedError, SandboxSpec, Snapshot

__all__ = ["INNER_BACKENDS", "SandboxHost", "expires_in"]

log = logging.getLogger(__name__)

INNER_BACKENDS = tuple(MACHINE_BACKENDS)  # what a host may run; process is NOT isolated (trusted tasks only)


class SandboxHost:
    """The sandboxes of one node, served by key (see the module docstring).

    Args:
        inner: The backend this host creates sandboxes with: one of :data:`INNER_BACKENDS`.
        run_id: The run's id (the Docker backend labels its containers with it).
        lifetime_s: How long an unclosed Docker sandbox may live (``None``: no lifetime).
        make_inner: Makes the inner backend instead (``inner`` is then ignored): a modelled backend for simulated
            hosts, as the scale benchmark runs. Ray pickles it to the host's node, so it must be importable there.
    """

    def __init__(
        self,
        inner: str,
        run_id: str | None,
        lifetime_s: float | None,
        make_inner: Callable[[], SandboxBackend] | None = None,
    ) -> None:
        if make_inner is not None:
            self.backend: SandboxBackend = make_inner()
        elif inner in INNER_BACKENDS:
            self.backend = make_machine_backend(inner, run_id=run_id, lifetime_s=lifetime_s)
        else:
            raise ValueError(f"a sandbox host runs one of {', '.join(INNER_BACKENDS)}, not {inner!r}")
        self.sandboxes: dict[str, Sandbox] = {}
        self.abandoned: set[str] = set()  # keys the driver closed before their sandbox existed

    async def ready(self) -> tuple[str, int]:
        """The inner backend's name and this process's id, once the actor has started."""
        return self.backend.name, os.getpid()

    async def held(self) -> int:
        """How many sandboxes this host holds open (what a run left behind, once its episodes are done)."""
        return len(self.sandboxes)

    async def create(self, key: str, spec: SandboxSpec) -> tuple[str, float | None]:
        """Start a sandbox from ``spec``, held under ``key``; returns its id and :func:`expires_in`.

        The driver sends a promise (an actor call) only when the sandbox would otherwise end before it is needed.
        """
        return await self._hold(key, await self.backend.create(spec))

    async def fork(self, snapshot: Snapshot, keys: Sequence[str], spec: SandboxSpec) -> list[tuple[str, float | None]]:
        """Start one sandbox per key from ``snapshot`` (one the inner backend made); as :meth:`create`, per key."""
        sandboxes = await self.backend.fork(snapshot, len(keys), spec)
        return [await self._hold(key, sandbox) for key, sandbox in zip(keys, sandboxes, strict=True)]

    async def run(self, key: str, command: str, timeout_s: float, workdir: str | None) -> CommandResult:
        """:meth:`Sandbox.run` of the sandbox held under ``key``."""
        return await self._get(key).run(command, timeout_s=timeout_s, workdir=workdir)

    async def read_file(self, key: str, path: str) -> bytes:
        """:meth:`Sandbox.read_file` of the sandbox held under ``key``."""
        return await self._get(key).read_file(path)

    async def write_file(self, key: str, path: str, data: bytes | str, mode: int) -> None:
        """:meth:`Sandbox.write_file` of the sandbox held under ``key``."""
        await self._get(key).write_file(path, data, mode=mode)

    async def snapshot(self, key: str) -> Snapshot:
        """The inner backend's snapshot of the sandbox held under ``key``."""
        return await self._get(key).snapshot()

    async def discard_snapshot(self, snapshot: Snapshot) -> None:
        """Let the inner backend delete ``snapshot`` now, where it can (otherwise its ``close`` does)."""
        discard = getattr(self.backend, "discard_snapshot", None)
        if callable(discard):
            await discard(snapshot)

    async def keep_alive(self, key: str, seconds: float) -> None:
        """Pass the promise on to a sandbox that expires on its own (Docker with a lifetime); else nothing."""
        keep_alive = getattr(self.sandboxes.get(key), "keep_alive", None)
        if callable(keep_alive):
            keep_alive(seconds)

    async def close(self, key: str) -> None:
        """Close the sandbox held under ``key``; a key not open yet is closed as soon as its sandbox exists."""
        sandbox = self.sandboxes.pop(key, None)
        if sandbox is None:
            self.abandoned.add(key)
            return
        await sandbox.close()

    async def shutdown(self) -> None:
        """Close every sandbox still held, then the inner backend."""
        held, self.sandboxes = list(self.sandboxes.values()), {}
        results = await asyncio.gather(*(sandbox.close() for sandbox in held), return_exceptions=True)
        for sandbox, result in zip(held, results, strict=True):
            if isinstance(result, BaseException):  # one failed close must not keep the others (and the backend) open
                log.warning("closing sandbox %s on shutdown failed: %r", sandbox.id, result)
        await self.backend.close()

    async def _hold(self, key: str, sandbox: Sandbox) -> tuple[str, float | None]:
        if key in self.abandoned:
            self.abandoned.discard(key)
            await sandbox.close()
        else:
            self.sandboxes[key] = sandbox
        return sandbox.id, expires_in(sandbox)

    def _get(self, key: str) -> Sandbox:
        try:
            return self.sandboxes[key]
        except KeyError:
            raise SandboxClosedError(f"sandbox {key} is not open on this host (closed, or never made)") from None


def expires_in(sandbox: Sandbox) -> float | None:
    """Seconds until ``sandbox`` ends on its own unless promised more; ``None`` if it never does.

    A sandbox with ``keep_alive`` but no ``expires_at`` (its end unknown here) counts as ending now.
    """
    if not callable(getattr(sandbox, "keep_alive", None)):
        return None
    expires_at = getattr(sandbox, "expires_at", None)
    if expires_at is None:
        return 0.0
    return None if math.isinf(expires_at) else max(expires_at - time.monotonic(), 0.0)
