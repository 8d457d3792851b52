"""Docker sandboxes through the ``docker`` SDK; the only module (with the reaper's helpers here) that imports it.

Each sandbox is a hardened container (no network unless asked, memory/CPU/pids limits, all capabilities
dropped, no-new-privileges, tini as PID 1, a non-root user) whose main process holds a dead-man ``sleep`` and
starts the first command runner (:mod:`.shell`) on the container's own streams, attached before the start
(:mod:`.attach`); a runner started later (a respawn) is reached through a ``docker exec -i`` stream. Every
container and committed image carries the labels ``skyrl.managed=1``, ``skyrl.run``, ``skyrl.episode`` and
``skyrl.owner`` (see :mod:`.reaper`).

SDK calls block, so they run in threads; the client has explicit timeouts so an unreachable daemon fails fast
with :class:`SandboxUnavailableError` instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import docker
import docker.errors
import requests.exceptions

from skyrl_agent.sandbox import reaper
from skyrl_agent.sandbox.attach import INIT_SCRIPT, AttachedChannel, runner_argv_input
from skyrl_agent.sandbox.base import (
    CommandResult,
    SandboxClosedError,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
    SandboxUnavailableError,
    Snapshot,
)
from skyrl_agent.sandbox.shell import DEFAULT_OUTPUT_CAP, ChannelOpener, PersistentShell, RunnerChannel

PING_TIMEOUT_S = 5.0  # how long to wait for the daemon to answer before declaring it unreachable
API_TIMEOUT_S = 120.0  # per SDK call once connected (starts take seconds under load)
DEAD_MAN_S = 6 * 3600  # a container whose owner vanished without cleanup exits on its own after this
STATE_PATH = "/tmp/.skyrl-shell-state"
REMOVE_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)  # waits between force-removal attempts of a container or image

log = logging.getLogger(__name__)

_UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError)


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
    except (docker.errors.DockerException, *_UNREACHABLE) as exc:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise SandboxUnavailableError(
            f"no Docker engine answered at {host} within {PING_TIMEOUT_S:g} s ({exc.__class__.__name__}: {exc});"
            " start dockerd (`make docker` as root) or fix DOCKER_HOST"
        ) from exc


def managed_labels(run_id: str, episode: str, extra: dict[str, str]) -> dict[str, str]:
    """The labels every managed container and image carries (``extra`` cannot override the managed ones)."""
    return {**extra, "skyrl.managed": "1", "skyrl.run": run_id, "skyrl.episode": episode, "skyrl.owner": reaper.owner()}


class DockerSandbox:
    """One container plus its command runner. Owned by one episode; :meth:`close` removes the container."""

    def __init__(self, backend: DockerBackend, container: Any, spec: SandboxSpec, shell: PersistentShell) -> None:
        self.id: str = container.id[:12]
        self.container = container
        self.spec = spec
        self._backend = backend
        self._shell = shell
        self._closed = False

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        """Run ``command`` through the command runner; its process group is killed in the container at ``timeout_s``."""
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

    async def snapshot(self) -> Snapshot:
        """Commit the container's filesystem to a labelled image (≈70 ms measured); the backend removes it on close."""
        self._check_open()
        return await self._backend.commit(self)

    async def close(self) -> None:
        """Kill the shell and force-remove the container; idempotent.

        Raises:
            SandboxError: the container survived every removal attempt (it is logged and listed in the
                backend's ``leaked``; ``skyrl-agent reap`` removes it later).
        """
        if self._closed:
            return
        self._closed = True
        await self._shell.close()
        await self._backend.remove(self)

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec.workdir.rstrip('/')}/{path}"

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"docker sandbox {self.id} was used after close()")


class DockerBackend:
    """Creates :class:`DockerSandbox` es.

    Args:
        run_id: the ``skyrl.run`` label (default: :func:`reaper.default_run_id`).
        max_concurrent_starts: container starts in flight at once (the daemon serializes them anyway).
        output_cap: bytes of output kept per command.

    ``close`` removes the sandboxes still open and the snapshot images this backend committed. IDs of
    containers and images that could not be removed are kept in ``leaked``.
    """

    name = "docker"

    def __init__(
        self,
        *,
        run_id: str | None = None,
        max_concurrent_starts: int = 4,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> None:
        self.run_id = run_id or reaper.default_run_id()
        self._client: Any = None
        self._starts = asyncio.Semaphore(max_concurrent_starts)
        self._cap = output_cap
        self._open: dict[str, DockerSandbox] = {}
        self._images: list[str] = []
        self.leaked: list[str] = []

    async def create(self, spec: SandboxSpec, *, episode: str | None = None) -> DockerSandbox:
        """Start a container from ``spec`` with its shell ready.

        Raises:
            SandboxUnavailableError: no daemon. SandboxStartError: the container or its shell did not start.
        """
        client = await self._connect()
        labels = managed_labels(self.run_id, episode or uuid.uuid4().hex[:12], spec.labels)
        async with self._starts:
            container, attached = await asyncio.to_thread(self._start_container, client, spec, labels)
        sandbox = DockerSandbox(self, container, spec, self._shell_for(container.id, spec))
        self._open[container.id] = sandbox
        try:
            await sandbox._shell.start(spec.workdir, opener=_attached_opener(attached) if attached else None)
        except Exception as exc:
            await sandbox.close()
            raise SandboxStartError(f"container {container.id[:12]} started but its shell did not: {exc}") from exc
        return sandbox

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[DockerSandbox]:
        """``n`` containers from the committed image of ``snapshot`` (≈0.18 s each; starts are rate-bound)."""
        if snapshot.backend != self.name:
            raise ValueError(f"a {snapshot.backend} snapshot cannot be forked by the docker backend")
        forked = replace(spec, image=snapshot.ref)
        results = await asyncio.gather(*(self.create(forked) for _ in range(n)), return_exceptions=True)
        sandboxes = [r for r in results if isinstance(r, DockerSandbox)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(s.close() for s in sandboxes))
            raise errors[0]
        return sandboxes

    async def commit(self, sandbox: DockerSandbox) -> Snapshot:
        """Commit ``sandbox`` to a labelled image owned by this backend."""
        labels = managed_labels(self.run_id, sandbox.container.labels.get("skyrl.episode", ""), sandbox.spec.labels)
        labels["skyrl.kind"] = "snapshot"
        image = await asyncio.to_thread(
            sandbox.container.commit, repository="skyrl-snapshot", tag=uuid.uuid4().hex[:12], conf={"Labels": labels}
        )
        self._images.append(image.id)
        return Snapshot(backend=self.name, ref=image.id)

    async def remove(self, sandbox: DockerSandbox) -> None:
        """Force-remove the container of ``sandbox`` (missing is fine), retrying with backoff.

        Raises:
            SandboxError: the container is still there after every attempt (also logged and recorded).
        """
        self._open.pop(sandbox.container.id, None)
        if not await asyncio.to_thread(remove_container, sandbox.container):
            self.leaked.append(sandbox.container.id)
            raise SandboxError(
                f"container {sandbox.id} could not be removed; run `skyrl-agent reap --run {self.run_id}`"
            )

    async def close(self) -> None:
        """Remove the open sandboxes and the committed snapshot images; idempotent.

        Every removal is attempted; then the first failure is raised as :class:`SandboxError`.
        """
        results = await asyncio.gather(*(s.close() for s in list(self._open.values())), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        images, self._images = self._images, []
        if self._client is not None:
            for image_id in images:
                if not await asyncio.to_thread(
                    _retry_remove, self._client.images.remove, image_id, f"image {image_id}"
                ):
                    self.leaked.append(image_id)
                    errors.append(SandboxError(f"snapshot image {image_id} could not be removed"))
        if errors:
            raise errors[0]

    async def _connect(self) -> Any:
        if self._client is None:
            self._client = await asyncio.to_thread(connect)
        return self._client

    def _start_container(
        self, client: Any, spec: SandboxSpec, labels: dict[str, str]
    ) -> tuple[Any, socket.socket | None]:
        """Create and start the container; a failed start removes it and raises ``SandboxStartError``.

        Returns the container and, where the client's transport allows it, the connection attached to its main
        process before the start (see :mod:`.attach`); None means the first runner must be exec'd.
        """
        container = None
        attach = _attachable(client)
        try:
            container = client.containers.create(
                spec.image,
                ["bash", "-c", INIT_SCRIPT, "skyrl-init", str(DEAD_MAN_S)],
                stdin_open=attach,
                # With an open stdin, "not detached" is how the SDK sets StdinOnce: when the host lets go of the
                # attach stream (or dies), the first runner's stdin ends and it exits.
                detach=not attach,
                name=f"skyrl-{labels['skyrl.episode']}-{uuid.uuid4().hex[:6]}",
                user=spec.user,
                working_dir=spec.workdir,
                environment=spec.env,
                labels=labels,
                network_mode="bridge" if spec.network else "none",
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",  # no swap: the limit is the limit
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids_limit,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                init=True,
            )
            attached = _attach(container) if attach else None
            try:
                container.start()
            except BaseException:
                if attached is not None:
                    attached.close()
                raise
            return container, attached
        except _UNREACHABLE as exc:
            if container is not None:
                _force_remove(container)
            raise SandboxUnavailableError(
                f"the Docker daemon stopped answering while starting a sandbox: {exc}"
            ) from exc
        except docker.errors.DockerException as exc:
            if container is not None:
                _force_remove(container)
            raise SandboxStartError(f"could not start a sandbox from {spec.image}: {exc}") from exc

    def _shell_for(self, container_id: str, spec: SandboxSpec) -> PersistentShell:
        docker_cli = shutil.which("docker") or "docker"
        argv = [docker_cli, "exec", "-i", "-u", spec.user, "-w", spec.workdir, container_id]
        return PersistentShell(argv, state_path=STATE_PATH, output_cap=self._cap, own_pid_namespace=True)


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


def _retry_remove(remove: Any, ref: str, what: str) -> bool:
    """Call ``remove(ref, force=True)`` until it succeeds or ``ref`` is gone; False (and a warning) if it stays."""
    error: Exception | None = None
    for attempt, wait_s in enumerate((0.0, *REMOVE_BACKOFF_S)):
        time.sleep(wait_s)
        try:
            remove(ref, force=True)
            return True
        except docker.errors.NotFound:
            return True
        except (docker.errors.APIError, *_UNREACHABLE) as exc:
            error = exc
            log.debug("removing %s failed (attempt %d): %s", what, attempt + 1, exc)
    log.warning("%s was not removed after %d attempts: %s", what, len(REMOVE_BACKOFF_S) + 1, error)
    return False


def remove_container(container: Any) -> bool:
    """Force-remove ``container`` with retries; True when it is gone (or was already)."""
    return _retry_remove(
        lambda _ref, force: container.remove(force=force), container.id, f"container {container.id[:12]}"
    )


def _force_remove(container: Any) -> None:
    """Best-effort removal while a start is failing (the start error is what the caller reports)."""
    remove_container(container)


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
    return _retry_remove(client.images.remove, image.id, f"image {image.short_id}")
