"""Engines that report their load (``load() -> EngineLoad``): the local engine's queue, vLLM's scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from skyrl_train.inference.base import EngineLoad, InferenceEngine, LoadReporting, SamplingParams, combined_load
from skyrl_train.inference.local import LocalEngine
from skyrl_train.inference.vllm_loop import SchedulerStatsTap, scheduler_load


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


def test_local_engine_reports_its_batch_and_queue(
    make_local_engine: Callable[..., LocalEngine], prompts: list[list[int]]
) -> None:
    engine = make_local_engine(max_batch_size=2, pause_at="token")
    assert isinstance(engine, LoadReporting)
    assert engine.load() == EngineLoad(0, 0, None)
    params = SamplingParams(max_tokens=8, seed=0)

    async def main() -> None:
        await engine.pause()  # the first batch forms and then waits at its first token; the rest queue behind it
        calls = [asyncio.create_task(engine.generate([prompts[i % len(prompts)]], params)) for i in range(5)]
        await _until(lambda: engine.load().running == 2)
        assert engine.load() == EngineLoad(2, 3, None)
        await engine.resume()
        await asyncio.gather(*calls)
        assert engine.load() == EngineLoad(0, 0, None)

    asyncio.run(main())


def test_scheduler_load_without_an_in_process_core_counts_unfinished_requests() -> None:
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace()))  # a client of a core process
    assert SchedulerStatsTap.install(llm) is None  # a vLLM without the output processor's method: nothing to tap
    assert scheduler_load(llm, 3) == EngineLoad(3, None, None)


def test_a_core_processs_figures_come_through_the_tap() -> None:
    seen: list[object] = []
    processor = SimpleNamespace(update_scheduler_stats=seen.append)
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(), output_processor=processor))
    tap = SchedulerStatsTap.install(llm)
    assert tap is not None
    assert scheduler_load(llm, 3, tap) == EngineLoad(3, None, None)  # no step's figures yet
    stats = SimpleNamespace(num_running_reqs=2, num_waiting_reqs=1, num_skipped_waiting_reqs=1, kv_cache_usage=0.5)
    llm.llm_engine.output_processor.update_scheduler_stats(stats)  # what vLLM's step calls
    llm.llm_engine.output_processor.update_scheduler_stats(None)  # a step that sent none keeps the latest
    assert seen == [stats, None]  # vLLM still gets them
    assert scheduler_load(llm, 4, tap) == EngineLoad(2, 2, 0.5)
    assert scheduler_load(llm, 0, tap) == EngineLoad(0, 0, 0.0)  # none of ours left: nothing runs there


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_engine_reports_running_and_waiting(tiny_model_dir: Path, prompts: list[list[int]]) -> None:
    from skyrl_train.inference.vllm_engine import VLLMEngine, VLLMEngineConfig

    config = VLLMEngineConfig(
        dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 * 2**20, max_num_seqs=2, pause_at="token"
    )
    engine = VLLMEngine(tiny_model_dir, config)
    assert isinstance(engine, LoadReporting)

    async def main(engine: InferenceEngine) -> None:
        assert isinstance(engine, VLLMEngine)
        await engine.wait_ready()
        await engine.pause()  # requests reach vLLM's scheduler but no step runs: all five wait
        params = SamplingParams(max_tokens=24, seed=0)
        calls = [asyncio.create_task(engine.generate([prompts[i % len(prompts)]], params)) for i in range(5)]
        await _until(lambda: engine.load().waiting == 5)
        assert engine.load().running == 0
        assert engine.load().kv_cache_usage == pytest.approx(0.0)  # nothing scheduled, no block taken
        await engine.resume()
        seen: list[EngineLoad] = []
        while not all(call.done() for call in calls):
            seen.append(engine.load())
            await asyncio.sleep(0.001)
        await asyncio.gather(*calls)
        assert max(load.running for load in seen) == 2  # max_num_seqs
        assert all(load.running + (load.waiting or 0) <= 5 for load in seen)
        assert all(load.kv_cache_usage is not None and 0.0 <= load.kv_cache_usage <= 1.0 for load in seen)
        assert any(load.kv_cache_usage for load in seen)  # the running requests hold blocks
        await _until(lambda: engine.load().running + (engine.load().waiting or 0) == 0)  # after the last step
        assert engine.load().kv_cache_usage == pytest.approx(0.0)

    try:
        asyncio.run(main(engine))
    finally:
        asyncio.run(engine.close())


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_engine_core_in_its_own_process_reports_running_waiting_and_cache(
    tiny_model_dir: Path, prompts: list[list[int]]
) -> None:
    """The GPU default: the scheduler is in the core's process, its figures come with each step's outputs."""
    from skyrl_train.inference.vllm_engine import VLLMEngine, VLLMEngineConfig

    config = VLLMEngineConfig(
        dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 * 2**20, max_num_seqs=2, multiprocessing=True
    )
    engine = VLLMEngine(tiny_model_dir, config)

    async def main() -> None:
        await engine.wait_ready()
        assert engine.load() == EngineLoad(0, None)  # no step yet: nothing known but our own count
        params = SamplingParams(max_tokens=48, seed=0)
        calls = [asyncio.create_task(engine.generate([prompts[i % len(prompts)]], params)) for i in range(6)]
        seen: list[EngineLoad] = []
        while not all(call.done() for call in calls):
            seen.append(engine.load())
            await asyncio.sleep(0.001)
        await asyncio.gather(*calls)
        told = [load for load in seen if load.waiting is not None]
        assert told, "the core's figures never came"
        assert max(load.running for load in told) == 2  # max_num_seqs
        assert any(load.waiting for load in told)  # six requests, two places: the others wait
        assert all(load.running + (load.waiting or 0) <= 6 for load in told)
        assert any(load.kv_cache_usage for load in told)  # the running requests hold blocks
        assert all(load.kv_cache_usage is not None and 0.0 <= load.kv_cache_usage <= 1.0 for load in told)
        assert engine.load() == EngineLoad(0, 0, 0.0)

    try:
        asyncio.run(main())
    finally:
        asyncio.run(engine.close())


def test_wrapping_engines_report_the_load_of_the_engine_they_wrap(
    make_local_engine: Callable[..., LocalEngine],
) -> None:
    from skyrl_train.generators.factory import GeneratorPauseLink
    from skyrl_train.inference.versioned import VersionedEngine

    engine = make_local_engine(max_batch_size=2)
    wrapped = VersionedEngine(GeneratorPauseLink(engine))  # what a fully_async run with a generator factory serves
    assert wrapped.load() == engine.load() == EngineLoad(0, 0, None)
    silent: InferenceEngine = SimpleNamespace()  # type: ignore[assignment]  # an engine without load()
    assert VersionedEngine(silent).load() is None  # nothing known


def test_engines_serving_as_one_add_their_requests_and_report_the_fullest_cache() -> None:
    assert combined_load([EngineLoad(2, 1, 0.3), EngineLoad(1, None, 0.95), None]) == EngineLoad(3, 1, 0.95)
    assert combined_load([EngineLoad(2, None), EngineLoad(1, None)]) == EngineLoad(3, None, None)
    assert combined_load([None, None]) is None  # no engine reports: nothing known
    assert combined_load([]) is None
