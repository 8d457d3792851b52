"""One prepared sandbox per GRPO group: the group's other samples start as forks of its snapshot.

The ``n`` samples of one prompt need the same starting sandbox (the task's image with its workspace written and
committed). Instead of ``n`` creates and ``n`` preparations, :class:`GroupForks` does one of each::

    first acquire of group g    create → prepare (workspace) → snapshot     (the "share", once per group)
                                the prepared sandbox itself serves this sample
    later acquires of group g   wait for the share, then backend.fork(snapshot, 1, spec)
    g's last sample released    discard the snapshot, where the backend can (``discard_snapshot``)

Every sample still owns its own sandbox: a fork starts as a copy of the snapshot, and the snapshot is taken before
the prepared sandbox is handed out, so no sample sees another's writes.

Failures:

- the share raising :class:`~.base.SandboxError` (create, prepare or snapshot): every sample waiting for it gets
  that error (the dispatcher retries it as infrastructure); the group is forgotten, so a retry prepares afresh;
- ``prepare`` raising anything else (e.g. a task whose repository cannot be written): the prepared sandbox is
  closed and each sample starts independently, meeting that error where it always did (its own preparation);
- a fork failing: :class:`~.base.SandboxStartError` (infrastructure) for that sample only;
- a backend that cannot snapshot or fork (``NotImplementedError``, or not in :data:`FORKING_BACKENDS`): samples
  start independently and prepare their own workspace.

A sample that starts independently gets ``Started.base`` None: its caller prepares the workspace itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from skyrl_agent.sandbox.base import Sandbox, SandboxBackend, SandboxError, SandboxSpec, SandboxStartError, Snapshot
from skyrl_agent.spans import SpanRecorder, span_on

__all__ = ["FORKING_BACKENDS", "GroupForks", "PrepareFn", "Started", "can_fork", "group_of"]

log = logging.getLogger(__name__)

# Backends whose ``fork`` starts sandboxes from a snapshot of their own (the in-memory and process ones copy a
# directory; docker commits an image, ≈0.2 s a fork; local stacks an overlay layer, ≈20 ms a fork).
FORKING_BACKENDS = frozenset({"docker", "local", "process", "memory"})

PrepareFn = Callable[[Sandbox], Awaitable[str]]
"""Prepares a fresh sandbox for a sample (writes the workspace); returns its base commit."""


def can_fork(backend: SandboxBackend) -> bool:
    """Whether ``backend`` is one whose snapshots and forks :class:`GroupForks` may rely on."""
    return getattr(backend, "name", None) in FORKING_BACKENDS and callable(getattr(backend, "fork", None))


def group_of(trajectory_id: str) -> str:
    """The group of a skyrl-train trajectory id ``"<prompt uid>:<sample k>"``: the prompt uid."""
    return trajectory_id.rsplit(":", 1)[0]


@dataclass(frozen=True)
class Started:
    """A sample's sandbox, and the base commit of its prepared workspace (None: the caller prepares it)."""

    sandbox: Sandbox
    base: str | None


@dataclass(frozen=True)
class _Share:
    """What a group's preparation left: the prepared sandbox, its snapshot and its workspace's base commit.

    ``base`` None: preparation failed for a reason of the task's (the sandbox is closed; samples start alone).
    ``snapshot`` None: the backend cannot snapshot (only the prepared sandbox is shared: with its first sample).
    """

    sandbox: Sandbox
    snapshot: Snapshot | None
    base: str | None
    spec: SandboxSpec
    seconds: float


@dataclass
class _Group:
    share: asyncio.Future[_Share]
    size: int | None  # samples in the group, when known
    arrived: int = 0  # acquires of the group's samples so far
    pending: int = 0  # acquires in flight (a fork may still need the snapshot)
    open: set[str] = field(default_factory=set)  # ids of the group's sandboxes not yet released
    fork_s: float = 0.0
    done: bool = False  # every sample has come: later acquires (retries) start alone
    discarded: bool = False


class GroupForks:
    """Sandboxes for the samples of GRPO groups, forked from one prepared sandbox per group (module docstring).

    Args:
        backend: Creates and forks the sandboxes; the caller owns it (its ``close`` removes what is left).
        sizes: Samples per group, where known: once all of a group's samples have started and released their
            sandboxes, its snapshot is discarded (on a backend with ``discard_snapshot``). A group of one starts
            alone (a snapshot would serve nobody).
        spans: Records each group's preparation (``sandbox/prepare_group``) and each fork (``sandbox/fork``).

    Attributes:
        setup_s: Per group whose preparation finished, the seconds its sandboxes took to set up: the share
            (create, prepare, snapshot) plus every fork. Samples that started alone are not counted.
    """

    def __init__(
        self, backend: SandboxBackend, *, sizes: Mapping[str, int] | None = None, spans: SpanRecorder | None = None
    ) -> None:
        self.backend, self.spans = backend, spans
        self.sizes = dict(sizes or {})
        self.setup_s: dict[str, float] = {}
        self._forkable = can_fork(backend)
        self._groups: dict[str, _Group] = {}
        self._owners: dict[str, str] = {}  # sandbox id → its group
        self._orphans: set[asyncio.Future[None]] = set()  # closes of prepared sandboxes nobody claimed

    async def acquire(self, group: str, spec: SandboxSpec, prepare: PrepareFn) -> Started:
        """A sandbox for one sample of ``group``: the prepared one, a fork of it, or (fallback) a fresh one.

        Raises:
            SandboxError: Creating, preparing or snapshotting the group's sandbox failed (every waiting sample
                gets it), or this sample's fork failed.
        """
        state = self._groups.get(group)
        starter = state is None
        if state is None:
            if not self._forkable or self.sizes.get(group) == 1:
                return await self._alone(spec)
            share = asyncio.ensure_future(self._prepare(spec, prepare))  # not the starter's: waiters need it too
            state = self._groups[group] = _Group(share, self.sizes.get(group))
        elif state.done:
            return await self._alone(spec)
        state.arrived += 1
        state.done = state.size is not None and state.arrived >= state.size
        state.pending += 1
        try:
            return await (self._first(group, state, spec) if starter else self._fork(group, state, spec))
        finally:
            state.pending -= 1
            await self._settle(state)

    async def released(self, sandbox: Sandbox) -> None:
        """Note that ``sandbox`` was closed; the group's snapshot goes once it is done and none of its are open."""
        group = self._owners.pop(sandbox.id, None)
        state = self._groups.get(group) if group is not None else None
        if state is not None:
            state.open.discard(sandbox.id)
            await self._settle(state)

    async def close(self) -> None:
        """Wait for preparations in flight, close prepared sandboxes nobody claimed, discard every snapshot."""
        for state in self._groups.values():
            state.done = True
            with contextlib.suppress(Exception):
                await asyncio.shield(state.share)
            await self._discard(state)
        if self._orphans:
            await asyncio.gather(*self._orphans, return_exceptions=True)

    # -- the share ----------------------------------------------------------------------------------------

    async def _prepare(self, spec: SandboxSpec, prepare: PrepareFn) -> _Share:
        """Create, prepare and snapshot the group's sandbox (see :class:`_Share` for what a failure leaves)."""
        start = time.monotonic()
        with span_on(self.spans, "sandbox", "prepare_group"):
            sandbox = await self.backend.create(spec)
            try:
                base = await prepare(sandbox)
            except Exception as exc:
                await sandbox.close()
                if isinstance(exc, SandboxError):
                    raise
                log.info("preparing a group's shared sandbox failed (%r); its samples start alone", exc)
                return _Share(sandbox, None, None, spec, time.monotonic() - start)
            except BaseException:
                await sandbox.close()
                raise
            snapshot = await self._snapshot(sandbox)
        return _Share(sandbox, snapshot, base, spec, time.monotonic() - start)

    async def _snapshot(self, sandbox: Sandbox) -> Snapshot | None:
        try:
            return await sandbox.snapshot()
        except NotImplementedError:
            self._forkable = False
            return None
        except BaseException as exc:
            await sandbox.close()
            if isinstance(exc, Exception) and not isinstance(exc, SandboxError):
                raise SandboxError(f"snapshotting a group's prepared sandbox failed: {exc!r}") from exc
            raise

    async def _share(self, group: str, state: _Group) -> _Share:
        """The group's share once ready; its failure (every waiter gets it) forgets the group, for retries."""
        try:
            share = await asyncio.shield(state.share)
        except Exception:
            if self._groups.get(group) is state:
                del self._groups[group]
            raise
        if share.base is not None:
            self.setup_s.setdefault(group, share.seconds)
        return share

    # -- handing out sandboxes ----------------------------------------------------------------------------

    async def _first(self, group: str, state: _Group, spec: SandboxSpec) -> Started:
        """The sample that started the share gets the prepared sandbox itself."""
        try:
            share = await self._share(group, state)
        except asyncio.CancelledError:
            state.share.add_done_callback(self._close_unclaimed)
            raise
        if share.base is None:
            return await self._alone(spec)
        return self._claim(group, state, share.sandbox, share.base)

    async def _fork(self, group: str, state: _Group, spec: SandboxSpec) -> Started:
        share = await self._share(group, state)
        snapshot = share.snapshot
        if not self._forkable or snapshot is None or share.base is None or not _same_start(spec, share.spec):
            return await self._alone(spec)
        start = time.monotonic()
        try:
            with span_on(self.spans, "sandbox", "fork"):
                (sandbox,) = await self.backend.fork(snapshot, 1, spec)
        except NotImplementedError:
            self._forkable = False
            return await self._alone(spec)
        except SandboxError:
            raise
        except Exception as exc:  # a fork is a sandbox start: its failure is the infrastructure's
            raise SandboxStartError(f"forking the prepared sandbox of group {group} failed: {exc!r}") from exc
        state.fork_s += time.monotonic() - start
        self.setup_s[group] = share.seconds + state.fork_s
        return self._claim(group, state, sandbox, share.base)

    def _claim(self, group: str, state: _Group, sandbox: Sandbox, base: str) -> Started:
        state.open.add(sandbox.id)
        self._owners[sandbox.id] = group
        return Started(sandbox, base)

    async def _alone(self, spec: SandboxSpec) -> Started:
        return Started(await self.backend.create(spec), None)

    def _close_unclaimed(self, share: asyncio.Future[_Share]) -> None:
        """The share's starter was cancelled: close the prepared sandbox it would have got, once it exists."""
        if share.cancelled() or share.exception() is not None:
            return
        closing = asyncio.ensure_future(share.result().sandbox.close())
        self._orphans.add(closing)
        closing.add_done_callback(self._orphans.discard)

    async def _settle(self, state: _Group) -> None:
        """Discard the group's snapshot once all its samples came, none is still starting and none is open."""
        if state.done and not state.pending and not state.open:
            await self._discard(state)

    async def _discard(self, state: _Group) -> None:
        """Let the backend drop the group's snapshot, if it can (otherwise its ``close`` removes it)."""
        if state.discarded or not state.share.done() or state.share.cancelled() or state.share.exception():
            return
        state.discarded = True
        snapshot = state.share.result().snapshot
        discard = getattr(self.backend, "discard_snapshot", None)
        if snapshot is None or discard is None:
            return
        try:
            await discard(snapshot)
        except Exception as exc:  # the backend's close removes it in the end; the samples are not affected
            log.warning("discarding snapshot %s failed: %r", snapshot.ref, exc)


def _same_start(spec: SandboxSpec, shared: SandboxSpec) -> bool:
    """Whether a sample of ``spec`` may start from a snapshot of a sandbox of ``shared`` (same image and workdir)."""
    return (spec.image, spec.workdir) == (shared.image, shared.workdir)
