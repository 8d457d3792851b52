"""RayHostBackend: sandboxes placed on the Ray nodes that offer ``sandbox_host``, served by one actor per node.

One module-scoped cluster of two such nodes (Ray starts in seconds, so the tests share it); the hosts run the
``process`` backend, except one short Docker test. The last tests add a third node and remove it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyrl_agent import cli
from skyrl_agent.dispatch.retry import is_infra_error
from skyrl_agent.integrations.swe_config import SWEGeneratorConfig
from skyrl_agent.sandbox.base import SandboxClosedError, SandboxError, SandboxSpec, SandboxStartError
from skyrl_agent.sandbox.ray_hosts import RayHostBackend, RayHostSettings, RaySandbox, SandboxHostLostError
from skyrl_agent.tasks.validate import make_backend

from .conftest import host_cluster

SPEC = SandboxSpec()
PROCESS_HOSTS = RayHostSettings(inner="process", max_sandboxes=2, start_timeout_s=60, place_wait_s=1.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two nodes offering ``sandbox_host``; this process is connected to them."""
    with host_cluster() as nodes:
        yield nodes


def _sandbox(sandbox: object) -> RaySandbox:
    assert isinstance(sandbox, RaySandbox)
    return sandbox


async def _until_lost(sandbox: RaySandbox, within_s: float = 60.0) -> None:
    """Call ``sandbox`` until its host is known dead; every call meanwhile must fail as a lost host."""
    deadline = time.monotonic() + within_s
    while sandbox.host.gone is None:
        assert time.monotonic() < deadline, "Ray did not report the host dead in time"
        with pytest.raises(SandboxHostLostError):
            await sandbox.run("true")
        await asyncio.sleep(0.2)


def _assert_stopped(backend: RayHostBackend, within_s: float = 60.0) -> None:
    """Every host actor is gone: ``ray.kill`` is asynchronous, so a call right after it may still be served."""
    import ray

    deadline = time.monotonic() + within_s
    for host in backend.hosts:
        while True:
            try:
                ray.get(host.actor.ready.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, f"the host actor on node {host.node_id[:12]} still answers"
            time.sleep(0.5)


@pytest.mark.ray
def test_sandboxes_spread_over_hosts_and_work_through_the_proxy(cluster: Any) -> None:
    async def main() -> None:
        backend = RayHostBackend(PROCESS_HOSTS)
        try:
            boxes = [await backend.create(SPEC) for _ in range(4)]
            assert sorted(Counter(box.host.node_id for box in boxes).values()) == [2, 2]
            assert [host.inner for host in backend.hosts] == ["process", "process"]
            with pytest.raises(SandboxStartError, match="holds 2 of its 2 sandboxes and no place for 1 more freed"):
                await backend.create(SPEC)
            with pytest.raises(SandboxStartError, match="holds 2 sandboxes, not 3"):
                await backend.fork(await boxes[0].snapshot(), 3, SPEC)
            # Every place is taken: a start waits for one to free, then takes it.
            waiting = asyncio.ensure_future(backend.create(SPEC))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            await boxes[3].close()
            boxes[3] = await asyncio.wait_for(waiting, 30)
            assert (await boxes[3].run("echo placed")).output == "placed\n"
            box = boxes[0]
            assert not box.expires  # a process sandbox has no lifetime: keep_alive sends nothing
            await box.write_file("hello.txt", "hi\n")
            result = await box.run("cat hello.txt; exit 3")
            assert (result.output, result.exit_code) == ("hi\n", 3)
            assert await box.read_file("hello.txt") == b"hi\n"
            with pytest.raises(FileNotFoundError):
                await box.read_file("missing.txt")
            snapshot = await box.snapshot()
            assert snapshot.ref.startswith(f"{box.host.node_id}/process/")
            sibling = next(other for other in boxes[1:] if other.host is box.host)
            await sibling.close()  # a free place on the snapshot's host
            [fork] = [_sandbox(one) for one in await backend.fork(snapshot, 1, SPEC)]
            assert fork.host is box.host
            await fork.write_file("hello.txt", "changed\n")
            assert await fork.read_file("hello.txt") == b"changed\n"
            assert await box.read_file("hello.txt") == b"hi\n"  # the fork is a copy
            await box.close()
            await box.close()
            with pytest.raises(SandboxClosedError):
                await box.run("true")
        finally:
            await backend.close()
        await backend.close()
        _assert_stopped(backend)

    asyncio.run(main())


@pytest.mark.ray
def test_hosts_run_a_backend_the_caller_makes(cluster: Any) -> None:
    from skyrl_agent.sandbox.memory import InMemoryBackend

    async def main() -> None:
        backend = RayHostBackend(PROCESS_HOSTS, make_inner=InMemoryBackend)  # as the scale benchmark's simulated hosts
        try:
            assert [host.inner for host in backend.hosts] == ["memory", "memory"]
            box = await backend.create(SPEC)
            assert (await box.run("echo in memory")).output == "in memory\n"
        finally:
            await backend.close()

    asyncio.run(main())


@pytest.mark.ray
def test_a_dead_host_loses_its_sandboxes_and_new_ones_go_to_the_live_host(cluster: Any) -> None:
    import ray

    async def main() -> None:
        backend = RayHostBackend(PROCESS_HOSTS)
        try:
            doomed, survivor = await backend.create(SPEC), await backend.create(SPEC)
            assert doomed.host is not survivor.host
            snapshot = await doomed.snapshot()
            ray.kill(doomed.host.actor, no_restart=True)
            await _until_lost(doomed)
            assert backend.live_hosts == [survivor.host]
            with pytest.raises(SandboxHostLostError) as lost:
                await doomed.read_file("anything")
            assert is_infra_error(lost.value)  # the dispatcher retries it on a new sandbox
            with pytest.raises(SandboxHostLostError):
                await backend.fork(snapshot, 1, SPEC)
            await doomed.close()  # nothing to close, and no error
            newcomer = await backend.create(SPEC)
            assert newcomer.host is survivor.host
            assert (await newcomer.run("echo ok")).output == "ok\n"
            with pytest.raises(SandboxStartError):  # the live host is full (2 places)
                await backend.create(SPEC)
        finally:
            await backend.close()
        _assert_stopped(backend)

    asyncio.run(main())


@pytest.mark.ray
def test_a_removed_node_loses_its_sandboxes(cluster: Any) -> None:
    node = cluster.add_node(num_cpus=1, resources={"sandbox_host": 1})
    cluster.wait_for_nodes()

    async def main() -> None:
        backend = RayHostBackend(RayHostSettings(inner="process", max_sandboxes=1, start_timeout_s=60))
        try:
            boxes = [await backend.create(SPEC) for _ in range(3)]
            on_node = next(box for box in boxes if box.host.node_id == node.node_id)
            cluster.remove_node(node)
            await _until_lost(on_node)
            assert len(backend.live_hosts) == 2
            await on_node.close()
            for box in boxes:
                if box is not on_node:
                    assert (await box.run("echo alive")).output == "alive\n"
        finally:
            await backend.close()

    asyncio.run(main())


@pytest.mark.ray
@pytest.mark.docker
def test_docker_hosts_run_commands_and_hear_only_the_promises_that_matter(cluster: Any) -> None:
    # The docker marker: the root conftest skips this by hand without Docker, and fails it in CI.

    async def main() -> None:
        settings = RayHostSettings(inner="docker", max_sandboxes=2, start_timeout_s=60)
        backend = RayHostBackend(settings, run_id="skyrl-test-ray-lifetime", lifetime_s=4.0)
        try:
            spec = SandboxSpec(memory_mb=256, pids_limit=64)
            kept, forgotten = [_sandbox(await backend.create(spec)) for _ in "ab"]
            await kept.write_file("/tmp/x", "docker\n")
            result = await kept.run("cat /tmp/x && id -un")
            assert (result.output, result.exit_code) == ("docker\nsandbox\n", 0)
            assert (kept.expires, forgotten.expires) == (True, True)  # Docker sandboxes with a lifetime
            kept.keep_alive(2.0)
            forgotten.keep_alive(2.0)
            await asyncio.sleep(0.5)
            assert backend.promises_sent == 0  # within the lifetime: the host hears nothing
            kept.keep_alive(30.0)
            kept.keep_alive(20.0)  # a promise is never shortened, and one call carries both
            await asyncio.sleep(6.0)  # past the lifetime: sent a quarter of it before the end
            assert backend.promises_sent == 1  # to the kept one
            assert (await kept.run("echo still here")).output == "still here\n"
            with pytest.raises(SandboxError):
                await forgotten.run("echo gone")
            await kept.close()
            await forgotten.close()
        finally:
            await backend.close()

    asyncio.run(main())


def test_run_takes_the_ray_backend_and_its_address(tmp_path: Path) -> None:
    argv = ["run", "--model", "scripted:oracle", "--out", str(tmp_path), "--backend", "ray"]
    args = cli.build_parser().parse_args([*argv, "--ray-address", "ray://head:10001"])
    assert (args.backend, args.ray_address) == ("ray", "ray://head:10001")
    assert cli.build_parser().parse_args(argv).ray_address is None
    no_ray = ["run", "--model", "scripted:oracle", "--out", str(tmp_path), "--ray-address", "auto"]
    assert cli.main(no_ray) == 2  # an address without --backend ray is refused


def test_the_train_settings_name_the_hosts() -> None:
    settings = SWEGeneratorConfig(
        backend="ray", ray_address="auto", ray_host_backend="process", max_sandboxes_per_host=3
    )
    assert settings.ray_hosts() == RayHostSettings(address="auto", inner="process", max_sandboxes=3)
    with pytest.raises(ValueError, match="max_sandboxes_per_host"):
        SWEGeneratorConfig(backend="ray", max_sandboxes_per_host=0)
    with pytest.raises(ValueError, match="inner must be one of"):
        RayHostSettings(inner="podman")


def test_without_ray_the_backend_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    with pytest.raises(ValueError, match="pip install ray"):
        make_backend("ray")


def test_a_promise_reaches_the_host_only_when_the_sandbox_would_end_before_it() -> None:
    """The driver's side of keep_alive, on a recording actor: what is sent, when, and what a close cancels."""
    from types import SimpleNamespace

    from skyrl_agent.sandbox.ray_hosts import _Host

    sent: list[tuple[str, float]] = []
    actor = SimpleNamespace(
        keep_alive=SimpleNamespace(remote=lambda key, seconds: sent.append((key, seconds))),
        close=SimpleNamespace(remote=lambda key: asyncio.sleep(0)),  # awaited, as an ObjectRef is
    )
    backend: Any = SimpleNamespace(promises_sent=0, release=lambda host, n: None)
    host = _Host("node", actor, "docker")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        # A lifetime of 0.8 s from a start asked for just now: promises go out 0.2 s (a quarter) before its end.
        box = RaySandbox(backend, host, "a", "id-a", expires_in=0.8, asked_at=now)
        box.keep_alive(0.5)
        await asyncio.sleep(0.9)
        assert sent == []  # within the lifetime: nothing sent, ever
        box.keep_alive(5.0)
        box.keep_alive(3.0)  # shorter: folded into the first
        await asyncio.sleep(0.05)
        assert [key for key, _ in sent] == ["a"]  # past its known end already: sent at once, one call
        assert sent[0][1] == pytest.approx(5.0, abs=0.5)  # the seconds left at sending
        box.keep_alive(4.0)  # within what the host now holds
        await asyncio.sleep(0.05)
        assert len(sent) == 1
        never = RaySandbox(backend, host, "b", "id-b", expires_in=0.8, asked_at=loop.time())
        never.keep_alive(60.0)  # due 0.6 s from now, then closed first
        await never.close()
        await asyncio.sleep(0.8)
        assert [key for key, _ in sent] == ["a"]
        assert backend.promises_sent == 1
        unknown = RaySandbox(backend, host, "c", "id-c", expires_in=0.0, asked_at=loop.time())  # its end unknown
        unknown.keep_alive(60.0)
        await asyncio.sleep(0.05)
        assert [key for key, _ in sent] == ["a", "c"]  # treated as ending now: sent at once
        lasting = RaySandbox(backend, host, "d", "id-d", expires_in=None, asked_at=loop.time())
        lasting.keep_alive(60.0)
        await asyncio.sleep(0.05)
        assert (lasting.expires, len(sent)) == (False, 2)  # never ends on its own: nothing to promise

    asyncio.run(main())
