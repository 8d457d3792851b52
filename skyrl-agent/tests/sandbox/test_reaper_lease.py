"""Ownership by lease: a run that shares the daemon never reaps another run's live sandboxes, only expired ones.

Run A lives in a PID namespace of its own where one can be made (as for two containerised runs on one host, or
runs on hosts sharing a remote daemon): its process is invisible in the reaper's ``/proc``. Only A's lease, kept
with the daemon, tells the reaper that A is alive.

A slow daemon (a renewal request that hangs for longer than the lease has left, a renewal that lands while a
reaper decides) must not cost a live owner its sandboxes; an owner that stopped renewing is still reaped.
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
from collections.abc import Callable, Iterator
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import docker
import pytest
import requests.exceptions

from skyrl_agent.sandbox import docker_backend, reaper
from skyrl_agent.sandbox.docker_backend import Lease, containers_of_run, managed_labels

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


@pytest.mark.docker
@pytest.mark.slow
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


# --- A slow daemon -------------------------------------------------------------------------------------------------


class SlowDaemon:
    """The daemon as its clients see it: a volume create sent while ``hangs()`` says so answers after ``hang_s``.

    A client whose request timeout is shorter gives up first, with ``ReadTimeout``, and the volume is not made.
    """

    def __init__(self, hang_s: float, hangs: Callable[[], bool]) -> None:
        self.hang_s = hang_s
        self.hangs = hangs
        self.creates = 0

    def connect(self, timeout_s: float) -> Any:
        """A client whose requests time out after ``timeout_s`` (a :class:`Lease`'s ``connect_renewals``)."""
        return _SlowClient(self, docker.from_env(timeout=timeout_s), timeout_s)


class _SlowClient:
    def __init__(self, daemon: SlowDaemon, client: Any, timeout_s: float) -> None:
        self.api = client.api
        self.volumes = _SlowVolumes(daemon, client, timeout_s)
        self.close = client.close


class _SlowVolumes:
    def __init__(self, daemon: SlowDaemon, client: Any, timeout_s: float) -> None:
        self._daemon, self._client, self._timeout_s = daemon, client, timeout_s

    def create(self, **kwargs: Any) -> Any:
        self._daemon.creates += 1
        if self._daemon.hangs():
            time.sleep(min(self._daemon.hang_s, self._timeout_s))
            if self._daemon.hang_s > self._timeout_s:
                raise requests.exceptions.ReadTimeout(f"no answer within {self._timeout_s:g} s")
        return self._client.volumes.create(**kwargs)


@pytest.fixture
def client() -> Iterator[Any]:
    client = docker_backend.connect()
    yield client
    client.close()


@pytest.fixture
def run_id() -> Iterator[str]:
    """A fresh run id; afterwards none of its containers, images or leases is left."""
    run_id = f"skyrl-test-slow-{uuid.uuid4().hex[:6]}"
    yield run_id
    reaper.reap(run_id, dead_only=False)


STAMP_S = 1.5  # more than a lease may outlive its ttl by: the reaper reads a whole-second stamp as its end


def _sandbox_of(client: Any, run_id: str, owner: str) -> str:
    """A container labelled as a backend labels its sandboxes; its short id."""
    labels = managed_labels(run_id, "ep", {}, owner=owner)
    image = "skyrl-sandbox:base"
    return str(client.containers.run(image, ["sleep", "300"], detach=True, network_mode="none", labels=labels).short_id)


def _exists(client: Any, container_id: str) -> bool:
    try:
        client.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


def test_an_owner_that_renewed_between_the_listings_survives() -> None:
    def lease(name: str, owner: str, created_s: float) -> reaper.LeaseRecord:
        return reaper.LeaseRecord(name, owner, created_s, ttl_s=4.0)

    first = [lease("late-1", "late", 0.0), lease("dead-1", "dead", 0.0), lease("live-1", "live", 8.0)]
    # "late" made a volume while the reaper waited; its stamp alone says expired (a daemon slow to make it).
    second = [*first, lease("late-2", "late", 1.0)]
    assert reaper.confirmation_s(first, {"late", "dead"}) == 1.0  # their renewal period
    assert reaper.confirmation_s(first, {"without-a-lease"}) == 0.0  # not renewing: nothing to wait for
    assert reaper.survivors(first, second, 10.0, unsuspected={"kept"}) == {"late", "live", "kept"}


@pytest.mark.docker
@pytest.mark.slow
def test_a_renewal_request_that_hangs_does_not_let_another_run_reap_live_sandboxes(client: Any, run_id: str) -> None:
    ttl_s = 4.0
    # The first renewal request hangs for two leases, far past the three quarters of one it has left.
    daemon = SlowDaemon(hang_s=2 * ttl_s, hangs=chain([True], repeat(False)).__next__)
    lease = Lease(run_id, ttl_s, connect_renewals=daemon.connect)
    lease.acquire(client)
    try:
        sandbox = _sandbox_of(client, run_id, lease.owner)
        removed, lapsed = [], False
        deadline = time.monotonic() + 2 * ttl_s
        while time.monotonic() < deadline:  # another run's reaper, all along
            removed += reaper.reap(run_id).containers
            lapsed = lapsed or lease.lapsed
        assert removed == []
        assert _exists(client, sandbox)
        assert not lapsed
        assert daemon.creates > 3  # the hung request was given up and retried, and renewals went on
    finally:
        lease.release()


@pytest.mark.docker
def test_a_renewal_that_lands_during_the_confirmation_keeps_the_owners_sandbox(client: Any, run_id: str) -> None:
    ttl_s, owner = 1.0, reaper.new_owner_id()
    labels = reaper.lease_labels(owner, run_id, ttl_s)
    client.volumes.create(name=f"skyrl-lease-{owner}-1", labels=labels)
    sandbox = _sandbox_of(client, run_id, owner)
    time.sleep(ttl_s + STAMP_S)  # expired by the daemon's clock: the owner is suspect
    waits: list[float] = []

    def renewal_lands(seconds: float) -> None:
        waits.append(seconds)
        client.volumes.create(name=f"skyrl-lease-{owner}-2", labels=labels)

    report = reaper.reap(run_id, wait=renewal_lands)
    assert waits == [ttl_s / 4]
    assert report.containers == []
    assert report.leases == []
    assert _exists(client, sandbox)


@pytest.mark.docker
def test_an_owner_that_never_renews_is_reaped_after_the_confirmation(client: Any, run_id: str) -> None:
    ttl_s, owner = 1.0, reaper.new_owner_id()
    client.volumes.create(name=f"skyrl-lease-{owner}-1", labels=reaper.lease_labels(owner, run_id, ttl_s))
    sandbox = _sandbox_of(client, run_id, owner)
    time.sleep(ttl_s + STAMP_S)  # no renewal: expired by the daemon's clock

    waits: list[float] = []
    report = reaper.reap(run_id, wait=waits.append)
    assert waits == [ttl_s / 4]
    assert report.containers == [sandbox]
    assert report.leases == [f"skyrl-lease-{owner}-1"]
    assert not _exists(client, sandbox)


@pytest.mark.docker
@pytest.mark.slow
def test_an_owner_whose_renewals_all_hang_knows_its_lease_lapsed_and_is_reaped(
    client: Any, run_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    ttl_s = 2.0
    daemon = SlowDaemon(hang_s=60.0, hangs=lambda: True)  # as good as a daemon that never answers
    lease = Lease(run_id, ttl_s, connect_renewals=daemon.connect)
    lease.acquire(client)
    try:
        sandbox = _sandbox_of(client, run_id, lease.owner)
        lapsed_at_first = lease.lapsed
        removed: list[str] = []
        deadline = time.monotonic() + 4 * ttl_s
        while not removed and time.monotonic() < deadline:
            removed = reaper.reap(run_id).containers
        assert removed == [sandbox]
        assert not lapsed_at_first
        assert lease.lapsed
        deadline = time.monotonic() + 1.0  # the error comes with the first renewal that fails after the lapse
        while "may have expired" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "may have expired" in caplog.text
    finally:
        lease.release()


@pytest.mark.docker
def test_a_backend_whose_lease_may_have_lapsed_refuses_its_sandboxes_as_the_infrastructures_failure() -> None:
    import asyncio

    from skyrl_agent.sandbox.base import SandboxSpec, SandboxUnavailableError
    from skyrl_agent.sandbox.docker_backend import DockerBackend

    async def scenario() -> None:
        backend = DockerBackend()
        try:
            sandbox = await backend.create(SandboxSpec())
            assert (await sandbox.run("echo ok")).output.strip() == "ok"
            renewed = backend._lease._renewed_at
            backend._lease._renewed_at = renewed - 10 * backend._lease.ttl_s  # no renewal got through for long
            with pytest.raises(SandboxUnavailableError, match="may have lapsed"):
                await sandbox.run("echo ok")
            with pytest.raises(SandboxUnavailableError, match="may have lapsed"):
                await backend.create(SandboxSpec())
            backend._lease._renewed_at = renewed  # a renewal got through: the sandbox is usable again
            assert (await sandbox.run("echo ok")).output.strip() == "ok"
        finally:
            await backend.close()

    asyncio.run(scenario())
