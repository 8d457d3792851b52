"""GRPO group forks: one prepared sandbox per group, the other samples forked from its snapshot (process backend)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import skyrl_agent.pipeline as pipeline_module
import skyrl_agent.tasks.workspace as workspace_module
from skyrl_agent.agents.swe_env import SWEEnv
from skyrl_agent.dispatch import DispatcherConfig, Episode
from skyrl_agent.dispatch.outcomes import Outcome
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.llm.scripted import ScriptedClient, oracle_replies
from skyrl_agent.pipeline import SWEPipeline
from skyrl_agent.sandbox.base import Sandbox, SandboxError, SandboxSpec, SandboxStartError, Snapshot
from skyrl_agent.sandbox.group_fork import GroupForks, can_fork
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import load_suite
from skyrl_agent.tasks.format import SWETask, repo_files
from skyrl_agent.tasks.workspace import GIT

TASK = load_suite()[0]
SOURCE = "inikit/parser.py"  # a file of the task's repository


class CountingBackend(ProcessBackend):
    """The process backend, counting creates, forks and discarded snapshots."""

    def __init__(self) -> None:
        self.creates = 0
        self.forks = 0
        self.discarded: list[str] = []

    async def create(self, spec: SandboxSpec) -> Any:
        self.creates += 1
        return await super().create(spec)

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[Sandbox]:
        self.forks += n
        return await super().fork(snapshot, n, spec)

    async def discard_snapshot(self, snapshot: Snapshot) -> None:
        self.discarded.append(snapshot.ref)
        await super().discard_snapshot(snapshot)


class NoForkBackend(CountingBackend):
    """A backend whose fork is not implemented."""

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[Sandbox]:
        raise NotImplementedError("no forks here")


class BrokenForkBackend(CountingBackend):
    """A backend whose forks fail with a plain error."""

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[Sandbox]:
        raise RuntimeError("the snapshot is gone")


class FirstCreateFails(CountingBackend):
    """The first create fails as infrastructure; later ones work."""

    async def create(self, spec: SandboxSpec) -> Any:
        if self.creates == 0:
            self.creates += 1
            await asyncio.sleep(0.01)  # the group's other samples are waiting by now
            raise SandboxStartError("the daemon refused the container")
        return await super().create(spec)


@pytest.fixture
def preparations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the sandboxes whose workspace was prepared, wherever that happened (pipeline or env)."""
    prepared: list[str] = []
    real = workspace_module.prepare_workspace

    async def spy(task: SWETask, sandbox: Sandbox) -> str:
        prepared.append(sandbox.id)
        return await real(task, sandbox)

    monkeypatch.setattr(pipeline_module, "prepare_workspace", spy)
    monkeypatch.setattr(workspace_module, "prepare_workspace", spy)
    return prepared


def _group(n: int, group: str = "uid-1") -> list[Episode]:
    return [Episode(f"{group}:{k}", {"task": TASK, "task_id": TASK.id}, group_id=group) for k in range(n)]


async def _acquire_all(pipeline: SWEPipeline, episodes: Sequence[Episode]) -> list[Sandbox]:
    return list(await asyncio.gather(*(pipeline.acquire(episode) for episode in episodes)))


async def _head(sandbox: Sandbox) -> str:
    return (await sandbox.run(f"{GIT} rev-parse HEAD", workdir=TASK.workdir)).output.strip()


def _oracle(episode: Episode) -> LLMClient:
    return ScriptedClient(oracle_replies(TASK.gold_patch, workdir=".", patch_path=".git/skyrl-gold.patch"))


def test_a_group_of_four_prepares_once_and_every_sample_sees_the_prepared_workspace(preparations: list[str]) -> None:
    backend = CountingBackend()
    pipeline = SWEPipeline(backend, group_sizes={"uid-1": 4})

    async def main() -> tuple[list[str], list[str], list[bytes]]:
        sandboxes = await _acquire_all(pipeline, _group(4))
        try:
            bases = [await pipeline.workspace_base(TASK, sandbox) for sandbox in sandboxes]
            heads = [await _head(sandbox) for sandbox in sandboxes]
            sources = [await sandbox.read_file(f"{TASK.workdir}/{SOURCE}") for sandbox in sandboxes]
            return bases, heads, sources
        finally:
            for sandbox in sandboxes:
                await pipeline.release(sandbox)

    bases, heads, sources = asyncio.run(main())
    assert len(preparations) == 1
    assert (backend.creates, backend.forks) == (1, 3)
    assert len(set(bases)) == 1
    assert heads == bases
    assert sources == [repo_files(TASK)[SOURCE]] * 4
    assert len(backend.discarded) == 1
    assert not Path(backend.discarded[0]).exists()  # gone once all were released
    metrics = pipeline.group_setup_metrics()
    assert metrics["agent/forked_groups"] == 1.0
    assert metrics["agent/group_setup_s/mean"] > 0


def test_no_sample_sees_another_samples_writes(preparations: list[str]) -> None:
    pipeline = SWEPipeline(CountingBackend(), group_sizes={"uid-1": 3})

    async def main() -> None:
        sandboxes = await _acquire_all(pipeline, _group(3))
        try:
            for k, sandbox in enumerate(sandboxes):
                await sandbox.write_file(f"{TASK.workdir}/mine-{k}.txt", f"sample {k}")
                await sandbox.write_file(f"{TASK.workdir}/{SOURCE}", f"# rewritten by sample {k}\n")
            for k, sandbox in enumerate(sandboxes):
                assert await sandbox.read_file(f"{TASK.workdir}/{SOURCE}") == f"# rewritten by sample {k}\n".encode()
                for other in set(range(3)) - {k}:
                    with pytest.raises(FileNotFoundError):
                        await sandbox.read_file(f"{TASK.workdir}/mine-{other}.txt")
        finally:
            for sandbox in sandboxes:
                await pipeline.release(sandbox)

    asyncio.run(main())


def test_a_forked_group_is_solved_end_to_end_and_graded_in_fresh_sandboxes(preparations: list[str]) -> None:
    backend = CountingBackend()
    pipeline = SWEPipeline(backend, group_sizes={"uid-1": 4})
    dispatched = asyncio.run(pipeline.dispatcher(_oracle, DispatcherConfig()).run(_group(4)))
    assert [r.outcome for r in dispatched.results] == [Outcome.RESOLVED] * 4, [r.error for r in dispatched.results]
    assert len(preparations) == 1  # the env prepared nothing: every sample started prepared
    assert (backend.creates, backend.forks) == (1 + 4, 3)  # the share, then one fresh sandbox per grading


def test_without_fork_every_sample_prepares_its_own_workspace(preparations: list[str]) -> None:
    backend = NoForkBackend()
    pipeline = SWEPipeline(backend, group_sizes={"uid-1": 4})
    dispatched = asyncio.run(pipeline.dispatcher(_oracle, DispatcherConfig()).run(_group(4)))
    assert [r.outcome for r in dispatched.results] == [Outcome.RESOLVED] * 4, [r.error for r in dispatched.results]
    assert len(set(preparations)) == 4  # the share's, then each fallback sample's own (in its env)
    assert backend.creates == 4 + 4
    assert len(backend.discarded) == 1  # the unused snapshot goes all the same


def test_a_backend_that_is_not_known_to_fork_starts_every_sample_alone(preparations: list[str]) -> None:
    backend = CountingBackend()
    backend.name = "elsewhere"  # e.g. a remote backend whose forks are not ours to rely on
    assert not can_fork(backend)
    pipeline = SWEPipeline(backend, group_sizes={"uid-1": 3})
    dispatched = asyncio.run(pipeline.dispatcher(_oracle, DispatcherConfig()).run(_group(3)))
    assert [r.outcome for r in dispatched.results] == [Outcome.RESOLVED] * 3
    assert (len(preparations), backend.creates, backend.forks) == (3, 3 + 3, 0)


def test_group_fork_off_starts_every_sample_alone(preparations: list[str]) -> None:
    backend = CountingBackend()
    pipeline = SWEPipeline(backend, group_fork=False, group_sizes={"uid-1": 3})
    asyncio.run(_release_all(pipeline, asyncio.run(_acquire_all(pipeline, _group(3)))))
    assert (len(preparations), backend.creates, backend.forks) == (0, 3, 0)  # their envs would prepare them


async def _release_all(pipeline: SWEPipeline, sandboxes: Sequence[Sandbox]) -> None:
    for sandbox in sandboxes:
        await pipeline.release(sandbox)


def test_a_failed_preparation_reaches_every_waiting_sample_and_a_retry_prepares_afresh(
    preparations: list[str],
) -> None:
    backend = FirstCreateFails()
    pipeline = SWEPipeline(backend, group_sizes={"uid-1": 4})

    async def main() -> tuple[list[Any], list[Sandbox]]:
        episodes = _group(4)
        first = await asyncio.gather(*(pipeline.acquire(e) for e in episodes), return_exceptions=True)
        retried = await _acquire_all(pipeline, episodes)
        await _release_all(pipeline, retried)
        return list(first), retried

    first, retried = asyncio.run(main())
    assert all(isinstance(error, SandboxError) for error in first), first
    assert len({str(error) for error in first}) == 1  # one failure, seen by all four
    assert len(preparations) == 1
    assert len(retried) == 4


def test_a_failed_fork_is_a_sandbox_start_error(preparations: list[str]) -> None:
    backend = BrokenForkBackend()
    pipeline = SWEPipeline(backend, group_sizes={"uid-1": 2})

    async def main() -> list[Any]:
        started = await asyncio.gather(*(pipeline.acquire(e) for e in _group(2)), return_exceptions=True)
        await _release_all(pipeline, [s for s in started if not isinstance(s, BaseException)])
        return list(started)

    prepared, forked = asyncio.run(main())
    assert not isinstance(prepared, BaseException)
    assert isinstance(forked, SandboxStartError)
    assert "the snapshot is gone" in str(forked)
    assert len(backend.discarded) == 1


def test_a_task_error_in_the_shared_preparation_leaves_each_sample_to_prepare_its_own(
    preparations: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(task: SWETask, sandbox: Sandbox) -> str:
        preparations.append(sandbox.id)
        raise workspace_module.WorkspaceError("the repository cannot be written")

    monkeypatch.setattr(pipeline_module, "prepare_workspace", broken)
    backend = CountingBackend()
    pipeline = SWEPipeline(backend, group_sizes={"uid-1": 3})

    async def main() -> list[str | None]:
        sandboxes = await _acquire_all(pipeline, _group(3))
        bases = [pipeline._bases.get(sandbox.id) for sandbox in sandboxes]
        await _release_all(pipeline, sandboxes)
        return bases

    assert asyncio.run(main()) == [None, None, None]  # their envs prepare (and fail) as without forks
    assert (len(preparations), backend.creates, backend.forks) == (1, 1 + 3, 0)


def test_groups_of_unknown_size_are_not_forked(preparations: list[str]) -> None:
    backend = CountingBackend()
    pipeline = SWEPipeline(backend, group_sizes={"other": 2})
    asyncio.run(_release_all(pipeline, asyncio.run(_acquire_all(pipeline, _group(3)))))
    assert (len(preparations), backend.creates, backend.forks) == (0, 3, 0)


def test_a_group_of_one_is_not_snapshotted(preparations: list[str]) -> None:
    backend = CountingBackend()
    forks = GroupForks(backend, sizes={"solo": 1})

    async def main() -> None:
        prepare = functools.partial(workspace_module.prepare_workspace, TASK)
        started = await forks.acquire("solo", SandboxSpec(), prepare)
        assert started.base is None  # its env prepares it
        await started.sandbox.close()
        await forks.close()

    asyncio.run(main())
    assert (len(preparations), backend.creates, backend.discarded) == (0, 1, [])


def test_the_env_refuses_a_prepared_workspace_without_its_sandbox() -> None:
    with pytest.raises(ValueError, match="workspace_base"):
        SWEEnv(extras={"task": TASK, "backend": "process", "workspace_base": "abc"})


def test_the_training_generator_passes_its_groups_to_the_pipeline() -> None:
    from skyrl_agent.integrations.train_factory import SWETrainGenerator
    from skyrl_agent.testing import ByteChatTemplate, null_policy

    params = SimpleNamespace(max_tokens=8, temperature=1.0, top_p=1.0, stop=[], seed=None, logprobs=False)
    batch: Any = SimpleNamespace(trajectory_ids=["u1:0", "u1:1", "u1:2", "u2:0"], sampling_params=params)
    on = SWETrainGenerator(ProcessBackend(), ByteChatTemplate(), llm=null_policy(), run_id="r")
    pipeline = on._pipeline(batch)
    assert pipeline.group_fork
    assert dict(pipeline.group_sizes) == {"u1": 3, "u2": 1}
    off = SWETrainGenerator(ProcessBackend(), ByteChatTemplate(), llm=null_policy(), run_id="r", group_fork=False)
    assert not off._pipeline(batch).group_fork


def test_the_harness_training_generator_passes_its_groups_to_the_harness_pipeline() -> None:
    from skyrl_agent.integrations.train_factory import SWEHarnessTrainGenerator
    from skyrl_agent.testing import ByteChatTemplate

    params = SimpleNamespace(max_tokens=8, temperature=1.0, top_p=1.0, stop=[], seed=None, logprobs=False)
    batch: Any = SimpleNamespace(trajectory_ids=["u1:0", "u1:1"], sampling_params=params)
    generator = SWEHarnessTrainGenerator(
        ProcessBackend(), ByteChatTemplate(), engine=SimpleNamespace(), tokenizer=None, harness=SimpleNamespace(),
        run_id="r", group_fork=False,
    )  # fmt: skip
    pipeline = generator._harness_pipeline(batch, SimpleNamespace())  # type: ignore[arg-type]
    assert not pipeline.group_fork
    assert dict(pipeline.group_sizes) == {"u1": 2}


class GoldHarness:
    """A harness that applies the task's gold patch in its sandbox and submits."""

    name = "gold"

    def __call__(self, job: Any) -> Any:
        from skyrl_agent.harness import HarnessResult

        applied = job.shell.run(f"git apply <<'EOF'\n{job.task.gold_patch}\nEOF")
        assert applied.exit_code == 0, applied.output
        return HarnessResult("Submitted", model_calls=1, submitted=True)


def test_a_harness_group_starts_prepared_and_is_solved(preparations: list[str]) -> None:
    from skyrl_agent.harness import Endpoint, HarnessPipeline
    from skyrl_agent.llm.scripted import null_policy

    backend = CountingBackend()
    endpoint = Endpoint("http://127.0.0.1:9/v1", "k", "m")
    pipeline = HarnessPipeline(backend, harness=GoldHarness(), endpoint=endpoint, group_sizes={"uid-1": 3})
    dispatched = asyncio.run(pipeline.dispatcher(null_policy(), DispatcherConfig()).run(_group(3)))
    assert [r.outcome for r in dispatched.results] == [Outcome.RESOLVED] * 3, [r.error for r in dispatched.results]
    assert (len(preparations), backend.creates, backend.forks) == (1, 1 + 3, 2)
