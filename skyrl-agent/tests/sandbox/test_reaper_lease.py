"""Ownership by lease: a run that shares the daemon never reaps another run's live sandboxes, only expired ones.

Run A lives in a PID namespace of its own where one can be made (as for two containerised runs on one host, or
runs on hosts sharing a remote daemon): its process is invisible in the reaper's ``/proc``. Only A's lease, kept
with the daemon, tells the reaper that A is alive.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from skyrl_agent.sandbox import reaper
from skyrl_agent.sandbox.docker_backend import containers_of_run

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TTL_S = 3.0
CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from skyrl_agent.sandbox.base import SandboxSpec
    from skyrl_agent.sandbox.docker_backend import DockerBackend

    async def main():
        backend = DockerBackend(run_id=sys.argv[1])
        await backend.create(SandboxSpec(memory_mb=256, pids_limit=64))
        print("ready", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def _own_pid_namespace() -> list[str]:
    """A command prefix that starts the child in a new PID namespace (dying with its parent), where permitted."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        return []
    probe = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    return [unshare, "--pid", "--fork", "--mount-proc", "--kill-child"] if probe.returncode == 0 else []


def _leaf(pid: int) -> int:
    """The innermost descendant of ``pid`` along first children (the Python child under ``unshare``)."""
    while True:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not children:
            return pid
        pid = int(children[0])


@pytest.fixture
def run_a() -> Iterator[tuple[str, int]]:
    """Run A: one live sandbox whose owner renews a ``TTL_S`` lease; yields its run id and the owner's pid."""
    run_id = f"skyrl-test-lease-a-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "SKYRL_LEASE_TTL_S": str(TTL_S)}
    argv = [*_own_pid_namespace(), sys.executable, "-c", CHILD, run_id]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield run_id, _leaf(proc.pid)
    finally:
        owner = _leaf(proc.pid) if proc.poll() is None else None
        proc.kill()
        if owner is not None and owner != proc.pid:
            os.kill(owner, signal.SIGKILL)
        proc.wait()
        reaper.reap(run_id, dead_only=False)


def _lease_volumes(run_id: str) -> list[str]:
    client = docker.from_env()
    try:
        filters = {"label": ["skyrl.lease", f"skyrl.run={run_id}"]}
        return [volume.name for volume in client.volumes.list(filters=filters)]
    finally:
        client.close()


def test_reaping_from_another_run_keeps_live_sandboxes_and_removes_expired_ones(run_a: tuple[str, int]) -> None:
    run_id, owner_pid = run_a
    assert len(containers_of_run(run_id)) == 1
    report = reaper.reap(run_id)  # from this process, where A's PID means nothing
    assert report.containers == []
    time.sleep(TTL_S + 1.5)  # longer than one lease: A's renewals keep it alive
    assert reaper.reap(run_id).containers == []
    assert len(containers_of_run(run_id)) == 1

    os.kill(owner_pid, signal.SIGSTOP)  # A stops renewing (hung, or as good as dead)
    deadline = time.monotonic() + 30
    removed: list[str] = []
    while not removed and time.monotonic() < deadline:
        removed = reaper.reap(run_id).containers
        time.sleep(0.5)
    assert len(removed) == 1
    assert containers_of_run(run_id) == []
    assert _lease_volumes(run_id) == []  # the expired lease goes with them
