"""The vLLM engine (CPU build here): one in-process engine for the whole module keeps the start-up cost to ~6 s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[InferenceEngine]:
    from skyrl_train.inference.vllm_engine import VLLMEngine, VLLMEngineConfig

    # 128 MiB of KV cache is plenty for the tiny model and keeps RAM free on shared machines. The scheduler
    # options are not vLLM's defaults, so test_scheduler_options_reach_vllm can tell that they arrived.
    config = VLLMEngineConfig(
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=128 * 2**20,
        max_num_seqs=16,
        max_num_batched_tokens=1024,
        enable_prefix_caching=False,
    )
    vllm_engine = VLLMEngine(tiny_model_dir, config)
    run(vllm_engine.wait_ready())
    yield vllm_engine
    run(vllm_engine.close())


def test_scheduler_options_reach_vllm(engine: InferenceEngine) -> None:
    from skyrl_train.inference.vllm_engine import VLLMEngine

    assert isinstance(engine, VLLMEngine)

    def read(llm: Any) -> tuple[int, int, bool]:
        config = llm.llm_engine.vllm_config
        scheduler = config.scheduler_config
        return scheduler.max_num_seqs, scheduler.max_num_batched_tokens, config.cache_config.enable_prefix_caching

    assert run(engine.call(read)) == (16, 1024, False)


def test_token_in_token_out(engine: InferenceEngine, prompts: list[list[int]]) -> None:
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1)
    outputs = run(engine.generate(prompts, params))
    assert len(outputs) == len(prompts)
    for out in outputs:
        assert all(isinstance(t, int) for t in out.token_ids)
        assert 0 < len(out.token_ids) <= 16
        assert out.stop_reason in ("stop", "length")
        assert out.logprobs is not None
        assert len(out.logprobs) == len(out.token_ids)
        assert isinstance(out.text, str)
    again = run(engine.generate(prompts, params))
    assert [o.token_ids for o in again] == [o.token_ids for o in outputs]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_forward_pass(
    engine: InferenceEngine, tiny_model_dir: Path, prompts: list[list[int]], trainer_logprobs, temperature: float
) -> None:
    outputs = run(engine.generate(prompts, SamplingParams(max_tokens=16, temperature=temperature, seed=2)))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    gaps = [
        (torch.tensor(out.logprobs) - trainer_logprobs(model, prompt, out.token_ids, temperature)).abs()
        for prompt, out in zip(prompts, outputs, strict=True)
    ]
    gap = torch.cat(gaps)
    print(f"vLLM vs forward pass, T={temperature}: mean |Δ| {gap.mean():.2e}, max {gap.max():.2e}")
    assert gap.max() < 1e-4


def test_stop_reasons(
    engine: InferenceEngine, prompts: list[list[int]], tokenizer: PreTrainedTokenizerBase, pick_stops
) -> None:
    def sample(**stops: object) -> GenerationOutput:
        params = SamplingParams(max_tokens=24, temperature=1.0, seed=5, **stops)  # type: ignore[arg-type]
        return run(engine.generate(prompts[:1], params))[0]

    full = sample().token_ids
    assert len(full) == 24
    stop_id, id_end, stop_text, text_end = pick_stops(full, tokenizer)
    short = run(engine.generate(prompts[:1], SamplingParams(max_tokens=5, temperature=1.0, seed=5)))[0]
    assert (short.stop_reason, short.token_ids) == ("length", full[:5])
    by_token = sample(stop_token_ids=(stop_id,))
    assert (by_token.stop_reason, by_token.token_ids) == ("stop", full[:id_end])
    by_string = sample(stop=(stop_text,))
    assert (by_string.stop_reason, by_string.token_ids) == ("stop", full[:text_end])
    assert by_string.metadata["stop_string"] == stop_text
    assert by_string.text is not None
    assert by_string.text.endswith(stop_text)
    nothing = run(engine.generate(prompts[:2], SamplingParams(max_tokens=0)))
    assert [(o.stop_reason, o.token_ids) for o in nothing] == [("length", [])] * 2


def test_concurrent_callers_get_their_own_completions(engine: InferenceEngine, prompts: list[list[int]]) -> None:
    def params(seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=8, temperature=1.0, seed=seed)

    async def concurrently() -> list[list[int]]:
        results = await asyncio.gather(*(engine.generate([prompts[i % 4]], params(i)) for i in range(24)))
        return [r[0].token_ids for r in results]

    together = run(concurrently())
    one_by_one = [run(engine.generate([prompts[i % 4]], params(i)))[0].token_ids for i in range(24)]
    assert together == one_by_one


def test_pause_holds_new_calls_until_resume(engine: InferenceEngine, prompts: list[list[int]]) -> None:
    async def scenario() -> None:
        await engine.pause()
        held = asyncio.create_task(engine.generate(prompts[:1], SamplingParams(max_tokens=4)))
        await asyncio.sleep(0.2)
        assert not held.done()
        await engine.resume()
        assert len(await asyncio.wait_for(held, timeout=60)) == 1

    run(scenario())


@pytest.mark.parametrize("transport", ["direct", "file", "bytes"])
def test_update_weights_with_tied_embeddings(
    engine: InferenceEngine, tiny_model_dir: Path, prompts: list[list[int]], trainer_logprobs, perturb, transport: str
) -> None:
    engine.weight_transport = transport  # type: ignore[attr-defined]
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=3)
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert trainer.config.tie_word_embeddings
    original = [(name, p.detach().clone()) for name, p in trainer.named_parameters()]
    before = run(engine.generate(prompts, params))

    weights = perturb(trainer, seed=11)  # noise on every parameter, the shared embedding/lm_head included
    start = time.perf_counter()
    run(engine.update_weights(weights))
    seconds = time.perf_counter() - start
    try:
        after = run(engine.generate(prompts, params))
        assert [o.logprobs for o in after] != [o.logprobs for o in before]
        gap = torch.cat(
            [
                (torch.tensor(out.logprobs) - trainer_logprobs(trainer, prompt, out.token_ids, 1.0)).abs()
                for prompt, out in zip(prompts, after, strict=True)
            ]
        )
        mean, worst = gap.mean().item(), gap.max().item()
        print(f"update via {transport}: {seconds * 1000:.0f} ms; |rollout - trainer| {mean:.2e} (max {worst:.2e})")
        assert gap.max() < 1e-4
    finally:
        run(engine.update_weights(original))
        engine.weight_transport = "direct"  # type: ignore[attr-defined]
    restored = run(engine.generate(prompts, params))
    assert [o.token_ids for o in restored] == [o.token_ids for o in before]
