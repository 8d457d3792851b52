"""Docker-only behaviour: labels, an unreachable daemon, the model socket, the warm pool and the reaper."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from skyrl_agent.sandbox import docker_backend, reaper
from skyrl_agent.sandbox.base import MODEL_SOCKET_MOUNT, SandboxError, SandboxSpec, SandboxUnavailableError
from skyrl_agent.sandbox.docker_backend import DockerBackend
from skyrl_agent.sandbox.pool import WarmPool
from skyrl_agent.sandbox.session_socket import FORWARD_PORT, SessionSocket

from .conftest import SPEC


def test_unreachable_daemon_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/closed.sock")
    start = time.monotonic()
    with pytest.raises(SandboxUnavailableError, match="no Docker engine"):
        asyncio.run(DockerBackend().create(SandboxSpec()))
    assert time.monotonic() - start < 10


@pytest.mark.docker
def test_containers_are_labelled_and_hardened() -> None:
    async def main() -> None:
        backend = DockerBackend(run_id="skyrl-test-labels")
        try:
            sb = await backend.create(SandboxSpec(labels={"team": "x"}), episode="ep1")
            sb.container.reload()
            labels = sb.container.labels
            host = sb.container.attrs["HostConfig"]
            assert labels["skyrl.managed"] == "1"
            assert labels["skyrl.run"] == "skyrl-test-labels"
            assert labels["skyrl.episode"] == "ep1"
            assert labels["team"] == "x"
            assert labels["skyrl.owner"] == backend.owner
            leases = docker_backend.list_leases(backend._client, "skyrl-test-labels")
            now_s = docker_backend.daemon_time_s(backend._client)
            assert reaper.live_owners(leases, now_s) == {backend.owner}
            assert host["NetworkMode"] == "none"
            assert host["CapDrop"] == ["ALL"]
            assert host["Init"] is True
            assert host["PidsLimit"] == 256
            assert host["Memory"] == 1024 * 1024 * 1024
        finally:
            await backend.close()

    asyncio.run(main())


@pytest.mark.docker
def test_a_model_socket_is_the_containers_one_way_out_and_outlives_commands_and_runners() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"model:" + await reader.readline())
        await writer.drain()
        writer.close()

    script = f"import socket; s = socket.create_connection(('127.0.0.1', {FORWARD_PORT}), 5); s.sendall(b'hi\\n')"
    ask = shlex.join(["python3", "-I", "-c", f"{script}; print(s.makefile().read())"])

    async def main() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)  # the host's loopback only
        model_socket = SessionSocket()
        backend = DockerBackend(run_id="skyrl-test-model-socket")
        try:
            await model_socket.serve("127.0.0.1", server.sockets[0].getsockname()[1])
            sb = await backend.create(SandboxSpec(model_socket_dir=model_socket.directory))
            sb.container.reload()
            assert sb.container.attrs["HostConfig"]["NetworkMode"] == "none"
            (mount,) = sb.container.attrs["Mounts"]
            assert (mount["Destination"], mount["RW"]) == (MODEL_SOCKET_MOUNT, False)
            assert (await sb.run(ask)).output == "model:hi\n\n"
            assert (await sb.run(f"touch {MODEL_SOCKET_MOUNT}/x")).exit_code != 0  # read-only
            # Commands' leftovers are killed after each, and a respawned runner sweeps: the forwarder stays.
            result = await sb.run("sleep 305 & kill -9 $PPID; sleep 306", timeout_s=20)
            assert result.timed_out
            assert (await sb.run(ask)).output == "model:hi\n\n"
        finally:
            await backend.close()
            await model_socket.close()
            server.close()

    asyncio.run(main())


@pytest.mark.docker
@pytest.mark.slow
def test_warm_pool_acquire_is_fast_and_refills() -> None:
    async def main() -> None:
        backend = DockerBackend(run_id="skyrl-test-pool")
        pool = WarmPool(backend, SPEC, size=2)
        try:
            pool.start()
            for _ in range(200):
                if pool.ready == 2:
                    break
                await asyncio.sleep(0.05)
            assert pool.ready == 2
            taking = asyncio.ensure_future(pool.acquire())
            await asyncio.sleep(0)  # one turn of the loop: a ready sandbox is handed out without waiting on a start
            assert taking.done()
            sb = taking.result()
            assert (await sb.run("echo pooled")).output == "pooled\n"
            await pool.release(sb)
            for _ in range(200):
                if pool.ready == 2:
                    break
                await asyncio.sleep(0.05)
            assert pool.ready == 2
        finally:
            await pool.close()
            await backend.close()

    asyncio.run(main())


def _start_labelled(owner: str) -> str:
    proc = subprocess.run(
        ["docker", "run", "-d", "--network", "none", "-l", "skyrl.managed=1", "-l", "skyrl.run=skyrl-test-dead",
         "-l", f"skyrl.owner={owner}", "skyrl-sandbox:base", "sleep", "300"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout.strip()


def _exists(cid: str) -> bool:
    return subprocess.run(["docker", "inspect", cid], capture_output=True, check=False).returncode == 0


@pytest.mark.docker
def test_reap_removes_dead_runs_and_keeps_live_ones() -> None:
    client = docker_backend.connect()
    lease = docker_backend.Lease("skyrl-test-dead", ttl_s=60.0)
    lease.acquire(client)
    dead = _start_labelled("an-owner-without-a-lease")
    alive = _start_labelled(lease.owner)
    try:
        report = reaper.reap("skyrl-test-dead")
        assert dead[:12] in report.containers
        assert not _exists(dead)
        assert _exists(alive)
        report = reaper.reap("skyrl-test-dead", dead_only=False)
        assert not _exists(alive)
        assert len(report.leases) == 1  # the live owner's lease went with everything else
    finally:
        lease.release()
        client.close()
        subprocess.run(["docker", "rm", "-f", dead, alive], capture_output=True, check=False)


@pytest.mark.docker
def test_a_closed_backend_releases_its_lease() -> None:
    async def main() -> str:
        backend = DockerBackend(run_id="skyrl-test-release")
        try:
            await backend.create(SPEC)
            assert len(docker_backend.list_leases(backend._client, "skyrl-test-release")) == 1
        finally:
            await backend.close()
        return backend.owner

    asyncio.run(main())
    client = docker_backend.connect()
    try:
        assert docker_backend.list_leases(client, "skyrl-test-release") == []
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.slow
def test_sigkilled_run_is_reaped_once_its_lease_expires() -> None:
    child = textwrap.dedent(
        """
        import asyncio, sys, time
        from skyrl_agent.sandbox.docker_backend import DockerBackend
        from skyrl_agent.sandbox.base import SandboxSpec
        async def main():
            backend = DockerBackend(run_id="skyrl-test-killed")
            await backend.create(SandboxSpec())
            await backend.create(SandboxSpec())
            print("ready", flush=True)
            time.sleep(300)
        asyncio.run(main())
        """
    )
    env = {**os.environ, "SKYRL_LEASE_TTL_S": "2"}
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    removed: list[str] = []
    deadline = time.monotonic() + 30
    while len(removed) < 2 and time.monotonic() < deadline:
        removed += reaper.reap("skyrl-test-killed").containers
        time.sleep(0.5)
    assert len(removed) == 2
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=skyrl.run=skyrl-test-killed"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""


@pytest.mark.docker
def test_cli_reap(capsys: pytest.CaptureFixture[str]) -> None:
    from skyrl_agent.cli import main

    assert main(["reap", "--run", "skyrl-test-nothing"]) == 0
    assert "removed 0 containers" in capsys.readouterr().out


@pytest.mark.docker
def test_a_sandbox_not_closed_within_its_lifetime_is_removed_unless_kept_alive() -> None:
    async def main() -> None:
        backend = DockerBackend(run_id="skyrl-test-lifetime", lifetime_s=1.0)
        try:
            forgotten = await backend.create(SPEC)
            kept = await backend.create(SPEC)
            kept.keep_alive(60.0)
            kept.keep_alive(0.5)  # a promise is never shortened
            await asyncio.sleep(3.0)
            assert backend.expired == [forgotten.id]
            with pytest.raises(SandboxError):
                await forgotten.run("echo hi")
            assert (await kept.run("echo hi")).output == "hi\n"
            assert [c.id for c in docker_backend.containers_of_run("skyrl-test-lifetime")] == [kept.container.id]
        finally:
            await backend.close()
        assert docker_backend.containers_of_run("skyrl-test-lifetime") == []

    asyncio.run(main())


def test_lifetime_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lifetime_s must be a positive"):
        DockerBackend(lifetime_s=0)
