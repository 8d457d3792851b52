"""HarnessGenerator: mini-swe-agent episodes through the gateway become training rows of exactly the sampled tokens.

The scripted oracle engine stands in for the policy (the real-engine path is the CLI training test in
``integration_tests/test_swe_train_cli.py``); sandboxes are host subprocesses (the process backend).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (the skyrl-agent[mini-swe-agent] extra)")
pytest.importorskip("skyrl_train.gateway", reason="the gateway lives in skyrl-train, which is not installed")

from skyrl_agent.harness.mini_swe_agent import MiniSWEAgent
from skyrl_agent.integrations.harness import HarnessGenerator
from skyrl_agent.integrations.skyrl_train import AgentGeneratorConfig
from skyrl_agent.tasks import load_suite
from skyrl_agent.tasks.process_backend import ProcessBackend
from skyrl_train.generators.base import GeneratorInput
from skyrl_train.generators.chat import ChatEncoder
from skyrl_train.inference.base import SamplingParams as EngineParams


def _run(tokenizer: Any, oracle: Any, max_turns: int, samples: int = 2) -> tuple[Any, Any]:
    tasks = load_suite()[:2]
    engine = oracle(tokenizer, tasks)
    config = AgentGeneratorConfig(max_turns=max_turns, max_input_length=1 << 16)
    generator = HarnessGenerator(
        ProcessBackend(), ChatEncoder(tokenizer), engine=engine, tokenizer=tokenizer, harness=MiniSWEAgent(),
        config=config,
    )  # fmt: skip
    rows = [(task, k) for task in tasks for k in range(samples)]
    batch = GeneratorInput(
        prompts=[[] for _ in rows],
        env_classes=["swe"] * len(rows),
        env_extras=[{"task": task} for task, _ in rows],
        trajectory_ids=[f"{task.id}:{k}" for task, k in rows],
        sampling_params=EngineParams(max_tokens=4096, logprobs=True),
    )

    async def go() -> Any:
        try:
            return await generator.generate(batch)
        finally:
            await generator.close()

    return asyncio.run(go()), engine


def _segments(ids: Sequence[int], mask: Sequence[int]) -> list[list[int]]:
    """The runs of ids under mask 1."""
    pairs = zip(ids, mask, strict=True)
    return [[token for token, _ in run] for bit, run in itertools.groupby(pairs, key=lambda pair: pair[1]) if bit]


def test_rows_are_the_sampled_tokens_with_the_reward_on_the_last(tokenizer: Any, recording_oracle: Any) -> None:
    output, engine = _run(tokenizer, recording_oracle, max_turns=5)
    assert len(output) == 4
    assert output.rollout_logprobs is not None
    trained: list[list[int]] = []
    for ids, mask, logprobs, rewards, reason in zip(
        output.response_ids, output.loss_masks, output.rollout_logprobs, output.rewards, output.stop_reasons,
        strict=True,
    ):  # fmt: skip
        segments = _segments(ids, mask)
        assert len(segments) == 2  # the oracle's two replies, in one sample
        trained += segments
        # Exactly the sampled tokens are trained, with the engine's log-probs; context tokens carry 0.0.
        assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == [-0.1] * sum(mask)
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
        last = max(i for i, m in enumerate(mask) if m)
        assert rewards[last] == 1.0  # resolved by the hidden tests
        assert sum(rewards) == 1.0
        assert reason == "stop"
    assert sorted(map(tuple, trained)) == sorted(map(tuple, engine.outputs))  # bitwise the engine's ids
    assert output.metrics["harness/submitted/fraction"] == 1.0
    assert output.metrics["harness/samples_per_episode/mean"] == 1.0
    assert output.metrics["agent/outcome/resolved/count"] == 4


def test_a_harness_out_of_steps_is_truncated_with_reward_zero(tokenizer: Any, recording_oracle: Any) -> None:
    output, _ = _run(
        tokenizer, recording_oracle, max_turns=1, samples=1
    )  # the oracle applies the fix but never gets to submit
    assert output.stop_reasons == ["max_turns", "max_turns"]
    assert all(sum(rewards) == 0.0 for rewards in output.rewards)
    assert all(sum(mask) > 0 for mask in output.loss_masks)  # its one reply is still a trained row (zero reward)
    assert output.metrics["agent/outcome/truncated/count"] == 2


def test_rows_carry_the_policy_version_of_each_sampled_token(tokenizer: Any, recording_oracle: Any) -> None:
    """An engine that reports versions (as the trainer's does): every sampled token's version reaches the row."""

    def versioned(tokenizer: Any, tasks: Any) -> Any:
        engine = recording_oracle(tokenizer, tasks)
        inner = engine.generate

        async def generate(prompts: Sequence[Sequence[int]], params: Any) -> list[Any]:
            outputs = await inner(prompts, params)
            for out in outputs:
                out.policy_version = 7 if len(engine.outputs) <= 4 else 8  # the first four replies: version 7
            return outputs

        engine.generate = generate
        return engine

    output, _ = _run(tokenizer, versioned, max_turns=5)
    assert output.policy_versions is not None
    for versions, mask in zip(output.policy_versions, output.loss_masks, strict=True):
        assert len(versions) == len(mask)
        assert all(v == -1 for v, m in zip(versions, mask, strict=True) if not m)
        assert {v for v, m in zip(versions, mask, strict=True) if m} <= {7, 8}
    sampled = [v for versions in output.policy_versions for v in versions if v != -1]
    assert 7 in sampled
    assert 8 in sampled


def test_rows_carry_no_versions_when_the_engine_reports_none(tokenizer: Any, recording_oracle: Any) -> None:
    output, _ = _run(tokenizer, recording_oracle, max_turns=5, samples=1)
    assert output.policy_versions is None
