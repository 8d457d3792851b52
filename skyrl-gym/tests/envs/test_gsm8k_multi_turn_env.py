import dataclasses
from typing import Any

import pytest
from omegaconf import OmegaConf

import skyrl_gym
from skyrl_gym.checker import check_env, hostile_actions
from skyrl_gym.envs.gsm8k.multi_turn_env import (
    DEFAULT_MAX_TURNS,
    MISSING_ANSWER_FEEDBACK,
    WRONG_ANSWER_FEEDBACK,
    GSM8kMultiTurnEnv,
)
from skyrl_gym.metrics import aggregate_for_environment

PROMPT = [{"role": "user", "content": "What is 6 * 7? End with '#### <number>'."}]


def extras(answer: Any = "42", **more: Any) -> dict[str, Any]:
    return {"reward_spec": {"method": "rule", "ground_truth": answer}, **more}


def make(max_turns: int | None = 3, **more: Any) -> Any:
    row = extras(**more) if max_turns is None else extras(max_turns=max_turns, **more)
    env = skyrl_gym.make("gsm8k_multi_turn", extras=row)
    env.init(PROMPT)
    return env


def test_correct_first_answer_ends_with_one() -> None:
    env = make()
    out = env.step("#### 42")
    assert (out["reward"], out["done"], out["observations"]) == (1.0, True, [])
    assert out["metadata"] == {"parsed_answer": "42"}
    assert env.turns == 1
    assert env.get_metrics() == {"steps": 1}


def test_wrong_formatted_answer_gets_format_reward_and_feedback() -> None:
    env = make(max_turns=4)
    out = env.step("#### 41")
    assert out["reward"] == pytest.approx(0.2 / 4)
    assert out["done"] is False
    assert out["observations"] == [{"role": "user", "content": WRONG_ANSWER_FEEDBACK}]
    assert "#### ANSWER" in WRONG_ANSWER_FEEDBACK


def test_unformatted_answer_gets_zero_and_asks_for_the_format() -> None:
    env = make()
    out = env.step("It is forty-two.")
    assert out["reward"] == 0.0
    assert out["done"] is False
    assert out["observations"] == [{"role": "user", "content": MISSING_ANSWER_FEEDBACK}]
    assert "#### ANSWER" in MISSING_ANSWER_FEEDBACK
    assert out["metadata"] == {"parsed_answer": None}


def test_episode_ends_at_max_turns_with_last_turn_reward() -> None:
    env = make(max_turns=3)
    rewards = []
    for action in ["no idea", "#### 40", "#### 41"]:
        out = env.step(action)
        rewards.append(out["reward"])
    assert out["done"] is True
    assert out["observations"] == []
    assert rewards == [0.0, pytest.approx(0.2 / 3), pytest.approx(0.2 / 3)]
    assert env.turns == 3
    assert env.get_metrics() == {"steps": 3}


def test_correct_answer_on_a_later_turn() -> None:
    env = make(max_turns=5)
    assert env.step("#### 1")["done"] is False
    out = env.step("#### 42")
    assert (out["reward"], out["done"]) == (1.0, True)
    assert env.get_metrics() == {"steps": 2}


def test_max_turns_sources() -> None:
    assert make(max_turns=None).max_turns == DEFAULT_MAX_TURNS == 5
    assert make(max_turns=2).max_turns == 2
    assert make(max_turns=None, extra_info={"max_turns": 7}).max_turns == 7
    assert make(max_turns=2, extra_info={"max_turns": 7}).max_turns == 2  # the top-level value wins
    assert make(max_turns=None, extra_info={"split": "train"}).max_turns == 5
    with pytest.raises(ValueError, match="max_turns"):
        make(max_turns=0)


def test_aggregate_metrics() -> None:
    metrics = [{"steps": 1}, {"steps": 4}]
    assert GSM8kMultiTurnEnv.aggregate_metrics(metrics) == {"avg_steps": 2.5}
    assert aggregate_for_environment("gsm8k_multi_turn", metrics) == {"avg_steps": 2.5}
    assert GSM8kMultiTurnEnv.aggregate_metrics([]) == {}


@dataclasses.dataclass
class SomeConfig:
    unused: int = 1


@pytest.mark.parametrize("env_config", [None, {"x": 1}, SomeConfig(), OmegaConf.create({"x": 1})], ids=repr)
def test_accepts_any_env_config(env_config: Any) -> None:
    env = skyrl_gym.make("gsm8k_multi_turn", env_config=env_config, extras=extras(max_turns=2))
    assert env.step("#### 42")["reward"] == 1.0
    assert GSM8kMultiTurnEnv(env_config, extras()).max_turns == 5


@pytest.mark.parametrize(
    ("bad_extras", "message"),
    [
        ({}, "reward_spec field is required"),
        ({"max_turns": 3}, "reward_spec field is required"),
        ({"reward_spec": {"method": "rule"}}, "ground_truth is required in reward_spec field"),
    ],
)
def test_upstream_assertion_messages(bad_extras: dict[str, Any], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        skyrl_gym.make("gsm8k_multi_turn", extras=bad_extras)


@pytest.mark.parametrize("name", list(hostile_actions()))
def test_hostile_actions_never_raise(name: str) -> None:
    env = make(max_turns=2)
    out = env.step(hostile_actions()[name])
    assert out["done"] is False
    assert len(out["observations"]) == 1


def test_check_env() -> None:
    passed = check_env("gsm8k_multi_turn")
    assert "terminates" in passed
    assert "aggregate_metrics" in passed
