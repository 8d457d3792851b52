"""Docker sandboxes through the ``docker`` SDK (only this module, .docker_leases and .docker_calls import it).

Each sandbox is a hardened container (no network unless asked, memory/CPU/pids limits, all capabilities
dropped, no-new-privileges, tini as PID 1, a non-root user, a size-capped json-file log) whose main process
holds a dead-man ``sleep`` and starts the first command runner (:mod:`.shell`) on the container's own streams,
attached before the start (:mod:`.attach`); a runner started later (a respawn) is reached through a
``docker exec -i`` stream. A spec's model socket directory is mounted read-only and its forwarder started before
anything else (:mod:`.session_socket`): the container's one way out, to its model server. Every container and
committed image carries the labels ``skyrl.managed=1``, ``skyrl.run``, ``skyrl.episode`` and ``skyrl.owner``; the
owner (the backend) holds a :class:`~.docker_leases.Lease` with the daemon while it lives (see :mod:`.reaper`).

SDK calls block, so they run in threads; the client has explicit timeouts so an unreachable daemon fails fast
with :class:`SandboxUnavailableError` instead of hanging. A start whose caller is cancelled runs on in its
thread, and what it started is removed (:class:`_Handoff`).
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import math
import os
import shutil
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import docker
import docker.errors
import docker.types

from skyrl_agent.sandbox import ownership
from skyrl_agent.sandbox.attach import INIT_SCRIPT, AttachedChannel, runner_argv_input
from skyrl_agent.sandbox.base import (
    MODEL_SOCKET_MOUNT,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
    SandboxUnavailableError,
    Snapshot,
)

# The lease and the removal helpers live in leaf modules; their names stay importable from here.
from skyrl_agent.sandbox.docker_calls import REMOVE_BACKOFF_S, UNREACHABLE, remove_volume, retry_remove
from skyrl_agent.sandbox.docker_leases import Lease, daemon_time_s, list_leases
from skyrl_agent.sandbox.session_socket import forwarder_command
from skyrl_agent.sandbox.shell import DEFAULT_OUTPUT_CAP, ChannelOpener, PersistentShell, RunnerChannel
from skyrl_agent.sandbox.shell_sandbox import ShellSandbox, check_snapshot_backend

PING_TIMEOUT_S = 5.0  # how long to wait for the daemon to answer before declaring it unreachable
API_TIMEOUT_S = 120.0  # per SDK call once connected (starts take seconds under load)
DEAD_MAN_S = 6 * 3600  # a container whose owner vanished without cleanup exits on its own after this
STATE_PATH = "/tmp/.skyrl-shell-state"
LOG_MAX_SIZE = "16m"  # a container's json-file log: bytes per file (docker units), so a flood cannot fill the disk
LOG_MAX_FILES = 2  # ...and files kept (the current one and one rotated)

__all__ = [
    "REMOVE_BACKOFF_S",
    "DockerBackend",
    "DockerSandbox",
    "Lease",
    "connect",
    "containers_of_run",
    "daemon_time_s",
    "ended_from_inside",
    "list_leases",
    "list_managed",
    "managed_labels",
    "remove_container",
    "remove_image",
    "remove_volume",
]

log = logging.getLogger(__name__)


def connect(timeout_s: float = API_TIMEOUT_S, max_pool_size: int = 32) -> Any:
    """A ``docker.DockerClient`` from the environment (``DOCKER_HOST``…) that answered a ping.

    Raises:
        SandboxUnavailableError: the daemon did not answer within ``PING_TIMEOUT_S``.
    """
    try:
        probe = docker.from_env(timeout=PING_TIMEOUT_S)
        probe.ping()
        probe.close()
        return docker.from_env(timeout=timeout_s, max_pool_size=max_pool_size)
    except (docker.errors.DockerException, *UNREACHABLE) as exc:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise SandboxUnavailableError(
            f"no Docker engine answered at {host} within {PING_TIMEOUT_S:g} s ({exc.__class__.__name__}: {exc});"
            " start dockerd (`make docker` as root) or fix DOCKER_HOST"
        ) from exc


def managed_labels(run_id: str, episode: str, extra: dict[str, str], *, owner: str = "") -> dict[str, str]:
    """The labels every managed container and image carries (``extra`` cannot override the managed ones).

    ``owner`` is the id of the :class:`Lease` that keeps them; without one the reaper takes them for leaked.
    """
    managed = {"skyrl.managed": "1", "skyrl.run": run_id, "skyrl.episode": episode, ownership.OWNER_LABEL: owner}
    return {**extra, **managed}


class _Handoff:
    """Passes a container started in a thread to its caller, or back to the thread if the caller has gone.

    Whoever ends up holding the container removes it when nobody wants it: the thread when the caller was
    cancelled before the start returned, the caller when the cancellation came after.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._delivered: tuple[Any, socket.socket | None] | None = None

    @property
    def abandoned(self) -> bool:
        """Whether the caller has gone (then the thread need not even start the container)."""
        return self._abandoned

    def deliver(self, started: tuple[Any, socket.socket | None]) -> bool:
        """Called by the thread: False when the caller has gone and the thread must remove what it started."""
        with self._lock:
            if not self._abandoned:
                self._delivered = started
            return not self._abandoned

    def abandon(self) -> tuple[Any, socket.socket | None] | None:
        """Called by the cancelled caller: what was delivered before it left, which it must then remove."""
        with self._lock:
            self._abandoned = True
            return self._delivered


class DockerSandbox(ShellSandbox):
    """One container plus its command runner. Owned by one episode; :meth:`close` removes the container.

    ``run``, ``read_file`` and ``write_file`` are :class:`~.shell_sandbox.ShellSandbox`'s; each first checks that
    the backend's lease holds.
    """

    closed_message = "docker sandbox {id} was used after close()"

    def __init__(self, backend: DockerBackend, container: Any, spec: SandboxSpec, shell: PersistentShell) -> None:
        super().__init__(container.id[:12], spec, shell)
        self.container = container
        self._backend = backend
        self._done = False  # close() went to the end: the container is gone, or its removal failed for good
        self.expires_at = math.inf  # time.monotonic() after which the backend removes it (never without lifetime_s)

    def keep_alive(self, seconds: float) -> None:
        """Keep this sandbox past its lifetime for at least ``seconds`` from now; a promise is never shortened."""
        self.expires_at = max(self.expires_at, time.monotonic() + seconds)

    async def snapshot(self) -> Snapshot:
        """Commit the container's filesystem to a labelled image (≈70 ms measured).

        The backend removes the image once it is discarded and unused (:meth:`DockerBackend.discard_snapshot`), or
        on close.
        """
        self._check_open()
        return await self._backend.commit(self)

    async def close(self) -> None:
        """Kill the shell and force-remove the container; idempotent.

        A close cancelled before its end is done again by the next one.

        Raises:
            SandboxError: the container survived every removal attempt (it is logged and listed in the
                backend's ``leaked``; ``skyrl-agent reap`` removes it later).
        """
        if self._done:
            return
        self._closed = True
        await self._shell.close()
        try:
            await self._backend.remove(self)
        except SandboxError:
            self._done = True  # recorded as leaked: another attempt would fail the same way
            raise
        self._done = True

    def _check_open(self) -> None:
        super()._check_open()
        self._backend.check_lease()


class DockerBackend:
    """Creates :class:`DockerSandbox` es.

    Args:
        run_id: the ``skyrl.run`` label (default: :func:`.ownership.default_run_id`).
        max_concurrent_starts: container starts in flight at once (the daemon serializes them anyway).
        output_cap: bytes of output kept per command.
        lease_ttl_s: how long the backend's lease lasts unrenewed (default: :func:`.ownership.lease_ttl_s`).
        log_max_size: size of one file of a container's json-file log (docker units: ``"16m"``).
        log_max_files: log files kept per container.
        lifetime_s: seconds after its start (or after the last :meth:`DockerSandbox.keep_alive` promise) at which
            an open sandbox is removed, so that a holder that never closes one leaks nothing while its process
            lives (the lease reaper covers the process's death). ``None``: no lifetime. The dispatcher keeps the
            sandboxes it holds alive through its deadlines and pauses (``Timeouts.sandbox_lifetime_s``).

    The backend owns (``skyrl.owner``) what it creates and holds a :class:`Lease` from its first ``create`` to
    its ``close``. A snapshot image goes once it is discarded and nothing uses it (:meth:`discard_snapshot`).
    ``close`` removes the sandboxes still open and the snapshot images this backend committed that are left, then
    releases the lease. IDs of containers and images that could not be removed are kept in ``leaked``.
    """

    name = "docker"
    mounts_model_socket = True  # honours SandboxSpec.model_socket_dir (and starts the forwarder in the container)

    def __init__(
        self,
        *,
        run_id: str | None = None,
        max_concurrent_starts: int = 4,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        lease_ttl_s: float | None = None,
        log_max_size: str = LOG_MAX_SIZE,
        log_max_files: int = LOG_MAX_FILES,
        lifetime_s: float | None = None,
    ) -> None:
        if lease_ttl_s is not None and lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be a positive number of seconds, got {lease_ttl_s:g}")
        if lifetime_s is not None and lifetime_s <= 0:
            raise ValueError(f"lifetime_s must be a positive number of seconds (or None), got {lifetime_s:g}")
        self.lifetime_s = lifetime_s
        self.expired: list[str] = []  # ids of sandboxes removed because their lifetime passed
        self._expiry: asyncio.Task[None] | None = None
        self.run_id = run_id or ownership.default_run_id()
        self._client: Any = None
        self._connecting = asyncio.Lock()
        self._lease = Lease(self.run_id, lease_ttl_s or ownership.lease_ttl_s())
        self._starts = asyncio.Semaphore(max_concurrent_starts)
        self._cap = output_cap
        self._log_config = docker.types.LogConfig(
            type=docker.types.LogConfig.types.JSON, config={"max-size": log_max_size, "max-file": str(log_max_files)}
        )
        self._open: dict[str, DockerSandbox] = {}
        self._images: dict[str, None] = {}  # snapshot images not yet removed, in commit order (children last)
        self._parents: dict[str, str] = {}  # snapshot image → the snapshot image its container started from
        self._discarded: set[str] = set()  # snapshot images to remove once nothing uses them
        self._forking: Counter[str] = Counter()  # snapshot image → forks from it in flight
        self.leaked: list[str] = []
        self._unconfirmed: list[str] = []  # names of containers a failed create may have made, not yet removed

    @property
    def owner(self) -> str:
        """The ``skyrl.owner`` label of this backend's containers and images (its lease's owner id)."""
        return self._lease.owner

    def check_lease(self) -> None:
        """Raise ``SandboxUnavailableError`` while the lease may have lapsed: its sandboxes may be reaped under it.

        An episode that meets this is the infrastructure's failure (retried, never a reward); the lease holds
        again once a renewal gets through.
        """
        if self._lease.lapsed:
            raise SandboxUnavailableError(
                f"the lease of {self.owner} may have lapsed (no renewal got through the Docker daemon for "
                f"{self._lease.ttl_s:g} s): another run may reap its sandboxes"
            )

    async def create(self, spec: SandboxSpec, *, episode: str | None = None) -> DockerSandbox:
        """Start a container from ``spec`` with its shell ready.

        Raises:
            SandboxUnavailableError: no daemon. SandboxStartError: the container or its shell did not start.
        """
        client = await self._connect()
        self.check_lease()
        labels = managed_labels(self.run_id, episode or uuid.uuid4().hex[:12], spec.labels, owner=self.owner)
        handoff = _Handoff()
        async with self._starts:
            try:
                started = await asyncio.to_thread(self._start_container, client, spec, labels, handoff)
            except asyncio.CancelledError:
                late = handoff.abandon()
                if late is not None:  # started, but the caller left before taking it
                    await asyncio.shield(asyncio.to_thread(_discard, late))
                raise
        assert started is not None  # None only for an abandoned start
        container, attached = started
        sandbox = DockerSandbox(self, container, spec, self._shell_for(container, spec))
        self._open[container.id] = sandbox
        if self.lifetime_s is not None:
            sandbox.expires_at = time.monotonic() + self.lifetime_s
            self._watch_lifetimes()
        try:
            await sandbox._shell.start(spec.workdir, opener=_attached_opener(attached) if attached else None)
        except BaseException as exc:
            await _close_after_failed_start(sandbox)
            if isinstance(exc, Exception):
                raise SandboxStartError(f"container {container.id[:12]} started but its shell did not: {exc}") from exc
            raise
        return sandbox

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[DockerSandbox]:
        """``n`` containers from the committed image of ``snapshot`` (≈0.18 s each; starts are rate-bound)."""
        check_snapshot_backend(snapshot, self.name)
        forked = replace(spec, image=snapshot.ref)
        self._forking[snapshot.ref] += 1  # the image may not go while its containers are being created
        try:
            results = await asyncio.gather(*(self.create(forked) for _ in range(n)), return_exceptions=True)
        finally:
            self._forking -= Counter({snapshot.ref: 1})  # (drops the key at zero)
        sandboxes = [r for r in results if isinstance(r, DockerSandbox)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(s.close() for s in sandboxes))
            await self._remove_discarded()  # discarded while this fork, which left nothing, was in flight
            raise errors[0]
        return sandboxes

    async def discard_snapshot(self, snapshot: Snapshot) -> None:
        """Remove the image of ``snapshot`` now, or once the last container or image that uses it is removed.

        The daemon refuses, even forced, to remove an image that a running container or a child image (a snapshot
        of one of its forks) uses, and force-untagging it instead would leave it dangling, unowned, until a prune.
        So the removal waits for the last user; forks already made keep running, and ``close`` removes whatever
        is still waiting. Idempotent; a snapshot this backend does not keep (another's, or one removed) is ignored.
        """
        if snapshot.backend == self.name and snapshot.ref in self._images:
            self._discarded.add(snapshot.ref)
            await self._remove_discarded()

    async def commit(self, sandbox: DockerSandbox) -> Snapshot:
        """Commit ``sandbox`` to a labelled image owned by this backend."""
        episode = sandbox.container.labels.get("skyrl.episode", "")
        labels = managed_labels(self.run_id, episode, sandbox.spec.labels, owner=self.owner)
        labels["skyrl.kind"] = "snapshot"
        image = await asyncio.to_thread(
            sandbox.container.commit, repository="skyrl-snapshot", tag=uuid.uuid4().hex[:12], conf={"Labels": labels}
        )
        self._images[image.id] = None
        if sandbox.spec.image in self._images:  # a fork's snapshot: a child image, which holds its parent
            self._parents[image.id] = sandbox.spec.image
        return Snapshot(backend=self.name, ref=image.id)

    async def remove(self, sandbox: DockerSandbox) -> None:
        """Force-remove the container of ``sandbox`` (missing is fine), retrying with backoff.

        Raises:
            SandboxError: the container is still there after every attempt (also logged and recorded).
        """
        # Cancelled here, the removal runs on in its thread and the sandbox stays open for the next close.
        removed = await asyncio.to_thread(remove_container, sandbox.container)
        self._open.pop(sandbox.container.id, None)
        if not removed:
            self.leaked.append(sandbox.container.id)
            raise SandboxError(
                f"container {sandbox.id} could not be removed; run `skyrl-agent reap --run {self.run_id}`"
            )
        if sandbox.spec.image in self._discarded:  # a fork of a discarded snapshot: maybe its last user
            await self._remove_discarded()

    def _in_use(self, image_id: str) -> bool:
        """Whether an open sandbox, a fork in flight or a kept child image still needs the snapshot image."""
        return (
            image_id in self._forking
            or any(sandbox.spec.image == image_id for sandbox in self._open.values())
            or any(parent == image_id for parent in self._parents.values())
        )

    async def _remove_discarded(self) -> None:
        """Remove the discarded images that nothing uses, children first (removing one may free its parent).

        An image leaves ``_discarded`` before its removal starts, so concurrent calls never remove it twice; one
        that resists stays in ``_images`` for :meth:`close` to try again.
        """
        while unused := [i for i in reversed(self._images) if i in self._discarded and not self._in_use(i)]:
            image_id = unused[0]
            self._discarded.discard(image_id)
            if await asyncio.to_thread(retry_remove, self._client.images.remove, image_id, f"image {image_id}"):
                self._images.pop(image_id, None)
                self._parents.pop(image_id, None)

    async def close(self) -> None:
        """Remove the open sandboxes and the committed snapshot images, then release the lease; idempotent.

        Every removal is attempted; then the first failure is raised as :class:`SandboxError` (what stayed is
        reapable at once: its owner's lease is gone).
        """
        expiry, self._expiry = self._expiry, None
        if expiry is not None:
            expiry.cancel()
            await asyncio.gather(expiry, return_exceptions=True)
        results = await asyncio.gather(*(s.close() for s in list(self._open.values())), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        images, self._images = list(reversed(self._images)), {}  # children before their parents
        self._parents.clear()
        self._discarded.clear()
        unconfirmed, self._unconfirmed = self._unconfirmed, []
        if self._client is not None:
            for name in unconfirmed:
                if not await asyncio.to_thread(retry_remove, self._client.api.remove_container, name, name):
                    self.leaked.append(name)
                    errors.append(SandboxError(f"container {name} (of a failed start) could not be removed"))
            for image_id in images:
                if not await asyncio.to_thread(retry_remove, self._client.images.remove, image_id, f"image {image_id}"):
                    self.leaked.append(image_id)
                    errors.append(SandboxError(f"snapshot image {image_id} could not be removed"))
        if self._lease.held:
            await asyncio.to_thread(self._lease.release)
        if errors:
            raise errors[0]

    def _watch_lifetimes(self) -> None:
        if self._expiry is None or self._expiry.done():
            self._expiry = asyncio.ensure_future(self._remove_expired())

    async def _remove_expired(self) -> None:
        """Remove open sandboxes whose lifetime passed, until none is open; a new create starts it again."""
        while self._open:
            now = time.monotonic()
            due = [sandbox for sandbox in self._open.values() if sandbox.expires_at <= now]
            for sandbox in due:
                log.warning(
                    "docker sandbox %s was not closed within its lifetime (%g s unless kept alive); removing it",
                    sandbox.id, self.lifetime_s,
                )  # fmt: skip
                self.expired.append(sandbox.id)
                with contextlib.suppress(SandboxError):  # a failed removal is in ``leaked`` already
                    await sandbox.close()
            nearest = min((sandbox.expires_at for sandbox in self._open.values()), default=now + 1.0)
            await asyncio.sleep(min(max(nearest - time.monotonic(), 0.05), 5.0))

    async def _connect(self) -> Any:
        """The client, with the lease held (both made on first use; the lease again after ``close``)."""
        async with self._connecting:
            if self._client is None:
                self._client = await asyncio.to_thread(connect)
            if not self._lease.held:
                await asyncio.to_thread(self._lease.acquire, self._client)
        return self._client

    def _start_container(
        self, client: Any, spec: SandboxSpec, labels: dict[str, str], handoff: _Handoff
    ) -> tuple[Any, socket.socket | None] | None:
        """Create and start the container; a failed start removes it and raises ``SandboxStartError``.

        Returns the container and, where the client's transport allows it, the connection attached to its main
        process before the start (see :mod:`.attach`; None means the first runner must be exec'd). Returns None,
        having removed the container, when the caller abandoned ``handoff`` meanwhile.
        """
        container = None
        attach = _attachable(client)
        name = f"skyrl-{labels['skyrl.episode']}-{uuid.uuid4().hex[:6]}"
        try:
            container = client.containers.create(
                spec.image,
                ["bash", "-c", _init_script(spec), "skyrl-init", str(DEAD_MAN_S)],
                stdin_open=attach,
                # With an open stdin, "not detached" is how the SDK sets StdinOnce: when the host lets go of the
                # attach stream (or dies), the first runner's stdin ends and it exits.
                detach=not attach,
                name=name,
                user=spec.user,
                working_dir=spec.workdir,
                environment=spec.env,
                labels=labels,
                network_mode="bridge" if spec.network else "none",
                mounts=_model_socket_mounts(spec),
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",  # no swap: the limit is the limit
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids_limit,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                init=True,
                log_config=self._log_config,
            )
            if handoff.abandoned:  # cancelled during the create: do not start it
                _force_remove(container)
                return None
            attached = _attach(container) if attach else None
            try:
                container.start()
            except BaseException:
                if attached is not None:
                    attached.close()
                raise
            if not handoff.deliver((container, attached)):
                _discard((container, attached))
                return None
            return container, attached
        except UNREACHABLE as exc:
            self._remove_failed_start(client, container, name)
            raise SandboxUnavailableError(
                f"the Docker daemon stopped answering while starting a sandbox: {exc}"
            ) from exc
        except docker.errors.DockerException as exc:
            self._remove_failed_start(client, container, name)
            raise SandboxStartError(f"could not start a sandbox from {spec.image}: {exc}") from exc

    def _remove_failed_start(self, client: Any, container: Any, name: str) -> None:
        """Remove what a failed start may have left, known or not.

        When the create call itself failed, the daemon may still have made the container (the connection broke
        after the request reached it, e.g. during a daemon restart): it is looked up by its unique name. A name
        that cannot be removed now is kept for :meth:`close` to try again.
        """
        if container is not None:
            _force_remove(container)
        elif not retry_remove(client.api.remove_container, name, f"container {name}"):
            self._unconfirmed.append(name)

    def _shell_for(self, container: Any, spec: SandboxSpec) -> PersistentShell:
        docker_cli = shutil.which("docker") or "docker"
        argv = [docker_cli, "exec", "-i", "-u", spec.user, "-w", spec.workdir, container.id]

        async def postmortem() -> str | None:
            return await asyncio.to_thread(ended_from_inside, container)

        return PersistentShell(
            argv, state_path=STATE_PATH, output_cap=self._cap, own_pid_namespace=True, postmortem=postmortem
        )


def ended_from_inside(container: Any) -> str | None:
    """How ``container`` ended on its own, or None: it runs, was killed, stopped or removed, or the daemon is silent.

    "On its own": it exited (its processes ended or ran out of memory) and the daemon logged no ``kill`` or ``stop``
    of it (as ``docker kill``/``stop``/``rm -f``, the reaper and a daemon shutdown all do). The daemon keeps its
    last 256 events, so this is asked right after the death (see docs/agent/dispatcher.md).
    """
    try:
        for _ in range(20):  # the runner's channel may end a moment before the daemon records the exit
            container.reload()
            state = container.attrs["State"]
            if not state["Running"]:
                break
            time.sleep(0.1)
        else:
            return None
        since, until = _docker_time(state["StartedAt"]), _docker_time(state["FinishedAt"]) + 0.5
        filters = {"type": "container", "container": container.id, "event": ["kill", "stop"]}
        if any(True for _ in container.client.api.events(since=since, until=until, filters=filters, decode=True)):
            return None
    except (docker.errors.DockerException, *UNREACHABLE):
        return None
    memory = " out of memory" if state["OOMKilled"] else ""
    return f"container {container.id[:12]} exited{memory} with status {state['ExitCode']}, not killed from the host"


def _docker_time(stamp: str) -> float:
    """Seconds since the epoch of a daemon timestamp such as ``2026-01-02T03:04:05.123456789Z`` (UTC)."""
    seconds = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    fraction = stamp[19:].rstrip("Z")
    return seconds + (float(fraction) if fraction.startswith(".") else 0.0)


def _attachable(client: Any) -> bool:
    """Whether the client reaches the daemon over a plain socket (unix or tcp, not TLS or ssh) that asyncio can use."""
    base_url: str = client.api.base_url
    return base_url == "http+docker://localhost" or base_url.startswith("http://")


def _attach(container: Any) -> socket.socket | None:
    """A socket attached to the (created, not started) container's stdin, stdout and stderr; None if unusable."""
    params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
    hijacked = container.attach_socket(params=params)
    raw = getattr(hijacked, "_sock", hijacked)
    try:
        # Our own descriptor: the SDK's wrappers around the connection may close theirs when collected.
        return raw.dup() if type(raw) is socket.socket else None
    finally:
        with contextlib.suppress(OSError):
            hijacked.close()
        if type(raw) is socket.socket:
            raw.close()


def _attached_opener(attached: socket.socket) -> ChannelOpener:
    """A :data:`.shell.ChannelOpener` that hands the runner's command line to the container's init process."""

    async def opener(argv: Sequence[str]) -> RunnerChannel:
        try:
            channel = await AttachedChannel.open(attached)
        except BaseException:
            attached.close()
            raise
        channel.stdin.write(runner_argv_input(argv))
        return channel

    return opener


def remove_container(container: Any) -> bool:
    """Force-remove ``container`` with retries; True when it is gone (or was already)."""
    return retry_remove(
        lambda _ref, force: container.remove(force=force), container.id, f"container {container.id[:12]}"
    )


def _force_remove(container: Any) -> None:
    """Best-effort removal while a start is failing (the start error is what the caller reports)."""
    remove_container(container)


def _discard(started: tuple[Any, socket.socket | None]) -> None:
    """Close the attach connection of a started container nobody took, and remove the container."""
    container, attached = started
    if attached is not None:
        attached.close()
    _force_remove(container)


async def _close_after_failed_start(sandbox: DockerSandbox) -> None:
    """Close ``sandbox`` to the end though the caller may be cancelled meanwhile (the start's error is raised)."""
    try:
        await asyncio.shield(sandbox.close())
    except SandboxError as exc:
        log.warning("closing sandbox %s after a failed start: %s", sandbox.id, exc)


def list_managed(client: Any, run_id: str | None) -> tuple[list[Any], list[Any]]:
    """Containers and images labelled ``skyrl.managed=1`` (of ``run_id`` when given), for the reaper."""
    filters = ["skyrl.managed=1"] + ([f"skyrl.run={run_id}"] if run_id else [])
    # ignore_removed: a container removed between the listing and its inspection (a retried start) is skipped
    containers = client.containers.list(all=True, filters={"label": filters}, ignore_removed=True)
    images = client.images.list(all=True, filters={"label": filters})
    return containers, images


def containers_of_run(run_id: str) -> list[Any]:
    """The managed containers of run ``run_id``, running or not, through a Docker client of its own."""
    client = connect(PING_TIMEOUT_S)
    try:
        return list(list_managed(client, run_id)[0])
    finally:
        client.close()


def remove_image(client: Any, image: Any) -> bool:
    """Force-remove ``image`` with retries; True when it is gone (or was already)."""
    return retry_remove(client.images.remove, image.id, f"image {image.short_id}")


def _init_script(spec: SandboxSpec) -> str:
    """The container's main script: :data:`INIT_SCRIPT`, after the model forwarder when a model socket is mounted.

    Started first, the forwarder is among the processes present before the first runner, which the runner keeps.
    """
    return INIT_SCRIPT if spec.model_socket_dir is None else forwarder_command() + INIT_SCRIPT


def _model_socket_mounts(spec: SandboxSpec) -> list[docker.types.Mount] | None:
    """The read-only bind mount of the spec's model socket directory, if any (the daemon must share our filesystem)."""
    if spec.model_socket_dir is None:
        return None
    return [docker.types.Mount(MODEL_SOCKET_MOUNT, spec.model_socket_dir, type="bind", read_only=True)]
