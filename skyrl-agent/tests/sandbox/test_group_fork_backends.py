"""Group forks on the isolating backends: one preparation per group, every sample in a sandbox of its own."""

from __future__ import annotations

import asyncio

import pytest

from skyrl_agent.dispatch import Episode
from skyrl_agent.pipeline import SWEPipeline
from skyrl_agent.sandbox.base import Sandbox
from skyrl_agent.tasks import load_suite
from skyrl_agent.tasks.format import repo_files

from .conftest import SPEC, make_backend, snapshots_left

pytestmark = pytest.mark.docker  # the local backend exports its rootfs from the Docker image

TASK = load_suite()[0]
SOURCE = "inikit/parser.py"


def test_a_group_starts_prepared_and_isolated(backend_kind: str) -> None:
    async def main() -> None:
        backend = make_backend(backend_kind)
        pipeline = SWEPipeline(backend, spec=SPEC, group_sizes={"uid": 3})
        episodes = [Episode(f"uid:{k}", {"task": TASK}, group_id="uid") for k in range(3)]
        sandboxes: list[Sandbox] = []
        try:
            sandboxes = list(await asyncio.gather(*(pipeline.acquire(episode) for episode in episodes)))
            assert len({sandbox.id for sandbox in sandboxes}) == 3
            assert len({pipeline._bases[sandbox.id] for sandbox in sandboxes}) == 1  # one preparation, shared
            for k, sandbox in enumerate(sandboxes):
                assert await sandbox.read_file(f"{TASK.workdir}/{SOURCE}") == repo_files(TASK)[SOURCE]
                await sandbox.write_file(f"{TASK.workdir}/{SOURCE}", f"# sample {k}\n")
            for k, sandbox in enumerate(sandboxes):
                assert await sandbox.read_file(f"{TASK.workdir}/{SOURCE}") == f"# sample {k}\n".encode()
                status = await sandbox.run("git status --porcelain", workdir=TASK.workdir)
                assert status.output.split() == ["M", SOURCE], status.output
        finally:
            for sandbox in sandboxes:
                await pipeline.release(sandbox)
            await backend.close()

    asyncio.run(main())


def test_a_group_s_snapshot_goes_once_its_sandboxes_are_closed(backend_kind: str) -> None:
    async def main() -> None:
        backend = make_backend(backend_kind)
        pipeline = SWEPipeline(backend, spec=SPEC, group_sizes={"uid": 3})
        episodes = [Episode(f"uid:{k}", {"task": TASK}, group_id="uid") for k in range(3)]
        try:
            sandboxes = list(await asyncio.gather(*(pipeline.acquire(episode) for episode in episodes)))
            assert len(snapshots_left(backend)) == 1
            for sandbox in sandboxes[:2]:
                await pipeline.release(sandbox)
            assert len(snapshots_left(backend)) == 1  # a sample is still open
            await pipeline.release(sandboxes[2])
            assert snapshots_left(backend) == []  # not left for the backend's close: a run has many groups
        finally:
            await backend.close()

    asyncio.run(main())
