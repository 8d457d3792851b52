"""The dispatcher raises the GC's full-collection threshold while it runs, and puts it back."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from skyrl_agent.dispatch import Dispatcher, DispatcherConfig, Episode, GradeResult, RunContext
from skyrl_agent.dispatch.gc_policy import fewer_full_collections
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.sandbox.base import Sandbox
from skyrl_agent.testing import FakeSandbox, ScriptedClient


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_the_threshold_is_raised_inside_and_restored_after() -> None:
    with fewer_full_collections(100):
        assert gc.get_threshold() == (700, 10, 100)
    assert gc.get_threshold() == (700, 10, 10)


def test_none_leaves_the_threshold_alone() -> None:
    with fewer_full_collections(None):
        assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_setting_is_never_lowered() -> None:
    gc.set_threshold(700, 10, 1000)
    with fewer_full_collections(100):
        assert gc.get_threshold()[2] == 1000
    assert gc.get_threshold()[2] == 1000


def test_overlapping_runs_restore_once_the_last_ends() -> None:
    outer = fewer_full_collections(100)
    inner = fewer_full_collections(200)
    outer.__enter__()
    inner.__enter__()
    assert gc.get_threshold()[2] == 200
    outer.__exit__(None, None, None)  # the first to start ends first
    assert gc.get_threshold()[2] == 200
    inner.__exit__(None, None, None)
    assert gc.get_threshold()[2] == 10


def test_a_change_made_during_the_run_wins() -> None:
    with fewer_full_collections(100):
        gc.set_threshold(700, 10, 50)
    assert gc.get_threshold()[2] == 50


def test_bad_thresholds_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="None keeps"):
        DispatcherConfig(gc_full_collection_threshold=0)
    with pytest.raises(ValueError, match="at least 1"), fewer_full_collections(0):
        pass


@pytest.mark.parametrize(("threshold", "seen"), [(100, 100), (None, 10)])
def test_the_dispatcher_runs_its_episodes_under_the_setting(threshold: int | None, seen: int) -> None:
    during: list[int] = []

    async def acquire(episode: Episode) -> Sandbox:
        return FakeSandbox()

    async def run(episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext) -> None:
        during.append(gc.get_threshold()[2])

    async def grade(episode: Episode, sandbox: Sandbox, trajectory: object) -> GradeResult:
        return GradeResult(1.0, True)

    async def release(sandbox: Sandbox) -> None:
        await sandbox.close()

    config = DispatcherConfig(gc_full_collection_threshold=threshold)
    dispatcher = Dispatcher(acquire, run, grade, release, ScriptedClient([]), config)
    out = asyncio.run(dispatcher.run([Episode("a"), Episode("b")]))
    assert len(out.results) == 2
    assert during == [seen, seen]
    assert gc.get_threshold() == (700, 10, 10)
