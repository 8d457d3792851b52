"""In-flight weight updates: ``LocalEngine(pause_at="token")`` stops running batches between two tokens, loads new
weights, and continues them; every token records the policy version that sampled it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.local import LocalEngine
from skyrl_train.inference.versioned import VersionedEngine

from .conftest import assert_continued_under_new_weights

MakeEngine = Callable[..., LocalEngine]
LONG = SamplingParams(max_tokens=300, temperature=1.0, seed=11)


async def _when(condition: Callable[[], bool]) -> None:
    for _ in range(30_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition never held")


def _new_weights(tiny_model_dir: Path, perturb) -> list[tuple[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    weights: list[tuple[str, torch.Tensor]] = perturb(trainer, seed=0, scale=0.5)
    return weights


async def _update_mid_generation(
    engine: LocalEngine | VersionedEngine, inner: LocalEngine, prompts: list[list[int]], weights: list
) -> tuple[list[GenerationOutput], bool]:
    """Start a long generation, pause it a few tokens in, load ``weights`` as version 1, resume; its outputs and
    whether the call was still running when the pause returned."""
    running = asyncio.create_task(engine.generate(prompts, LONG))
    await _when(lambda: inner.stats.forward_calls >= 4)  # the prefill and a few decoding steps have run
    await engine.pause()
    still_running = not running.done()
    steps = inner.stats.forward_calls
    await asyncio.sleep(0.05)
    assert inner.stats.forward_calls == steps, "the batch kept decoding while paused"
    await engine.update_weights(weights)
    if isinstance(engine, VersionedEngine):
        engine.version = 1
    else:
        engine.policy_version = 1
    await engine.resume()
    return await asyncio.wait_for(running, timeout=120), still_running


def test_a_token_pause_continues_running_sequences_under_the_new_weights(
    make_local_engine: MakeEngine, tiny_model_dir: Path, prompts: list[list[int]], perturb
) -> None:
    reference = asyncio.run(make_local_engine().generate(prompts, LONG))  # the same seeds, never interrupted
    engine = make_local_engine(pause_at="token")
    engine.policy_version = 0
    weights = _new_weights(tiny_model_dir, perturb)
    outputs, still_running = asyncio.run(_update_mid_generation(engine, engine, prompts, weights))
    assert still_running, "pause waited for the running call instead of stopping it between tokens"
    assert engine.stats.batches == 1  # one batch, continued: nothing was aborted and started again
    assert_continued_under_new_weights(outputs, reference)


def test_an_update_without_a_pause_stops_and_continues_at_a_token_boundary(
    make_local_engine: MakeEngine, tiny_model_dir: Path, prompts: list[list[int]], perturb
) -> None:
    engine = make_local_engine(pause_at="token")
    weights = _new_weights(tiny_model_dir, perturb)

    async def scenario() -> tuple[list[GenerationOutput], bool]:
        running = asyncio.create_task(engine.generate(prompts, LONG))
        await _when(lambda: engine.stats.forward_calls >= 4)
        await engine.update_weights(weights)
        loaded_while_running = not running.done()
        outputs = await asyncio.wait_for(running, timeout=120)
        # update_weights restored the unpaused state: a new call runs.
        await asyncio.wait_for(engine.generate(prompts[:1], SamplingParams(max_tokens=2)), timeout=30)
        return outputs, loaded_while_running

    outputs, loaded_while_running = asyncio.run(scenario())
    assert loaded_while_running
    assert all(out.token_policy_versions is None for out in outputs)  # no version was ever set
    assert engine.stats.batches == 2  # the interrupted batch, continued, and the later call


def test_the_versioned_engine_takes_per_token_versions_from_an_engine_that_pauses_between_tokens(
    make_local_engine: MakeEngine, tiny_model_dir: Path, prompts: list[list[int]], perturb
) -> None:
    inner = make_local_engine(pause_at="token")
    engine = VersionedEngine(inner)
    assert engine.per_token
    assert inner.policy_version == 0  # the version reached the engine that samples
    weights = _new_weights(tiny_model_dir, perturb)
    outputs, still_running = asyncio.run(_update_mid_generation(engine, inner, prompts, weights))
    assert still_running
    for out in outputs:
        assert out.token_policy_versions is not None
        assert out.policy_version == 0  # the oldest version among its tokens
        assert set(out.token_policy_versions) == {0, 1}
    later = asyncio.run(engine.generate(prompts[:1], SamplingParams(max_tokens=4)))[0]
    assert later.policy_version == 1
    assert later.token_policy_versions == [1] * len(later.token_ids)
