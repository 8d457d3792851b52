"""In-flight weight updates on vLLM (CPU build): ``pause_at="token"`` holds running requests between engine steps,
the new weights load, and the requests continue; every token records the policy version of the step that sampled
it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_train.inference.base import GenerationOutput, SamplingParams

from .conftest import assert_continued_under_new_weights

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LONG = SamplingParams(max_tokens=300, temperature=1.0, seed=11)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[object]:
    from skyrl_train.inference.vllm_engine import VLLMEngine, VLLMEngineConfig

    config = VLLMEngineConfig(
        dtype="float32", max_model_len=512, kv_cache_memory_bytes=128 * 2**20, pause_at="token", seed=0
    )
    vllm_engine = VLLMEngine(tiny_model_dir, config)
    asyncio.run(vllm_engine.wait_ready())
    yield vllm_engine
    asyncio.run(vllm_engine.close())


def test_a_token_pause_holds_running_requests_and_they_continue_under_the_new_weights(
    engine, tiny_model_dir: Path, prompts: list[list[int]], perturb
) -> None:
    from skyrl_train.inference.vllm_engine import VLLMEngine

    assert isinstance(engine, VLLMEngine)
    assert engine.pauses_at_token_boundary
    engine.policy_version = 0
    reference = asyncio.run(engine.generate(prompts, LONG))  # seeded: the same tokens, never interrupted
    assert all(out.token_policy_versions == [0] * len(out.token_ids) for out in reference)
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    weights = perturb(trainer, seed=0, scale=0.5)

    async def scenario() -> tuple[list[GenerationOutput], bool]:
        running = asyncio.create_task(engine.generate(prompts, LONG))
        start = engine.steps
        while engine.steps < start + 3:  # a few tokens are sampled under version 0
            await asyncio.sleep(0.001)
        await engine.pause()
        held = not running.done()
        steps = engine.steps
        await asyncio.sleep(0.1)
        assert engine.steps == steps, "the engine kept stepping while paused"
        await engine.update_weights(weights)
        engine.policy_version = 1
        await engine.resume()
        return await asyncio.wait_for(running, timeout=120), held

    try:
        outputs, held = asyncio.run(scenario())
    finally:
        original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        asyncio.run(engine.update_weights(list(original.state_dict().items())))
    assert held, "pause waited for the running requests instead of holding them between steps"
    assert_continued_under_new_weights(outputs, reference)
    assert all(out.text is not None for out in outputs)  # the streamed pieces of text, joined


def test_streamed_outputs_keep_the_protocol(engine, prompts: list[list[int]]) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    outputs = asyncio.run(engine.generate(prompts, params))
    again = asyncio.run(engine.generate(prompts, params))
    assert [o.token_ids for o in again] == [o.token_ids for o in outputs]
    for out in outputs:
        assert 0 < len(out.token_ids) <= 12
        assert out.logprobs is not None
        assert len(out.logprobs) == len(out.token_ids)
        assert out.stop_reason in ("stop", "length")
    unlogged = asyncio.run(engine.generate(prompts[:1], SamplingParams(max_tokens=4, logprobs=False)))[0]
    assert unlogged.logprobs is None
