"""Discarding a snapshot: its image (docker) or layer (local) goes once nothing uses it, never under a fork."""

from __future__ import annotations

from typing import Any

import pytest

from skyrl_agent.sandbox.base import Snapshot

from .conftest import SPEC, in_sandbox, snapshots_left

pytestmark = pytest.mark.docker  # the local backend exports its rootfs from the Docker image


def test_a_discarded_snapshot_stays_until_its_last_fork_is_closed(backend_kind: str) -> None:
    async def body(sandbox: Any, backend: Any) -> None:
        await sandbox.write_file("state.txt", "v1\n")
        snapshot = await sandbox.snapshot()
        forks = await backend.fork(snapshot, 2, SPEC)
        try:
            await backend.discard_snapshot(snapshot)
            assert snapshots_left(backend)  # both forks run on it
            for k, fork in enumerate(forks):
                result = await fork.run(f"cat state.txt && echo fork{k} > state.txt && ls /usr/bin/python3")
                assert result.output == "v1\n/usr/bin/python3\n", result.output
            await forks[0].close()
            assert snapshots_left(backend)
            assert (await forks[1].run("cat state.txt")).output == "fork1\n"
            await forks[1].close()
            assert snapshots_left(backend) == []  # the last fork took it along
            await backend.discard_snapshot(snapshot)  # again: nothing to do
        finally:
            for fork in forks:
                await fork.close()

    in_sandbox(backend_kind, body)


def test_a_snapshot_nothing_uses_goes_at_once_and_unknown_ones_are_ignored(backend_kind: str) -> None:
    async def body(sandbox: Any, backend: Any) -> None:
        snapshot = await sandbox.snapshot()
        other = "process" if backend_kind == "docker" else "docker"
        for unknown in (Snapshot(backend_kind, "sha256:0000"), Snapshot(other, snapshot.ref)):
            await backend.discard_snapshot(unknown)
        assert len(snapshots_left(backend)) == 1
        await backend.discard_snapshot(snapshot)
        assert snapshots_left(backend) == []
        assert (await sandbox.run("echo alive")).output == "alive\n"  # the snapshotted sandbox is not its user

    in_sandbox(backend_kind, body)


def test_a_snapshot_of_a_fork_holds_the_snapshot_it_stacks_on(backend_kind: str) -> None:
    """A docker image committed from a fork is a child image; a local layer from a fork stacks on its parent."""

    async def body(sandbox: Any, backend: Any) -> None:
        await sandbox.write_file("a.txt", "a\n")
        parent = await sandbox.snapshot()
        (fork,) = await backend.fork(parent, 1, SPEC)
        try:
            await fork.write_file("b.txt", "b\n")
            child = await fork.snapshot()
        finally:
            await fork.close()
        await backend.discard_snapshot(parent)
        assert len(snapshots_left(backend)) == 2  # the child still needs its parent
        (grandchild,) = await backend.fork(child, 1, SPEC)
        try:
            assert (await grandchild.run("cat a.txt b.txt")).output == "a\nb\n"
        finally:
            await grandchild.close()
        await backend.discard_snapshot(child)
        assert snapshots_left(backend) == []

    in_sandbox(backend_kind, body)
