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

from skyrl_agent.harness.base import Harness, HarnessJob, HarnessResult
from skyrl_agent.harness.mini_swe_agent import MiniSWEAgent
from skyrl_agent.integrations.harness import HarnessGenerator
from skyrl_agent.integrations.skyrl_train import AgentGeneratorConfig
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import load_suite
from skyrl_train.experience import to_experience
from skyrl_train.generators.base import GeneratorInput
from skyrl_train.generators.chat import ChatEncoder
from skyrl_train.inference.base import SamplingParams as EngineParams


def _run(
    tokenizer: Any, oracle: Any, max_turns: int, samples: int = 2, harness: Harness | None = None
) -> tuple[Any, Any]:
    tasks = load_suite()[:2]
    engine = oracle(tokenizer, tasks)
    config = AgentGeneratorConfig(max_turns=max_turns, max_input_length=1 << 16)
    generator = HarnessGenerator(
        ProcessBackend(), ChatEncoder(tokenizer), engine=engine, tokenizer=tokenizer,
        harness=harness or MiniSWEAgent(), config=config,
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


class SummarisingHarness:
    """An OpenAI-client harness that rewrites its context: its second call restates the task with a summary of the
    first reply instead of extending the conversation, so the gateway records two samples of one episode."""

    name = "summarising"

    def __call__(self, job: HarnessJob) -> HarnessResult:
        from openai import OpenAI

        client = OpenAI(base_url=job.endpoint.base_url, api_key=job.endpoint.api_key)
        task = {"role": "user", "content": job.problem_statement}
        first = client.chat.completions.create(model=job.endpoint.model, messages=[task])
        action = first.choices[0].message.content or ""
        command = action.split("```mswea_bash_command\n", 1)[1].rsplit("```", 1)[0]
        job.shell.run(command)  # the oracle's first reply applies the gold patch
        summary = {"role": "user", "content": f"{job.problem_statement}\n\nSo far:\n{action}"}
        client.chat.completions.create(model=job.endpoint.model, messages=[summary])
        return HarnessResult("Submitted", model_calls=2, submitted=True)


def test_a_session_that_rewrote_its_context_trains_every_sample_as_a_step_row(
    tokenizer: Any, recording_oracle: Any
) -> None:
    pytest.importorskip("openai", reason="the openai SDK is not installed (the dev group)")
    output, engine = _run(tokenizer, recording_oracle, max_turns=5, harness=SummarisingHarness())
    assert len(output) == 8  # four episodes of two samples each
    assert output.is_last_step == [False, True] * 4
    assert output.trajectory_ids[::2] == output.trajectory_ids[1::2]  # a trajectory's rows are consecutive
    segments = [_segments(ids, m) for ids, m in zip(output.response_ids, output.loss_masks, strict=True)]
    assert all(len(row) == 1 for row in segments)  # each sample: one call's reply, trained
    assert sorted(tuple(row[0]) for row in segments) == sorted(map(tuple, engine.outputs))  # bitwise the engine's
    for k, (rewards, reason) in enumerate(zip(output.rewards, output.stop_reasons, strict=True)):
        assert sum(rewards) == (1.0 if output.is_last_step[k] else 0.0)  # the episode's reward, on its last row
        assert reason == "stop"
    assert output.trajectory_rewards() == [1.0] * 4
    experience = to_experience(output, pad_token_id=0)  # what the trainer makes of it
    assert experience.trajectory_end.tolist() == [1, 1, 3, 3, 5, 5, 7, 7]
    assert experience.counted.tolist() == [False, True] * 4
    assert output.metrics["harness/samples_per_episode/mean"] == 2.0
    assert output.metrics["harness/rows"] == 8.0
    assert output.metrics["generate/num_trajectories"] == 4.0
