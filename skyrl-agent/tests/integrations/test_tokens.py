"""Token rows of agent episodes and the failure policy on them; the bridge's pieces that need no torch."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from skyrl_agent.agents.react import Trajectory, Turn
from skyrl_agent.dispatch import Episode, EpisodeResult, GradeResult, Outcome, PausableClock, Treatment
from skyrl_agent.integrations.skyrl_train import PausingEngine
from skyrl_agent.integrations.tokens import (
    FAILURE_STOP_REASONS,
    TokenError,
    TokenRow,
    between_turns,
    trajectory_tokens,
    treat,
)
from skyrl_agent.llm.base import Completion
from skyrl_agent.testing import ByteChatTemplate

CHAT = ByteChatTemplate()
START = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]


def _turn(text: str, observation: str | None, *, logprobs: bool = True, prompt: list[int] | None = None) -> Turn:
    ids = list(text.encode())
    completion = Completion(text, ids, [-0.5] * len(ids) if logprobs else None, prompt_token_ids=prompt)
    observations = [] if observation is None else [{"role": "user", "content": observation}]
    return Turn(completion, None, observations)


def _trajectory(*turns: Turn, finish_reason: str = "submitted") -> Trajectory:
    messages = list(START)
    for turn in turns:
        messages += [{"role": "assistant", "content": turn.completion.text}, *turn.observations]
    return Trajectory(messages, list(turns), finish_reason)


def test_generated_ids_are_trained_and_observations_are_not() -> None:
    row = trajectory_tokens(_trajectory(_turn("ls", "a.py"), _turn("submit", None)), CHAT)
    between = between_turns(CHAT, list(b"ls"), [{"role": "user", "content": "a.py"}])
    assert row.prompt_ids == CHAT.prompt_ids(START)
    assert row.response_ids == [*b"ls", *between, *b"submit"]
    assert between[0] == CHAT.end_of_turn_token_id  # the reply did not sample it: appended, not trained
    assert row.loss_mask == [1, 1] + [0] * len(between) + [1] * 6
    assert row.logprobs == [-0.5, -0.5] + [0.0] * len(between) + [-0.5] * 6
    assert row.turns == 2
    assert len(row.rewards) == len(row.response_ids)


def test_reported_prompt_ids_are_used_and_must_extend_the_row() -> None:
    first = _turn("ls", "out", prompt=[7, 8, 9])
    second = _turn("submit", None, prompt=[7, 8, 9, *b"ls", 42, 43])
    row = trajectory_tokens(_trajectory(first, second), CHAT)
    assert row.prompt_ids == [7, 8, 9]
    assert row.response_ids == [*b"ls", 42, 43, *b"submit"]
    drifted = _turn("submit", None, prompt=[7, 8, 10, 42])
    with pytest.raises(TokenError, match="re-tokenised"):
        trajectory_tokens(_trajectory(_turn("ls", "out", prompt=[7, 8, 9]), drifted), CHAT)


def test_trailing_observation_and_empty_turn_are_not_kept() -> None:
    empty = Turn(Completion("", [], [], "length"), None, [])
    row = trajectory_tokens(_trajectory(_turn("ls", "big output"), empty, finish_reason="context_budget"), CHAT)
    assert row.response_ids == list(b"ls")
    assert row.loss_mask[-1] == 1


def test_missing_ids_or_logprobs_are_errors() -> None:
    no_ids = Turn(Completion("ls", None, None), None, [])
    with pytest.raises(TokenError, match="no token ids"):
        trajectory_tokens(_trajectory(no_ids), CHAT)
    with pytest.raises(TokenError, match="logprobs"):
        trajectory_tokens(_trajectory(_turn("ls", None, logprobs=False)), CHAT)
    assert trajectory_tokens(_trajectory(_turn("ls", None, logprobs=False)), CHAT, logprobs=False).logprobs == [0.0] * 2


def _result(outcome: Outcome, treatment: Treatment, reward: float, trajectory: Trajectory | None) -> EpisodeResult:
    grade = GradeResult(reward, reward > 0) if outcome in (Outcome.RESOLVED, Outcome.UNRESOLVED) else None
    return EpisodeResult(Episode("t:0"), outcome, reward, trajectory, grade, treatment=treatment)


@pytest.mark.parametrize(
    ("outcome", "treatment", "reward", "finish", "expected_reward", "trained", "reason"),
    [
        (Outcome.RESOLVED, Treatment.TRAIN, 1.0, "submitted", 1.0, True, "stop"),
        (Outcome.UNRESOLVED, Treatment.TRAIN, 0.0, "submitted", 0.0, True, "stop"),
        (Outcome.TRUNCATED, Treatment.ZERO_REWARD, 0.0, "max_turns", 0.0, True, "max_turns"),
        (Outcome.TRUNCATED, Treatment.ZERO_REWARD, 0.0, "context_budget", 0.0, True, "context"),
        (Outcome.TIMED_OUT, Treatment.MASK, 0.0, "running", 0.0, False, "timeout"),
        (Outcome.MODEL_ERROR, Treatment.MASK, 0.0, "running", 0.0, False, "engine_error"),
        (Outcome.SANDBOX_ERROR, Treatment.MASK, 0.0, "running", 0.0, False, "env_error"),
        # A resolved episode of a dropped group: masked, and kept out of group statistics by its stop reason.
        (Outcome.RESOLVED, Treatment.DROP_GROUP, 0.0, "submitted", 0.0, False, "env_error"),
    ],
)
def test_treatment_sets_mask_reward_and_stop_reason(
    outcome: Outcome,
    treatment: Treatment,
    reward: float,
    finish: str,
    expected_reward: float,
    trained: bool,
    reason: str,
) -> None:
    trajectory = _trajectory(_turn("ls", "x"), _turn("submit", None), finish_reason=finish)
    row = trajectory_tokens(trajectory, CHAT)
    generated = row.loss_mask.count(1)
    assert treat(row, _result(outcome, treatment, reward, trajectory)) == reason
    assert row.loss_mask.count(1) == (generated if trained else 0)
    assert sum(row.rewards) == expected_reward
    if expected_reward:
        assert row.rewards[len(row.response_ids) - 1] == expected_reward  # on the last generated token
    assert (reason in FAILURE_STOP_REASONS) is not trained


def test_last_turn_cut_by_length_is_a_length_stop() -> None:
    cut = Turn(Completion("subm", list(b"subm"), [-0.1] * 4, "length"), None, [])
    trajectory = _trajectory(_turn("ls", "x"), cut)
    row = trajectory_tokens(trajectory, CHAT)
    assert treat(row, _result(Outcome.UNRESOLVED, Treatment.TRAIN, 0.0, trajectory)) == "length"


def test_prompt_only_row_takes_its_treatment() -> None:
    row = TokenRow(CHAT.prompt_ids(START))
    assert treat(row, _result(Outcome.SANDBOX_ERROR, Treatment.MASK, 0.0, None)) == "env_error"
    assert (row.response_ids, row.loss_mask, row.rewards) == ([], [], [])


class _Engine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def generate(self, prompts: Any, params: Any) -> list[Any]:
        self.calls.append("generate")
        return []

    async def update_weights(self, weights: Any) -> None:
        self.calls.append("update_weights")

    async def pause(self) -> None:
        self.calls.append("pause")

    async def resume(self) -> None:
        self.calls.append("resume")

    async def close(self) -> None:
        self.calls.append("close")


def test_pausing_engine_stops_the_episode_clock_and_forwards() -> None:
    now = [0.0]
    clock = PausableClock(lambda: now[0])
    inner = _Engine()
    engine = PausingEngine(inner, clock)

    async def sync() -> None:
        await engine.pause()
        now[0] += 30.0  # a weight sync
        assert clock.paused
        await engine.update_weights([])
        await engine.resume()
        await engine.generate([[1]], None)
        await engine.close()

    asyncio.run(sync())
    assert inner.calls == ["pause", "update_weights", "resume", "generate", "close"]
    assert clock.active_s() == 0.0  # the 30 s paused counted for nothing
    assert clock.paused_total_s == 30.0


def test_bridge_imports_and_builds_without_torch_or_skyrl_train() -> None:
    code = """
import sys
sys.modules["torch"] = None
sys.modules["skyrl_train"] = None  # any import of them now raises
from skyrl_agent.integrations.skyrl_train import AgentGenerator, TrainEngineClient
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.testing import ByteChatTemplate
AgentGenerator(ProcessBackend(), ByteChatTemplate(), llm=null_policy())
TrainEngineClient(object(), ByteChatTemplate())
"""
    subprocess.run([sys.executable, "-c", code], check=True)
