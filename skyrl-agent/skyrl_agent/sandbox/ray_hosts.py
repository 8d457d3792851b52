"""Sandbox hosts placed by Ray: sandboxes on the nodes of a Ray cluster that offer the resource ``sandbox_host``.

::

    driver (the dispatcher's process)                      each node offering {"sandbox_host": 1}
    RayHostBackend.create(spec) ── placement ──▶ SandboxHost actor ── inner backend (docker | local | process)
    RaySandbox.run(...) ─── await actor.run.remote(key, …) ───▶ the sandbox the actor holds under key

* One :class:`~.ray_host_actor.SandboxHost` actor per live node whose resources include
  ``RayHostSettings.resource``, pinned there (node affinity; it asks for no CPU: its sandboxes have their own
  limits). Each makes its sandboxes with the inner backend ``RayHostSettings.inner`` of its node.
* ``create`` places a sandbox on the live host that holds the fewest (each holds ``max_sandboxes`` at most);
  ``fork`` goes to the host that made the snapshot (the snapshot's ``ref`` names its node). When every place is
  taken, a start waits for one to free (``place_wait_s`` at most): the dispatcher may ask for more sandboxes at
  once (episodes, their graders, prefetched starts) than the hosts hold, and a wait costs nothing where an error
  would be retried, counted against the circuit breaker, and end as an infrastructure failure.
* A :class:`RaySandbox` is the driver's handle: each method awaits the owning actor. Exceptions of the inner
  sandbox (``SandboxError``, ``FileNotFoundError``, …) reach the caller as they were raised on the host.

Failures. When a host's actor or node dies (Ray raises a ``RayActorError``: ``ActorDiedError``, or
``ActorUnavailableError`` while Ray cannot reach it), every call on its sandboxes raises
:class:`SandboxHostLostError`, a ``SandboxUnavailableError``: an infrastructure failure that the dispatcher
retries on a new sandbox, never a reward of 0. A host Ray reports dead takes no new sandbox, and ``close`` of one
of its sandboxes does nothing and raises nothing. What a dead node held is left to the rules already in place:
its Docker containers belong to that host's ``DockerBackend`` lease, which nobody renews any more, so a reaper on
that node's daemon (a run starting there, ``skyrl-agent reap``) removes them once the lease's ttl has passed, and
each container's dead-man timer ends it regardless; ``local`` and ``process`` sandboxes are directories of that
node's temporary directory.

Ray. A process where Ray is already initialised (a skyrl-train run) uses that cluster. Otherwise
``RayHostSettings.address`` names the cluster to join, else ``RAY_ADDRESS``, else a new local cluster starts whose
one node offers the resource (so one machine works unchanged); :meth:`RayHostBackend.close` shuts down a cluster
the backend started. Ray is optional for skyrl-agent: it is imported when a backend is made (:func:`import_ray`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from skyrl_agent.sandbox.base import (
    CommandResult,
    Sandbox,
    SandboxBackend,
    SandboxClosedError,
    SandboxSpec,
    SandboxStartError,
    SandboxUnavailableError,
    Snapshot,
)
from skyrl_agent.sandbox.ray_host_actor import INNER_BACKENDS, SandboxHost

__all__ = [
    "RayHostBackend",
    "RayHostSettings",
    "RaySandbox",
    "SandboxHostLostError",
    "connect_ray",
    "host_nodes",
    "import_ray",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayHostSettings:
    """Where sandboxes run and how many.

    Raises:
        ValueError: a field is out of range; the message names every such field.
    """

    address: str | None = None  # the Ray cluster to join (ray.address); None: RAY_ADDRESS, else a new local one
    resource: str = "sandbox_host"  # the custom Ray resource that makes a node a sandbox host
    inner: str = "docker"  # what each host runs: docker, local, or process (NOT isolated: trusted tasks only)
    max_sandboxes: int = 32  # sandboxes one host holds at once
    start_timeout_s: float = 120.0  # how long the host actors may take to start (an image pull, a rootfs export)
    place_wait_s: float = 300.0  # how long a sandbox start waits for a free place when every host is full

    def __post_init__(self) -> None:
        problems = []
        if self.inner not in INNER_BACKENDS:
            problems.append(f"inner must be one of {', '.join(INNER_BACKENDS)}, got {self.inner!r}")
        if self.max_sandboxes < 1:
            problems.append(f"max_sandboxes must be at least 1, got {self.max_sandboxes}")
        if self.start_timeout_s <= 0:
            problems.append(f"start_timeout_s must be a positive number of seconds, got {self.start_timeout_s:g}")
        if self.place_wait_s < 0:
            problems.append(f"place_wait_s must be 0 or more seconds, got {self.place_wait_s:g}")
        if problems:
            raise ValueError("; ".join(problems))


class SandboxHostLostError(SandboxUnavailableError):
    """The host of a sandbox is gone (its actor or node died, or Ray cannot reach it); retry on a new sandbox."""


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ImportError: Ray is not installed; the message says ``pip install ray``.
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"the ray sandbox backend needs Ray ({exc}): pip install ray") from exc
    return ray


def connect_ray(address: str | None = None, resource: str = "sandbox_host") -> bool:
    """Join Ray unless this process already has: ``address``, else ``RAY_ADDRESS``, else a new local cluster.

    A new local cluster's node offers one ``resource``, so that it is a sandbox host. Returns whether this call
    started Ray (the caller then shuts it down).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    # "local": a fresh cluster of this machine, never one another process happens to have started.
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    options: dict[str, Any] = {"resources": {resource: 1}} if address == "local" else {}
    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False, **options)
    return True


def host_nodes(resource: str = "sandbox_host") -> list[str]:
    """The ids (hex) of the live nodes of the cluster whose resources include ``resource``."""
    nodes: list[dict[str, Any]] = import_ray().nodes()
    return [node["NodeID"] for node in nodes if node.get("Alive") and node.get("Resources", {}).get(resource, 0) > 0]


@dataclass(eq=False)
class _Host:
    """The driver's view of one host actor: its node, how many sandboxes it holds, and why it is gone (if it is)."""

    node_id: str
    actor: Any  # the SandboxHost actor's handle (Ray's stubs do not know its remote methods)
    inner: str  # the inner backend's name
    held: int = 0  # sandboxes placed here and not yet closed (reserved as a start begins)
    gone: str | None = None  # why the host takes no more calls; None while it is alive

    async def call(self, method: str, *args: Any) -> Any:
        """``actor.method(*args)``; the actor's exception as raised there, or :class:`SandboxHostLostError`."""
        from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

        if self.gone is not None:
            raise self.lost()
        try:
            return await getattr(self.actor, method).remote(*args)
        except RayTaskError as error:
            cause = getattr(error, "cause", None)
            raise (cause if isinstance(cause, Exception) else error) from error
        except RayActorError as error:
            if isinstance(error, ActorDiedError):  # dead for good (no restarts): place nothing here again
                self.gone = f"its actor died: {type(error).__name__}"
            raise self.lost(type(error).__name__) from error

    def lost(self, reason: str | None = None) -> SandboxHostLostError:
        """The error a call on this host's sandboxes raises."""
        why = reason or self.gone
        return SandboxHostLostError(
            f"the sandbox host on Ray node {self.node_id[:12]} is lost ({why}); its sandboxes are gone: "
            "retry the episode on a new sandbox"
        )


class RaySandbox:
    """A sandbox held by a host actor; each method awaits that actor (module docstring).

    Also an :class:`~.base.ExpiringSandbox`. A promise is an actor call, and the dispatcher makes several an
    episode, nearly all within the lifetime the sandbox already has: so ``keep_alive`` only notes how long the
    sandbox is needed, and the host hears of it once, shortly before the end the driver last knew (a quarter of
    the lifetime before it, 30 s at most), and only if it is still needed then. A sandbox that does not expire
    (no lifetime, ``local``, ``process``) gets nothing.

    Args:
        expires_in: Seconds from ``asked_at`` (or later) to the inner sandbox's end: what the host's
            :func:`~.ray_host_actor.expires_in` said; ``None`` if it never ends on its own.
        asked_at: The driver's loop time when the start was asked for, before the host made the sandbox: so the
            end the driver knows is never later than the host's.
    """

    def __init__(
        self,
        backend: RayHostBackend,
        host: _Host,
        key: str,
        sandbox_id: str,
        expires_in: float | None,
        asked_at: float,
    ) -> None:
        self.id = sandbox_id  # the inner sandbox's id
        self.key = key  # what the host holds it under
        self.host = host
        self.expires = expires_in is not None
        self._backend = backend
        self._closed = False
        # Loop times: the end the host holds the sandbox to (as far as the driver knows) and the end asked for.
        self._ends_at = self._wanted = asked_at + (expires_in or 0.0)
        self._margin = min(_PROMISE_MARGIN_S, expires_in / 4) if expires_in else _PROMISE_MARGIN_S
        self._promise: asyncio.TimerHandle | None = None

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        """Run ``command`` in the sandbox on its host; its process group is killed there at ``timeout_s``."""
        result: CommandResult = await self._call("run", command, timeout_s, workdir)
        return result

    async def read_file(self, path: str) -> bytes:
        """The content of ``path`` (``FileNotFoundError`` if absent)."""
        data: bytes = await self._call("read_file", path)
        return data

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Create or replace ``path`` with ``data``."""
        await self._call("write_file", path, data, mode)

    async def snapshot(self) -> Snapshot:
        """The inner snapshot, its ``ref`` prefixed with this host's node so that ``fork`` finds the host."""
        inner: Snapshot = await self._call("snapshot")
        return Snapshot(backend=RayHostBackend.name, ref=f"{self.host.node_id}/{inner.backend}/{inner.ref}")

    def keep_alive(self, seconds: float) -> None:
        """Do not let the sandbox end for ``seconds`` from now; the host hears of it only when needed (above).

        Called on the event loop that uses the sandbox (as every other method), which sends the promise later.
        """
        if not self.expires or self._closed or self.host.gone is not None:
            return
        loop = asyncio.get_running_loop()
        self._wanted = max(self._wanted, loop.time() + seconds)
        if self._wanted > self._ends_at and self._promise is None:
            self._promise = loop.call_at(self._ends_at - self._margin, self._send_promise, loop)

    def _send_promise(self, loop: asyncio.AbstractEventLoop) -> None:
        self._promise = None
        if self._closed or self.host.gone is not None:
            return
        # Sent without waiting; the host counts the seconds from when it reads them, so its end is no earlier.
        self.host.actor.keep_alive.remote(self.key, self._wanted - loop.time())
        self._backend.promises_sent += 1
        self._ends_at = self._wanted

    async def close(self) -> None:
        """Close the sandbox on its host; idempotent, and nothing to do (no error) when the host is lost."""
        if self._closed:
            return
        self._closed = True
        if self._promise is not None:
            self._promise.cancel()
        self._backend.release(self.host, 1)
        with contextlib.suppress(SandboxHostLostError):
            await self.host.call("close", self.key)

    async def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise SandboxClosedError(f"ray sandbox {self.id} was used after close()")
        return await self.host.call(method, self.key, *args)


class RayHostBackend:
    """Sandboxes on the sandbox hosts of a Ray cluster (module docstring).

    The constructor joins or starts Ray and returns once one host actor per host node has started.

    Args:
        settings: The cluster, the resource naming hosts, the inner backend and each host's capacity.
        run_id: The run's id (the Docker inner backend labels its containers with it).
        lifetime_s: How long an unclosed Docker sandbox may live (``None``: no lifetime).
        make_inner: Makes each host's inner backend instead of ``settings.inner`` (simulated hosts: a modelled
            backend, as ``benchmarks/ray_hosts_bench.py`` runs); pickled to every host node.

    Raises:
        ImportError: Ray is not installed (``pip install ray``).
        SandboxUnavailableError: no live node offers the resource, or a host actor did not start.
    """

    name = "ray"

    def __init__(
        self,
        settings: RayHostSettings | None = None,
        *,
        run_id: str | None = None,
        lifetime_s: float | None = None,
        make_inner: Callable[[], SandboxBackend] | None = None,
    ) -> None:
        self.settings = settings or RayHostSettings()
        ray = import_ray()
        self._started_ray = connect_ray(self.settings.address, self.settings.resource)
        try:
            self.hosts = _start_hosts(ray, self.settings, run_id, lifetime_s, make_inner)
        except BaseException:
            if self._started_ray:
                ray.shutdown()
            raise
        self._freed = asyncio.Event()  # set when places free up (then replaced)
        self._closed = False
        self.promises_sent = 0  # keep_alive calls the hosts got (RaySandbox.keep_alive sends few)

    @property
    def live_hosts(self) -> list[_Host]:
        """The hosts that take new sandboxes."""
        return [host for host in self.hosts if host.gone is None]

    async def create(self, spec: SandboxSpec) -> RaySandbox:
        """Start a sandbox on the live host that holds the fewest.

        Waits for a free place while every live host is full (``place_wait_s`` at most).

        Raises:
            SandboxUnavailableError: every host is lost (:class:`SandboxHostLostError` when the one tried dies).
            SandboxStartError: no place freed in time, or the inner backend could not start the sandbox.
        """
        host = await self._place(1)
        key = _new_key()

        async def made() -> list[tuple[str, float | None]]:
            return [await host.call("create", key, spec)]

        [sandbox] = await self._start(host, [key], made)
        return sandbox

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[Sandbox]:
        """``n`` sandboxes from ``snapshot``, on the host that made it.

        Raises:
            ValueError: the snapshot is not one of this backend's hosts'.
            SandboxHostLostError: the host that made it is lost (and its snapshots with it).
            SandboxStartError: that host holds fewer than ``n`` sandboxes, or ``n`` places did not free in time.
        """
        host, inner = self._snapshot_host(snapshot)
        await self._place(n, host)
        keys = [_new_key() for _ in range(n)]
        return [*await self._start(host, keys, lambda: host.call("fork", inner, keys, spec))]

    async def discard_snapshot(self, snapshot: Snapshot) -> None:
        """Let the host that made ``snapshot`` delete it now; nothing to do when that host is lost."""
        host, inner = self._snapshot_host(snapshot)
        if host.gone is None:
            with contextlib.suppress(SandboxHostLostError):
                await host.call("discard_snapshot", inner)

    def release(self, host: _Host, n: int) -> None:
        """``n`` sandboxes of ``host`` are closed (or never started): their places are free again."""
        host.held -= n
        self._freed.set()  # wakes the starts waiting for a place; the next release sets a new event
        self._freed = asyncio.Event()

    async def close(self) -> None:
        """Close every sandbox still open on the live hosts, stop the host actors (and Ray, if this started it).

        Idempotent. Sandboxes still held by callers become lost (their ``close`` does nothing). The first error
        of a host's own close is raised once every host has been stopped.
        """
        if self._closed:
            return
        self._closed = True
        live = self.live_hosts
        results = await asyncio.gather(*(host.call("shutdown") for host in live), return_exceptions=True)
        ray = import_ray()
        for host in self.hosts:
            host.gone = host.gone or "the backend was closed"
            ray.kill(host.actor, no_restart=True)
        if self._started_ray:
            ray.shutdown()
        errors = [error for error in results if isinstance(error, Exception)]
        for error in errors:
            log.warning("closing a sandbox host failed: %r", error)
        failed = [error for error in errors if not isinstance(error, SandboxHostLostError)]
        if failed:
            raise failed[0]

    async def _place(self, n: int, on: _Host | None = None) -> _Host:
        """Reserve ``n`` places on ``on`` (or on the live host that holds the fewest), once they are free.

        Raises:
            SandboxUnavailableError: every host is lost, or ``on`` is (:class:`SandboxHostLostError`).
            SandboxStartError: ``n`` exceeds a host's capacity, or no place freed within ``place_wait_s``.
        """
        capacity = self.settings.max_sandboxes
        if n > capacity:
            raise SandboxStartError(f"a sandbox host holds {capacity} sandboxes, not {n}: raise max_sandboxes")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.place_wait_s
        while True:
            host = on or self._least_held()
            if host.gone is not None:
                raise host.lost()
            if host.held + n <= capacity:
                host.held += n
                return host
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise SandboxStartError(
                    f"the sandbox host on Ray node {host.node_id[:12]} holds {host.held} of its {capacity} sandboxes "
                    f"and no place for {n} more freed within {self.settings.place_wait_s:g} s: raise max_sandboxes, "
                    "add sandbox hosts, or run fewer episodes at once"
                )
            # Woken by a release; at least every second, to see hosts that were lost meanwhile.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), min(remaining, 1.0))

    def _least_held(self) -> _Host:
        """The live host holding the fewest sandboxes.

        Raises:
            SandboxUnavailableError: every host is lost.
        """
        live = self.live_hosts
        if not live:
            raise SandboxUnavailableError(
                f"all {len(self.hosts)} sandbox hosts of the Ray cluster are lost; add nodes offering "
                f"{self.settings.resource!r} and start the run again"
            )
        return min(live, key=lambda candidate: candidate.held)

    async def _start(
        self, host: _Host, keys: list[str], start: Callable[[], Awaitable[list[tuple[str, float | None]]]]
    ) -> list[RaySandbox]:
        """Await ``start()`` (the host making one sandbox per key) on places already reserved on ``host``.

        The places are given back if the start fails; if the caller is cancelled, the host closes each sandbox
        as soon as it exists.
        """
        asked_at = asyncio.get_running_loop().time()
        try:
            made = await start()
        except BaseException as exc:
            self.release(host, len(keys))
            if isinstance(exc, asyncio.CancelledError):
                for key in keys:
                    host.actor.close.remote(key)
            raise
        return [RaySandbox(self, host, key, *started, asked_at) for key, started in zip(keys, made, strict=True)]

    def _snapshot_host(self, snapshot: Snapshot) -> tuple[_Host, Snapshot]:
        """The host that made ``snapshot`` (lost or not) and the inner snapshot it knows.

        Raises:
            ValueError: the snapshot is not one of this backend's hosts'.
        """
        if snapshot.backend != self.name:
            raise ValueError(f"a {snapshot.backend} snapshot cannot be forked by the {self.name} backend")
        node_id, inner_backend, inner_ref = snapshot.ref.split("/", 2)
        for host in self.hosts:
            if host.node_id == node_id:
                return host, Snapshot(backend=inner_backend, ref=inner_ref)
        raise ValueError(f"no sandbox host of this backend runs on Ray node {node_id[:12]}, which made the snapshot")


_PROMISE_MARGIN_S = 30.0  # at most this long before a sandbox's end, the host hears that it is still needed


def _new_key() -> str:
    return uuid.uuid4().hex[:16]


def _start_hosts(
    ray: Any,
    settings: RayHostSettings,
    run_id: str | None,
    lifetime_s: float | None,
    make_inner: Callable[[], SandboxBackend] | None,
) -> list[_Host]:
    """One started host actor per host node (module docstring).

    Raises:
        SandboxUnavailableError: no live node offers the resource, or an actor did not start in time.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = host_nodes(settings.resource)
    if not nodes:
        raise SandboxUnavailableError(
            f"no live node of the Ray cluster offers the resource {settings.resource!r}: start sandbox nodes with "
            f"`ray start --resources='{{\"{settings.resource}\": 1}}'` (or leave the address unset for a local cluster)"
        )
    remote: Any = ray.remote
    actor_class = remote(num_cpus=0, max_restarts=0)(SandboxHost)
    actors = [
        actor_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            settings.inner, run_id, lifetime_s, make_inner
        )
        for node in nodes
    ]
    try:
        ready = ray.get([actor.ready.remote() for actor in actors], timeout=settings.start_timeout_s)
    except Exception as exc:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        raise SandboxUnavailableError(
            f"the {settings.inner} sandbox hosts did not all start on {len(nodes)} Ray nodes within "
            f"{settings.start_timeout_s:g} s: {exc}"
        ) from exc
    return [_Host(node, actor, inner) for node, actor, (inner, _pid) in zip(nodes, actors, ready, strict=True)]
