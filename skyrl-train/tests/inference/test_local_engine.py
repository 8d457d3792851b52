from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams
from skyrl_train.inference.local import EngineClosedError, LocalEngine
from skyrl_train.inference.local_batch import Request
from skyrl_train.inference.sampling import Sampler

MakeEngine = Callable[..., LocalEngine]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_is_an_inference_engine(make_local_engine: MakeEngine) -> None:
    assert isinstance(make_local_engine(), InferenceEngine)


def test_seeded_sampling_is_reproducible(make_local_engine: MakeEngine, prompts: list[list[int]]) -> None:
    engine = make_local_engine()
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    first = run(engine.generate(prompts, params))
    second = run(engine.generate(prompts, params))
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    assert [o.logprobs for o in first] == [o.logprobs for o in second]
    other = run(engine.generate(prompts, SamplingParams(max_tokens=12, temperature=1.0, seed=8)))
    assert [o.token_ids for o in other] != [o.token_ids for o in first]
    # Prompt i is seeded with seed + i: the same prompt alone with seed + 2 reproduces row 2 of the batch.
    alone = run(engine.generate([prompts[2]], SamplingParams(max_tokens=12, temperature=1.0, seed=9)))
    assert alone[0].token_ids == first[2].token_ids


@pytest.mark.parametrize("seeded", [True, False])
def test_samples_follow_the_distribution(seeded: bool) -> None:
    """Gumbel-max draws (seeded rows: each row's own generator; unseeded: the shared one) have the model's odds."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    rows, draws = 8, 500
    params = SamplingParams(temperature=1.0)
    requests = [Request([1], params, (100 + i) if seeded else None, None) for i in range(rows)]  # type: ignore[arg-type]
    sampler = Sampler(requests, torch.device("cpu"), torch.Generator().manual_seed(0))
    logits = probs.log().expand(rows, -1)
    counts = torch.zeros(4)
    for _ in range(draws):
        tokens, logprobs = sampler.sample(logits)
        counts += torch.bincount(tokens, minlength=4)
        torch.testing.assert_close(logprobs, probs.log()[tokens])
    # 4,000 draws: each frequency's standard error is below 0.008.
    torch.testing.assert_close(counts / counts.sum(), probs, atol=0.03, rtol=0)


def test_concurrent_requests_are_batched(make_local_engine: MakeEngine, prompts: list[list[int]]) -> None:
    engine = make_local_engine(batch_window_s=0.02)
    params = SamplingParams(max_tokens=8, temperature=1.0)

    async def many() -> None:
        await asyncio.gather(*(engine.generate([prompts[i % 4]], params) for i in range(32)))

    run(many())
    assert engine.stats.sequences == 32
    # One call per task would be 32 batches and 32 * 8 forward passes.
    assert engine.stats.batches <= 2
    assert engine.stats.forward_calls <= 2 * 8


def test_max_batch_size_splits_batches(make_local_engine: MakeEngine, prompts: list[list[int]]) -> None:
    engine = make_local_engine(max_batch_size=4)
    run(engine.generate(prompts * 3, SamplingParams(max_tokens=2)))
    assert engine.stats.batches == 3


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_forward_pass(
    make_local_engine: MakeEngine, tiny_model_dir: Path, prompts: list[list[int]], trainer_logprobs, temperature: float
) -> None:
    engine = make_local_engine()
    outputs = run(engine.generate(prompts, SamplingParams(max_tokens=16, temperature=temperature, seed=1)))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.logprobs is not None
        assert len(out.logprobs) == len(out.token_ids)
        expected = trainer_logprobs(model, prompt, out.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-5, rtol=0)


def test_top_k_logprobs_are_those_of_the_filtered_distribution(
    make_local_engine: MakeEngine, tiny_model_dir: Path, prompts: list[list[int]]
) -> None:
    engine = make_local_engine()
    out = run(engine.generate(prompts[:1], SamplingParams(max_tokens=8, top_k=20, seed=3)))[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompts[0] + out.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompts[0]) - 1 : -1]
    kth = logits.topk(20, dim=-1).values[:, -1:]
    filtered = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
    tokens = torch.tensor(out.token_ids)
    assert bool((logits.gather(1, tokens[:, None]) >= kth).all()), "a token outside the top 20 was sampled"
    torch.testing.assert_close(torch.tensor(out.logprobs), filtered.gather(1, tokens[:, None])[:, 0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("filters", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_extreme_filters_reduce_to_greedy(
    make_local_engine: MakeEngine, prompts: list[list[int]], filters: dict[str, float]
) -> None:
    engine = make_local_engine()
    greedy = run(engine.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0)))
    filtered = run(engine.generate(prompts, SamplingParams(max_tokens=10, temperature=1.0, seed=0, **filters)))  # type: ignore[arg-type]
    assert [o.token_ids for o in filtered] == [o.token_ids for o in greedy]
    assert all(lp == pytest.approx(0.0, abs=1e-6) for o in filtered for lp in o.logprobs or [])


def test_greedy_matches_transformers_generate(
    tiny_model_dir: Path, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], perturb
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    # The freshly initialised tiny model is nearly uniform and greedily repeats one token; noise makes the
    # greedy paths varied, so the comparison means something.
    perturb(model, seed=0, scale=0.2)
    engine = LocalEngine(copy.deepcopy(model), tokenizer)
    try:
        outputs = run(engine.generate(prompts, SamplingParams(max_tokens=20, temperature=0.0)))
    finally:
        run(engine.close())
    assert len({tuple(o.token_ids) for o in outputs}) == len(prompts)
    for prompt, out in zip(prompts, outputs, strict=True):
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)
        assert out.token_ids == generated[0, len(prompt) :].tolist()[: len(out.token_ids)]
        assert len(out.token_ids) == 20 or out.stop_reason == "stop"


def test_stop_reasons(
    make_local_engine: MakeEngine, prompts: list[list[int]], tokenizer: PreTrainedTokenizerBase, pick_stops
) -> None:
    engine = make_local_engine()

    def sample(**stops: object) -> GenerationOutput:
        params = SamplingParams(max_tokens=24, temperature=1.0, seed=5, **stops)  # type: ignore[arg-type]
        return run(engine.generate(prompts[:1], params))[0]

    full = sample().token_ids
    assert len(full) == 24
    stop_id, id_end, stop_text, text_end = pick_stops(full, tokenizer)

    by_length = run(engine.generate(prompts[:1], SamplingParams(max_tokens=5, temperature=1.0, seed=5)))[0]
    assert (by_length.stop_reason, by_length.token_ids) == ("length", full[:5])

    by_token = sample(stop_token_ids=(stop_id,))
    assert (by_token.stop_reason, by_token.token_ids) == ("stop", full[:id_end])

    engine.eos_token_ids = frozenset({stop_id})  # the model's EOS stops the same way
    by_eos = sample()
    assert (by_eos.stop_reason, by_eos.token_ids) == ("stop", full[:id_end])
    engine.eos_token_ids = frozenset()

    by_string = sample(stop=(stop_text,))
    assert (by_string.stop_reason, by_string.token_ids) == ("stop", full[:text_end])
    assert by_string.metadata["stop_string"] == stop_text
    assert by_string.text is not None
    assert by_string.text.endswith(stop_text)

    nothing = run(engine.generate(prompts[:1], SamplingParams(max_tokens=0)))[0]
    assert (nothing.stop_reason, nothing.token_ids) == ("length", [])


def test_context_limit_ends_with_length(make_local_engine: MakeEngine, prompts: list[list[int]]) -> None:
    prompt = prompts[0]
    engine = make_local_engine(max_model_len=len(prompt) + 3)
    out = run(engine.generate([prompt], SamplingParams(max_tokens=50, temperature=0.0)))[0]
    assert (out.stop_reason, len(out.token_ids)) == ("length", 3)
    with pytest.raises(ValueError, match="no room"):
        run(engine.generate([[*prompt, 5, 6, 7]], SamplingParams(max_tokens=5)))


def test_invalid_requests_are_rejected(make_local_engine: MakeEngine, prompts: list[list[int]]) -> None:
    engine = make_local_engine()
    with pytest.raises(ValueError, match="temperature"):
        run(engine.generate(prompts, SamplingParams(temperature=-1.0)))
    with pytest.raises(ValueError, match="at least one token"):
        run(engine.generate([[]], SamplingParams()))


def test_update_weights_changes_outputs_to_the_new_model(
    make_local_engine: MakeEngine, tiny_model_dir: Path, prompts: list[list[int]], trainer_logprobs, perturb
) -> None:
    engine = make_local_engine()
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=4)
    before = run(engine.generate(prompts, params))
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    weights = perturb(trainer, seed=0)
    run(engine.update_weights(weights))
    after = run(engine.generate(prompts, params))
    assert [o.logprobs for o in after] != [o.logprobs for o in before]
    for prompt, out in zip(prompts, after, strict=True):
        expected = trainer_logprobs(trainer, prompt, out.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-5, rtol=0)


def test_update_weights_rejects_unknown_names_and_shapes(make_local_engine: MakeEngine) -> None:
    engine = make_local_engine()
    with pytest.raises(KeyError, match="no parameter"):
        run(engine.update_weights([("model.nope.weight", torch.zeros(1))]))
    with pytest.raises(ValueError, match="shape"):
        run(engine.update_weights([("model.norm.weight", torch.zeros(3))]))
    # A tied output projection can be sent under its own name too.
    embed = engine.model.get_input_embeddings().weight.detach().clone()
    run(engine.update_weights([("lm_head.weight", embed * 2)]))
    torch.testing.assert_close(engine.model.get_input_embeddings().weight, embed * 2)


def test_pause_holds_new_calls_until_resume(make_local_engine: MakeEngine, prompts: list[list[int]]) -> None:
    engine = make_local_engine()

    async def scenario() -> None:
        running = asyncio.create_task(engine.generate(prompts, SamplingParams(max_tokens=32)))
        await asyncio.sleep(0.01)
        await engine.pause()
        assert running.done(), "pause returned before the running call finished"
        held = asyncio.create_task(engine.generate(prompts[:1], SamplingParams(max_tokens=4)))
        await asyncio.sleep(0.2)
        assert not held.done()
        await engine.resume()
        assert len(await asyncio.wait_for(held, timeout=30)) == 1

    run(scenario())


def test_event_loop_keeps_running_during_generation(make_local_engine: MakeEngine, prompts: list[list[int]]) -> None:
    engine = make_local_engine()

    async def scenario() -> tuple[int, float, float]:
        start = last = time.perf_counter()
        ticks, longest_gap = 0, 0.0
        generation = asyncio.create_task(engine.generate(prompts * 16, SamplingParams(max_tokens=64)))
        while not generation.done():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            ticks, longest_gap, last = ticks + 1, max(longest_gap, now - last), now
        await generation
        return ticks, longest_gap, time.perf_counter() - start

    ticks, longest_gap, duration = run(scenario())
    # A blocked loop would tick about once, with one gap as long as the whole generation. Relative bounds keep
    # the check meaningful on a loaded machine.
    assert ticks >= 10
    assert longest_gap < 0.25 * duration, f"the event loop stalled for {longest_gap:.3f} s of {duration:.3f} s"


def test_engine_survives_successive_event_loops_and_closes(
    make_local_engine: MakeEngine, prompts: list[list[int]]
) -> None:
    engine = make_local_engine()
    params = SamplingParams(max_tokens=4, seed=0)
    assert run(engine.generate(prompts, params))[0].token_ids == run(engine.generate(prompts, params))[0].token_ids
    run(engine.close())
    run(engine.close())  # idempotent
    with pytest.raises(EngineClosedError):
        run(engine.generate(prompts, params))


def test_close_fails_running_calls_promptly(make_local_engine: MakeEngine, prompts: list[list[int]]) -> None:
    engine = make_local_engine()

    async def scenario() -> None:
        running = asyncio.create_task(engine.generate(prompts * 8, SamplingParams(max_tokens=400)))
        while engine.stats.forward_calls == 0:  # wait until the batch is on the worker thread
            await asyncio.sleep(0.01)
        await asyncio.wait_for(engine.close(), timeout=30)
        with pytest.raises(EngineClosedError):
            await asyncio.wait_for(running, timeout=30)

    run(scenario())
