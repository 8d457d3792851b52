"""Several engines as Ray actors behind one engine: routing, seeds, weight sync, a killed engine and the load."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_train.inference.base import EngineLoad, GenerationOutput, SamplingParams
from skyrl_train.inference.local import LocalEngine
from skyrl_train.inference.routing import PrefixRouter, RouterConfig
from skyrl_train.timeline import Timeline

SYSTEM = list(range(100, 132))  # two blocks every prompt shares, like a system prompt


# -- routing (no engines) -------------------------------------------------------------------------------------


def test_a_continuation_sticks_to_the_engine_that_holds_its_history() -> None:
    router = PrefixRouter(2)
    first = router.route([*SYSTEM, *range(1, 33)])
    router.finished(first, [*SYSTEM, *range(1, 33), *range(40, 56)])
    other = router.route([*SYSTEM, *range(200, 232)])  # a new trajectory: least loaded, whatever it shares
    assert other == 0
    assert router.route([*SYSTEM, *range(1, 33), *range(40, 56), 7, 8, 9]) == first


def test_new_prompts_sharing_only_a_system_prompt_spread_over_the_engines() -> None:
    router = PrefixRouter(3)
    router.finished(router.route([*SYSTEM, *range(1, 33)]), [*SYSTEM, *range(1, 33)])
    chosen = [router.route([*SYSTEM, *range(k * 50, k * 50 + 40)]) for k in range(1, 7)]
    assert sorted(chosen) == [0, 0, 1, 1, 2, 2]


def test_a_busy_sticky_engine_gives_way_to_the_least_loaded() -> None:
    router = PrefixRouter(2, RouterConfig(balance_slack=1))
    history = list(range(64))
    router.finished(router.route(history), history)  # engine 0 holds it
    for _ in range(2):
        router.route([*range(500, 540)])  # new prompts fill up both engines: 0 then 1
    router.route([*range(600, 640)])  # 0 now has 2 in flight, 1 has 1
    assert router.in_flight == [2, 1]
    assert router.route([*history, 1]) == 0  # 2 − 1 ≤ slack: still sticky
    assert router.route([*history, 2]) == 1  # 3 − 1 > slack: the least loaded engine


# -- engines on Ray ---------------------------------------------------------------------------------------------

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.inference.ray_engines import EngineGroup  # noqa: E402

PROMPTS = [[5, 17, 30 + k, 44, 9] for k in range(6)]
PARAMS = SamplingParams(max_tokens=12, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _tokens(outputs: list[GenerationOutput]) -> list[list[int]]:
    return [output.token_ids for output in outputs]


def _perturbed(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(1)
    return [(name, t + 0.05 * torch.randn(t.shape, generator=generator)) for name, t in model.state_dict().items()]


@pytest.mark.ray
def test_two_engines_sample_what_one_engine_samples(cluster: None, tiny_model_dir: Path) -> None:
    async def scenario() -> tuple[list[list[int]], ...]:
        single = LocalEngine.from_pretrained(tiny_model_dir)
        group = EngineGroup("local", str(tiny_model_dir), 2, num_cpus_per_engine=0.5)
        group.timeline = timeline = Timeline()
        try:
            before = _tokens(await single.generate(PROMPTS, PARAMS)), _tokens(await group.generate(PROMPTS, PARAMS))
            # Every request is a span on the lane of the engine that served it; both engines served some.
            assert timeline.lanes() == ["engine 0", "engine 1"]
            assert len(timeline.spans) == len(PROMPTS)
            weights = _perturbed(tiny_model_dir)
            await single.update_weights(weights)
            await group.pause()
            await group.update_weights(weights)
            await group.resume()
            after = _tokens(await single.generate(PROMPTS, PARAMS)), _tokens(await group.generate(PROMPTS, PARAMS))
            assert group.router.in_flight == [0, 0]
            assert group.num_engines == 2
            return (*before, *after)
        finally:
            await group.close()
            await single.close()

    single_before, group_before, single_after, group_after = asyncio.run(scenario())
    assert group_before == single_before
    assert group_after == single_after
    assert single_after != single_before  # the new weights were loaded, by every engine


@pytest.mark.ray
def test_a_killed_engine_is_restarted_with_the_latest_weights_and_its_request_retried(
    cluster: None, tiny_model_dir: Path
) -> None:
    async def scenario() -> tuple[list[list[int]], list[list[int]], int]:
        single = LocalEngine.from_pretrained(tiny_model_dir)
        group = EngineGroup("local", str(tiny_model_dir), 2, num_cpus_per_engine=0.5)
        try:
            weights = _perturbed(tiny_model_dir)
            await single.update_weights(weights)
            await group.update_weights(weights)
            long = SamplingParams(max_tokens=200, temperature=1.0, seed=3)
            await group.pause()  # the requests are held on the engines: the kill surely finds one there
            running = asyncio.ensure_future(group.generate(PROMPTS[:2], long))
            while sum(group.router.in_flight) < 2:
                await asyncio.sleep(0.01)
            busiest = max(range(2), key=lambda i: group.router.in_flight[i])
            ray.kill(group.engines[busiest], no_restart=False)  # the process dies with a request; Ray restarts it
            await group.resume()
            outputs = await asyncio.wait_for(running, timeout=120)
            expected = await single.generate(PROMPTS[:2], long)
            return _tokens(outputs), _tokens(expected), group.restarts
        finally:
            await group.close()
            await single.close()

    got, expected, restarts = asyncio.run(scenario())
    assert restarts >= 1
    assert got == expected  # retried on the restarted engine, which had the latest weights again


@pytest.mark.ray
def test_engines_that_pause_between_tokens_record_the_groups_policy_version(
    cluster: None, tiny_model_dir: Path
) -> None:
    from skyrl_train.inference.versioned import VersionedEngine

    long = SamplingParams(max_tokens=300, temperature=1.0, seed=11)

    async def scenario() -> tuple[list[GenerationOutput], list[GenerationOutput]]:
        group = EngineGroup("local", str(tiny_model_dir), 2, num_cpus_per_engine=0.5, options={"pause_at": "token"})
        engine = VersionedEngine(group)  # as a fully_async run serves the group
        try:
            assert engine.per_token
            await engine.generate(PROMPTS, SamplingParams(max_tokens=2))  # both actors have loaded their model
            running = asyncio.ensure_future(engine.generate(PROMPTS[:2], long))
            while sum(group.router.in_flight) < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # some tokens are sampled under version 0
            await engine.pause()
            await engine.update_weights(_perturbed(tiny_model_dir))
            engine.version = 1
            await engine.resume()
            outputs = await asyncio.wait_for(running, timeout=120)
            later = await engine.generate(PROMPTS[2:4], SamplingParams(max_tokens=4))
            return outputs, later
        finally:
            await group.close()

    outputs, later = asyncio.run(scenario())
    for out in outputs:
        versions = out.token_policy_versions
        assert versions is not None
        assert out.policy_version == 0
        switch = versions.index(1)  # the running sequences continued under the new weights, on both engines
        assert versions == [0] * switch + [1] * (len(versions) - switch)
    assert all(out.token_policy_versions == [1] * len(out.token_ids) for out in later)


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def _requests(load: EngineLoad | None) -> int:
    return 0 if load is None else load.running + (load.waiting or 0)


@pytest.mark.ray
def test_the_groups_load_adds_up_what_its_engines_report(cluster: None, tiny_model_dir: Path) -> None:
    from skyrl_train.generators.factory import GeneratorPauseLink
    from skyrl_train.inference.versioned import VersionedEngine

    async def scenario() -> None:
        options = {"pause_at": "token"}
        group = EngineGroup(
            "local", str(tiny_model_dir), 2, num_cpus_per_engine=0.5, options=options, load_refresh_s=0.02
        )
        try:
            assert group.load() is None  # nothing known until the first refresh answers
            await group.pause()  # each engine's batch forms and waits at its first token: the load holds still
            calls = asyncio.ensure_future(group.generate(PROMPTS, PARAMS))
            await _until(lambda: _requests(group.load()) == len(PROMPTS))  # refreshed in the background
            each = await asyncio.gather(*(engine.load.remote() for engine in group.engines))
            assert [_requests(load) for load in each] == group.router.in_flight == [3, 3]
            running, waiting = sum(load.running for load in each), sum(load.waiting or 0 for load in each)
            assert await group.refresh_load() == group.load() == EngineLoad(running, waiting, None)
            assert VersionedEngine(GeneratorPauseLink(group)).load() == group.load()  # what admission reads in a run
            await group.resume()
            await calls
            await _until(lambda: group.load() == EngineLoad(0, 0, None))
        finally:
            await group.close()
        assert group.load() is None

    asyncio.run(scenario())
