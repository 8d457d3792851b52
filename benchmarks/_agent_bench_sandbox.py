"""Sandbox latencies for ``benchmarks/agent_bench.py``: our Docker and local backends beside plain docker-py.

Each subject is one column of the table; each measures the same operations, timed with ``time.perf_counter``:

- warm acquire: ``WarmPool.acquire`` while the pool has a started sandbox ready (plain docker-py has no pool);
- cold start: create and start a sandbox until a command can run (ours: the persistent shell is up; plain:
  ``containers.run`` returned);
- command round trip: run ``true`` (ours: through the persistent shell; plain: one ``exec_run`` per command);
- snapshot: capture the filesystem after a small change (ours: ``Sandbox.snapshot``; plain: ``container.commit``);
- fork: start one sandbox from that snapshot (ours: ``SandboxBackend.fork``; plain: ``containers.run`` of the
  committed image); the first fork of each series is checked to hold the change.

Every operation first runs once untimed (first-use costs such as connecting to the daemon or exporting the local
backend's root filesystem are not what the rows are about). Every Docker container and image carries the managed
labels of ``run_id`` (:func:`skyrl_agent.sandbox.docker_backend.managed_labels`), so the reaper finds whatever a
crash leaves behind and :func:`leftovers` can check that nothing is.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from skyrl_agent.sandbox.base import SandboxBackend, SandboxError, SandboxSpec, Snapshot
from skyrl_agent.sandbox.pool import WarmPool

OPS = {
    "warm_acquire": "warm acquire (pool ready)",
    "cold_start": "cold create+start",
    "round_trip": "command round trip (`true`)",
    "snapshot": "snapshot",
    "fork": "fork from a snapshot",
}
SPEC = SandboxSpec()  # skyrl-sandbox:base, /workspace, the non-root `sandbox` user, the default limits
MARKER = "/workspace/.bench-marker"
READY_TIMEOUT_S = 120.0  # a warm pool that does not refill in this long is reported as failed


@dataclass(frozen=True)
class Counts:
    """Timed samples of each operation per repeat."""

    warm_acquire: int
    cold_start: int
    round_trip: int
    snapshot: int
    fork: int


DOCKER_COUNTS = Counts(warm_acquire=10, cold_start=10, round_trip=100, snapshot=8, fork=8)
PLAIN_COUNTS = Counts(warm_acquire=0, cold_start=10, round_trip=30, snapshot=8, fork=8)
LOCAL_COUNTS = Counts(warm_acquire=30, cold_start=30, round_trip=300, snapshot=30, fork=30)
QUICK_COUNTS = Counts(warm_acquire=2, cold_start=2, round_trip=3, snapshot=2, fork=2)


class Subject(Protocol):
    """One column: measures each operation ``n`` times and returns the samples in seconds."""

    name: str
    counts: Counts

    async def measure(self, op: str, n: int) -> list[float] | None:
        """``n`` timed samples of ``op`` after one untimed run, or None where the subject has no such operation."""
        ...

    async def close(self) -> None:
        """Remove everything the subject created."""
        ...


def _elapsed(start: float) -> float:
    return time.perf_counter() - start


# --- Ours -----------------------------------------------------------------------------------------------------------


class OurBackend:
    """Our backend through the public API: ``create``, ``WarmPool``, ``Sandbox.run``, ``snapshot``, ``fork``."""

    def __init__(self, name: str, backend: SandboxBackend, counts: Counts) -> None:
        self.name, self.backend, self.counts = name, backend, counts

    async def measure(self, op: str, n: int) -> list[float] | None:
        measure: Callable[[int], Awaitable[list[float]]] = getattr(self, f"_{op}")
        await measure(1)  # untimed: first-use costs
        return await measure(n)

    async def close(self) -> None:
        await self.backend.close()

    async def _cold_start(self, n: int) -> list[float]:
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            sandbox = await self.backend.create(SPEC)
            samples.append(_elapsed(start))
            await sandbox.close()
        return samples

    async def _warm_acquire(self, n: int) -> list[float]:
        pool = WarmPool(self.backend, SPEC, size=2)
        pool.start()
        samples = []
        try:
            for _ in range(n):
                await _until(lambda: pool.ready >= 1)
                start = time.perf_counter()
                sandbox = await pool.acquire()
                samples.append(_elapsed(start))
                await pool.release(sandbox)
        finally:
            await pool.close()
        return samples

    async def _round_trip(self, n: int) -> list[float]:
        sandbox = await self.backend.create(SPEC)
        try:
            samples = []
            for _ in range(n):
                start = time.perf_counter()
                result = await sandbox.run("true")
                samples.append(_elapsed(start))
                _check(result.exit_code == 0, f"`true` exited {result.exit_code} in {self.name}")
            return samples
        finally:
            await sandbox.close()

    async def _snapshot(self, n: int) -> list[float]:
        sandbox = await self.backend.create(SPEC)
        try:
            samples = []
            for index in range(n):
                await sandbox.run(f"echo {index} > {MARKER}")
                start = time.perf_counter()
                await sandbox.snapshot()
                samples.append(_elapsed(start))
            return samples
        finally:
            await sandbox.close()

    async def _fork(self, n: int) -> list[float]:
        snapshot = await self._marked_snapshot()
        samples = []
        for index in range(n):
            start = time.perf_counter()
            [fork] = await self.backend.fork(snapshot, 1, SPEC)
            samples.append(_elapsed(start))
            try:
                if index == 0:
                    marker = (await fork.run(f"cat {MARKER}")).output.strip()
                    _check(marker == "forked", f"a {self.name} fork does not hold the snapshot (read {marker!r})")
            finally:
                await fork.close()
        return samples

    async def _marked_snapshot(self) -> Snapshot:
        sandbox = await self.backend.create(SPEC)
        try:
            await sandbox.run(f"echo forked > {MARKER}")
            return await sandbox.snapshot()
        finally:
            await sandbox.close()


async def _until(ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            raise SandboxError(f"the warm pool had no ready sandbox after {READY_TIMEOUT_S:g} s")
        await asyncio.sleep(0.005)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise SandboxError(message)


# --- Plain docker-py ------------------------------------------------------------------------------------------------


def plain_run_kwargs(labels: dict[str, str]) -> dict[str, Any]:
    """``containers.run`` arguments giving the same isolation as our Docker backend's containers.

    With the same limits, user and init process on both sides, the columns differ in how commands reach the
    container (one ``exec_run`` each against a persistent shell), not in what the container is.
    """
    return {
        "detach": True,
        "user": SPEC.user,
        "working_dir": SPEC.workdir,
        "labels": labels,
        "network_mode": "none",
        "mem_limit": f"{SPEC.memory_mb}m",
        "memswap_limit": f"{SPEC.memory_mb}m",
        "nano_cpus": int(SPEC.cpus * 1e9),
        "pids_limit": SPEC.pids_limit,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "init": True,
    }


class PlainDockerPy:
    """The docker SDK used directly: ``containers.run``, one ``exec_run`` per command, ``commit``. Blocking calls."""

    name = "docker-py (plain)"
    counts = PLAIN_COUNTS

    def __init__(self, run_id: str, counts: Counts = PLAIN_COUNTS) -> None:
        from skyrl_agent.sandbox import docker_backend

        self.client = docker_backend.connect()
        # A lease keeps these containers from being taken for leaked by another process's reaper meanwhile.
        self.lease = docker_backend.Lease(run_id, ttl_s=60.0)
        self.lease.acquire(self.client)
        self.labels = docker_backend.managed_labels(run_id, "plain-docker-py", {}, owner=self.lease.owner)
        self.counts = counts
        self._images: list[str] = []

    async def measure(self, op: str, n: int) -> list[float] | None:
        if op == "warm_acquire":
            return None  # plain docker-py has no pool: the nearest thing is a cold start
        measure: Callable[[int], list[float]] = getattr(self, f"_{op}")
        measure(1)
        return measure(n)

    async def close(self) -> None:
        import docker.errors

        for image_id in self._images:
            try:
                self.client.images.remove(image_id, force=True)
            except docker.errors.NotFound:
                pass  # already gone; anything else is left for the final sweep by label
            except docker.errors.APIError as exc:
                print(f"warning: could not remove {image_id[:19]} ({exc}); the final sweep retries", flush=True)
        self.lease.release()
        self.client.close()

    def _run(self, image: str) -> Any:
        return self.client.containers.run(image, ["sleep", "infinity"], **plain_run_kwargs(self.labels))

    def _cold_start(self, n: int) -> list[float]:
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            container = self._run(SPEC.image)
            samples.append(_elapsed(start))
            container.remove(force=True)
        return samples

    def _round_trip(self, n: int) -> list[float]:
        container = self._run(SPEC.image)
        try:
            samples = []
            for _ in range(n):
                start = time.perf_counter()
                result = container.exec_run("true")
                samples.append(_elapsed(start))
                _check(result.exit_code == 0, f"`true` exited {result.exit_code} in plain docker-py")
            return samples
        finally:
            container.remove(force=True)

    def _commit(self, container: Any) -> str:
        image = container.commit(
            repository="skyrl-bench-plain", tag=uuid.uuid4().hex[:12], conf={"Labels": self.labels}
        )
        self._images.append(image.id)
        return str(image.id)

    def _snapshot(self, n: int) -> list[float]:
        container = self._run(SPEC.image)
        try:
            samples = []
            for index in range(n):
                container.exec_run(["sh", "-c", f"echo {index} > {MARKER}"])
                start = time.perf_counter()
                self._commit(container)
                samples.append(_elapsed(start))
            return samples
        finally:
            container.remove(force=True)

    def _fork(self, n: int) -> list[float]:
        container = self._run(SPEC.image)
        try:
            container.exec_run(["sh", "-c", f"echo forked > {MARKER}"])
            image = self._commit(container)
        finally:
            container.remove(force=True)
        samples = []
        for index in range(n):
            start = time.perf_counter()
            fork = self._run(image)
            samples.append(_elapsed(start))
            try:
                if index == 0:
                    marker = fork.exec_run(["cat", MARKER]).output.decode().strip()
                    _check(marker == "forked", f"a plain fork does not hold the snapshot (read {marker!r})")
            finally:
                fork.remove(force=True)
        return samples


# --- Subjects and cleanup -------------------------------------------------------------------------------------------


def make_subject(name: str, run_id: str, quick: bool) -> Subject:
    """The subject called ``name`` (``docker``, ``plain`` or ``local``); raises ``SandboxError`` if unavailable."""
    if name == "docker":
        from skyrl_agent.sandbox.docker_backend import DockerBackend

        # Any: fork() returns list[DockerSandbox], which mypy does not accept as list[Sandbox] (lists are invariant).
        docker: Any = DockerBackend(run_id=run_id)
        return OurBackend("docker (ours)", docker, QUICK_COUNTS if quick else DOCKER_COUNTS)
    if name == "local":
        from skyrl_agent.sandbox.local_backend import LocalBackend

        local: Any = LocalBackend()
        return OurBackend("local (ours)", local, QUICK_COUNTS if quick else LOCAL_COUNTS)
    if name == "plain":
        return PlainDockerPy(run_id, QUICK_COUNTS if quick else PLAIN_COUNTS)
    raise ValueError(f"unknown subject {name!r}")


def leftovers(run_prefix: str, *, remove: bool) -> dict[str, list[str]]:
    """Managed containers and images whose ``skyrl.run`` starts with ``run_prefix``; removed first if ``remove``.

    Returns what is still there afterwards (short ids), and under ``removed`` what this call removed.
    """
    from skyrl_agent.sandbox import docker_backend

    client = docker_backend.connect()
    try:
        removed: list[str] = []
        if remove:
            containers, images = _ours(client, run_prefix)
            removed += [c.short_id for c in containers if docker_backend.remove_container(c)]
            removed += [i.short_id for i in images if docker_backend.remove_image(client, i)]
        containers, images = _ours(client, run_prefix)
        return {
            "containers": [c.short_id for c in containers],
            "images": [i.short_id for i in images],
            "removed": removed,
        }
    finally:
        client.close()


def _ours(client: Any, run_prefix: str) -> tuple[list[Any], list[Any]]:
    from skyrl_agent.sandbox.docker_backend import list_managed

    containers, images = list_managed(client, None)
    mine = [c for c in containers if c.labels.get("skyrl.run", "").startswith(run_prefix)]
    return mine, [i for i in images if i.labels.get("skyrl.run", "").startswith(run_prefix)]
