"""Shared fixtures: backends to test against, and a session check that no managed container is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from skyrl_agent.sandbox import reaper
from skyrl_agent.sandbox.base import SandboxBackend, SandboxSpec


def _managed_containers() -> list[str] | None:
    """IDs of managed containers whose owner is a backend of this process, or None when Docker is not usable.

    Other processes sharing the daemon (another test session, a run) own theirs: they are not this session's leaks.
    """
    if shutil.which("docker") is None:
        return None
    proc = subprocess.run(
        ["docker", "ps", "-a", "--filter", "label=skyrl.managed", "--format", '{{.ID}} {{.Label "skyrl.owner"}}'],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return None
    mine = reaper.new_owner_id().rsplit("-", 1)[0] + "-"  # host-pid-
    rows = (line.partition(" ") for line in proc.stdout.splitlines())
    return [cid for cid, _, owner in rows if owner.startswith(mine)]


@pytest.fixture(scope="session", autouse=True)
def no_leaked_containers() -> Iterator[None]:
    before = set(_managed_containers() or [])
    yield
    leaked = set(_managed_containers() or []) - before
    if leaked:
        subprocess.run(["docker", "rm", "-f", *leaked], capture_output=True, check=False)
        pytest.fail(f"tests leaked managed containers: {sorted(leaked)}")


def make_backend(kind: str) -> SandboxBackend:
    if kind == "docker":
        from skyrl_agent.sandbox.docker_backend import DockerBackend

        return DockerBackend(run_id="skyrl-test")
    from skyrl_agent.sandbox.local_backend import LocalBackend, export_rootfs

    return LocalBackend(export_rootfs())


def snapshots_left(backend: SandboxBackend) -> list[str]:
    """The snapshots ``backend`` still keeps on disk: its committed images (docker) or its layer dirs (local)."""
    from skyrl_agent.sandbox.docker_backend import DockerBackend
    from skyrl_agent.sandbox.local_backend import LocalBackend

    if isinstance(backend, DockerBackend):
        owner = f"label=skyrl.owner={backend.owner}"
        args = ["docker", "images", "-q", "--no-trunc", "--filter", owner, "--filter", "label=skyrl.kind=snapshot"]
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()
    assert isinstance(backend, LocalBackend)
    return sorted(str(layer) for layer in backend.work_dir.glob("snap-*"))


@pytest.fixture(params=["docker", "local"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


SPEC = SandboxSpec(memory_mb=256, pids_limit=64)


def in_sandbox(kind: str, body: Callable[[Any, SandboxBackend], Awaitable[None]], spec: SandboxSpec = SPEC) -> None:
    """Run ``body(sandbox, backend)`` against a fresh sandbox of ``kind``; everything is closed afterwards."""

    async def main() -> None:
        backend = make_backend(kind)
        try:
            sandbox = await backend.create(spec)
            try:
                await body(sandbox, backend)
            finally:
                await sandbox.close()
        finally:
            await backend.close()

    asyncio.run(main())


@contextlib.contextmanager
def host_cluster(**env: str) -> Iterator[Any]:
    """Two Ray nodes offering ``sandbox_host``, this process connected to them; ``env`` is set for the nodes'
    processes (the hosts' actors inherit it)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install ray")
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"sandbox_host": 1}})
        nodes.add_node(num_cpus=1, resources={"sandbox_host": 1})
        ray.init(address=nodes.address, log_to_driver=False, configure_logging=False)
        nodes.wait_for_nodes()
        try:
            yield nodes
        finally:
            ray.shutdown()
            nodes.shutdown()  # type: ignore[no-untyped-call]
