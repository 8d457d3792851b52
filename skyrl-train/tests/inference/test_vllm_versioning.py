"""Weight updates and policy versions on vLLM (CPU build): after an update no key or value computed by the old
weights is reused, and a token-boundary pause holds vLLM's engine core itself (in its own process too), so every
token carries the version of the weights that sampled it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from skyrl_train.inference.base import GenerationOutput, SamplingParams

from .conftest import assert_continued_under_new_weights, forward_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LONG = SamplingParams(max_tokens=300, temperature=1.0, seed=11)
# Weights perturbed by noise of this scale change log-probabilities by ≈1.7 on average; vLLM's float32 CPU kernels
# agree with a transformers forward pass to ≈3e-5 on them (larger noise makes the model sharp and that ≈2e-3).
NOISE = 0.1
TOLERANCE = 1e-3


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture
def make_vllm_engine(tiny_model_dir: Path) -> Iterator[Callable[..., Any]]:
    """Build vLLM engines on the tiny model with a small KV cache; each is closed after the test."""
    from skyrl_train.inference.vllm_engine import VLLMEngine, VLLMEngineConfig

    engines: list[VLLMEngine] = []

    def make(**options: Any) -> VLLMEngine:
        config = VLLMEngineConfig(dtype="float32", max_model_len=512, kv_cache_memory_bytes=128 * 2**20, **options)
        engine = VLLMEngine(tiny_model_dir, config)
        engines.append(engine)
        run(engine.wait_ready())
        return engine

    yield make
    for engine in engines:
        run(engine.close())


def long_prompt(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """A chat prompt spanning more than two of vLLM's CPU KV blocks (128 tokens each), so its prefix is cached."""
    content = " ".join(f"{a} + {b} = {a + b}." for a, b in zip(range(10, 40), range(3, 33), strict=True))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert 256 < len(ids) < 480
    return ids


def cached_tokens(prompt: list[int]) -> Callable[[Any], int]:
    """A call for the engine thread: generate one token from ``prompt`` and say how many prompt tokens hit the cache."""

    def count(llm: Any) -> int:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        params = VLLMSamplingParams(max_tokens=1, detokenize=False)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        return int(outputs[0].num_cached_tokens or 0)

    return count


def gaps(model: PreTrainedModel, prompt: Sequence[int], out: GenerationOutput) -> torch.Tensor:
    """|engine - forward pass of ``model``| of each token of ``out``, sampled after ``prompt``."""
    assert out.logprobs is not None
    return (torch.tensor(out.logprobs) - forward_logprobs(model, prompt, out.token_ids, 1.0)).abs()


def test_an_update_drops_the_prefix_cache_of_the_old_weights(
    make_vllm_engine: Callable[..., Any], tiny_model_dir: Path, tokenizer: PreTrainedTokenizerBase, perturb
) -> None:
    engine = make_vllm_engine(enable_prefix_caching=True)
    prompt = long_prompt(tokenizer)
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    run(engine.generate([prompt], params))
    # The CPU build caches prefixes: the same prompt again finds its full blocks computed.
    assert run(engine.call(cached_tokens(prompt))) >= 256

    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    run(engine.update_weights(perturb(trainer, seed=7, scale=NOISE)))
    (after,) = run(engine.generate([prompt], params))

    gap = gaps(trainer, prompt, after).max().item()
    assert gap < TOLERANCE, f"logprobs after the update differ from the new weights' forward pass by {gap:.2e}"


def test_a_token_pause_holds_the_engine_core_process(
    make_vllm_engine: Callable[..., Any], tiny_model_dir: Path, prompts: list[list[int]], perturb
) -> None:
    engine = make_vllm_engine(multiprocessing=True, pause_at="token", enable_prefix_caching=True)
    engine.policy_version = 0
    reference = run(engine.generate(prompts, LONG))  # seeded, never interrupted: all of it by the old weights
    old = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    weights = perturb(new, seed=0, scale=NOISE)

    async def scenario() -> tuple[list[GenerationOutput], int, bool]:
        running = asyncio.create_task(engine.generate(prompts, LONG))
        start = engine.steps
        while engine.steps < start + 3:  # a few tokens are sampled under version 0
            await asyncio.sleep(0.001)
        await engine.pause()
        delivered = engine.steps - start
        held = not running.done()
        # Long enough for an engine core left running to sample all the remaining tokens of every request.
        await asyncio.sleep(3.0)
        await engine.update_weights(weights)
        engine.policy_version = 1
        await engine.resume()
        return await asyncio.wait_for(running, timeout=120), delivered, held

    outputs, delivered, held = run(scenario())
    assert held, "pause waited for the running requests instead of holding them between steps"
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.token_policy_versions is not None
        switch = out.token_policy_versions.index(1)
        # Every token of version 0 had been read when pause() returned: none was sampled while paused.
        assert switch <= delivered
        old_gap = gaps(old, prompt, out)[:switch].max().item()
        new_gap = gaps(new, prompt, out)[switch:].max().item()
        assert old_gap < TOLERANCE, f"tokens stamped version 0 are off the old weights by {old_gap:.2e}"
        assert new_gap < TOLERANCE, f"tokens stamped version 1 are off the new weights by {new_gap:.2e}"
    assert_continued_under_new_weights(outputs, reference)  # version 0, then 1, nothing sampled twice
