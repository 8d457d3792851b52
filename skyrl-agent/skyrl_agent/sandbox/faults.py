"""Fault injection for sandbox backends: sandboxes that crash, commands that hang, daemon calls that fail.

Two wrappers, each doing one thing, with seeded probabilities:

- :class:`FaultyBackend` wraps any :class:`~skyrl_agent.sandbox.base.SandboxBackend`. A fraction of its sandboxes
  *crash* mid-episode: with their k-th command the wrapper calls ``crash(sandbox)`` (for Docker: kill the
  container from the host), so that command or the next meets a dead sandbox. A fraction of commands *hang*:
  the command is replaced by a ``sleep`` past its timeout, which the sandbox must kill at ``timeout_s``.
- :class:`FlakyCalls` wraps a client object (e.g. a ``docker.DockerClient``): a fraction of its method calls,
  and of the calls of the objects they return, raise the error the real client raises when the daemon fails,
  instead of reaching the daemon.

Decisions about a sandbox come from a generator seeded by ``(seed, key, n)``: ``key`` names what the sandbox is
for (an episode id) and ``n`` counts the sandboxes created for that key, so a retry draws afresh and a run
injects the same faults into the same episodes whatever the order their sandboxes start in. :class:`FlakyCalls`
draws from one generator in call order (calls come from many threads; the count, not the place, is stable).
What was injected is counted in ``injected``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from skyrl_agent.sandbox.base import CommandResult, Sandbox, SandboxBackend, SandboxSpec, Snapshot

__all__ = ["FaultPlan", "FaultyBackend", "FaultySandbox", "FlakyCalls"]

log = logging.getLogger(__name__)

CrashFn = Callable[[Sandbox], Awaitable[None]]
"""Ends a sandbox from outside, the way infrastructure fails (e.g. ``docker kill`` of its container)."""


@dataclass(frozen=True)
class FaultPlan:
    """How often each fault happens. Probabilities are per sandbox (crash) or per command (hang)."""

    seed: int = 0
    crash_p: float = 0.0  # fraction of sandboxes ended from outside mid-episode
    crash_at: tuple[int, int] = (2, 3)  # the crash comes with the k-th command, k uniform in this range (1-based)
    hang_p: float = 0.0  # fraction of commands replaced by a sleep past their timeout
    hang_extra_s: float = 30.0  # how far past its timeout a hung command would sleep

    def __post_init__(self) -> None:
        for name in ("crash_p", "hang_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"FaultPlan.{name} must be a probability in [0, 1], got {getattr(self, name)}")
        low, high = self.crash_at
        if not 1 <= low <= high:
            raise ValueError(f"FaultPlan.crash_at must be (low, high) with 1 <= low <= high, got {self.crash_at}")


class FaultySandbox:
    """A sandbox whose commands may hang and which may crash with its ``crash_at``-th command (None: never)."""

    def __init__(
        self,
        inner: Sandbox,
        plan: FaultPlan,
        rng: random.Random,
        crash: CrashFn | None,
        counts: collections.Counter[str],
    ) -> None:
        self.inner = inner
        self._plan, self._rng, self._crash, self._counts = plan, rng, crash, counts
        self.crash_at = rng.randint(*plan.crash_at) if crash is not None and rng.random() < plan.crash_p else None
        self.commands = 0

    @property
    def id(self) -> str:  # noqa: D102 (the protocol's)
        return self.inner.id

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        """Run ``command`` (or a sleep past ``timeout_s`` instead); the crash, when due, comes while it runs."""
        self.commands += 1
        if self._rng.random() < self._plan.hang_p:
            self._counts["hang"] += 1
            command = f"sleep {timeout_s + self._plan.hang_extra_s:g}"
        if self.commands != self.crash_at:
            return await self.inner.run(command, timeout_s=timeout_s, workdir=workdir)
        assert self._crash is not None  # crash_at is set only with a crash function
        self._counts["crash"] += 1
        crashing = asyncio.ensure_future(self._crash_quietly())
        try:
            return await self.inner.run(command, timeout_s=timeout_s, workdir=workdir)
        finally:
            await crashing  # the sandbox is dead before the episode goes on

    async def read_file(self, path: str) -> bytes:  # noqa: D102
        return await self.inner.read_file(path)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:  # noqa: D102
        await self.inner.write_file(path, data, mode=mode)

    async def snapshot(self) -> Snapshot:  # noqa: D102
        return await self.inner.snapshot()

    async def close(self) -> None:  # noqa: D102
        await self.inner.close()

    async def _crash_quietly(self) -> None:
        # A crash that could not be injected is counted, not raised: the episode did not cause it.
        assert self._crash is not None
        try:
            await self._crash(self.inner)
        except Exception as exc:
            self._counts["crash_failed"] += 1
            log.warning("injecting a crash into sandbox %s failed: %r", self.inner.id, exc)


class FaultyBackend:
    """Wraps ``inner`` so that its sandboxes fail as ``plan`` says.

    Args:
        inner: Creates the real sandboxes (and closes them: the wrapper owns nothing).
        plan: Fault probabilities and the seed.
        crash: Ends a sandbox from outside; without it no sandbox crashes.
    """

    def __init__(self, inner: SandboxBackend, plan: FaultPlan, *, crash: CrashFn | None = None) -> None:
        self.inner, self.plan, self._crash = inner, plan, crash
        self.name = inner.name
        self.injected: collections.Counter[str] = collections.Counter()
        self._created: collections.Counter[str] = collections.Counter()

    async def create(self, spec: SandboxSpec, *, key: str | None = None, **kwargs: Any) -> FaultySandbox:
        """A sandbox of ``inner`` (``kwargs`` go to its ``create``) whose faults are drawn for ``key``."""
        return self._wrap(await self.inner.create(spec, **kwargs), key)

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[FaultySandbox]:  # noqa: D102
        return [self._wrap(sandbox, None) for sandbox in await self.inner.fork(snapshot, n, spec)]

    async def close(self) -> None:  # noqa: D102
        await self.inner.close()

    def _wrap(self, sandbox: Sandbox, key: str | None) -> FaultySandbox:
        key = key or "sandbox"
        self._created[key] += 1
        rng = random.Random(f"{self.plan.seed}:{key}:{self._created[key]}")
        return FaultySandbox(sandbox, self.plan, rng, self._crash, self.injected)


class FlakyCalls:
    """A proxy of ``target`` whose method calls fail with probability ``p``, raising ``error(name)`` instead.

    Attributes are passed through; those that ``wrap`` accepts (and what methods return that it accepts) are
    proxied in turn, sharing the generator and the count (``injected["daemon_error"]``; ``calls`` counts every
    proxied call). Keep ``wrap`` to the client's own model objects: a proxied socket or stream is no longer one.

    Args:
        target: The object to proxy.
        p: Probability that a call fails.
        error: The exception a failed call raises, from the call's dotted name.
        rng: Decides which calls fail.
        wrap: Which attributes and return values to proxy too.
    """

    def __init__(
        self,
        target: Any,
        *,
        p: float,
        error: Callable[[str], BaseException],
        rng: random.Random,
        wrap: Callable[[Any], bool] = lambda value: False,
        name: str | None = None,
        _shared: tuple[collections.Counter[str], threading.Lock] | None = None,
    ) -> None:
        self._target, self._p, self._error, self._rng, self._wrap = target, p, error, rng, wrap
        self._name = name or type(target).__name__
        # Proxies made from this one share its count and lock (their calls come from many threads).
        self.injected, self._lock = _shared or (collections.Counter(), threading.Lock())

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        name = f"{self._name}.{attr}"
        if inspect.ismethod(value) or inspect.isfunction(value) or inspect.isbuiltin(value):
            return self._method(name, value)
        return self._proxy(value, name)

    def __repr__(self) -> str:
        return f"FlakyCalls({self._target!r}, p={self._p})"

    def _method(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.injected["calls"] += 1
                fail = self._rng.random() < self._p
                if fail:
                    self.injected["daemon_error"] += 1
            if fail:
                raise self._error(name)
            result = method(*args, **kwargs)
            return self._proxy(result, type(result).__name__)

        return call

    def _proxy(self, value: Any, name: str) -> Any:
        if not self._wrap(value):
            return value
        shared = (self.injected, self._lock)
        return FlakyCalls(
            value, p=self._p, error=self._error, rng=self._rng, wrap=self._wrap, name=name, _shared=shared
        )
