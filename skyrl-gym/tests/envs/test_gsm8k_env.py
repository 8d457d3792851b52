import dataclasses
from typing import Any

import pytest
from omegaconf import OmegaConf

import skyrl_gym
from skyrl_gym.checker import check_env, hostile_actions
from skyrl_gym.envs.gsm8k.env import GSM8kEnv

PROMPT = [{"role": "user", "content": "What is 6 * 7? End with '#### <number>'."}]


def extras(answer: Any = "42") -> dict[str, Any]:
    return {"reward_spec": {"method": "rule", "ground_truth": answer}}


@dataclasses.dataclass
class SomeConfig:
    unused: int = 1


def run(action: str, answer: Any = "42") -> Any:
    env = skyrl_gym.make("gsm8k", extras=extras(answer))
    env.init(PROMPT)
    return env.step(action)


def test_correct_answer_scores_one_and_ends_the_episode() -> None:
    out = run("6 * 7 = 42\n#### 42")
    assert out["reward"] == 1.0
    assert isinstance(out["reward"], float)
    assert out["done"] is True
    assert out["observations"] == []
    assert out["metadata"] == {}


def test_wrong_answer_scores_float_zero() -> None:
    out = run("#### 41")
    assert out["reward"] == 0.0
    assert isinstance(out["reward"], float)
    assert out["done"] is True


def test_missing_answer_scores_int_zero() -> None:
    out = run("The answer is 42.")
    assert out["reward"] == 0
    assert type(out["reward"]) is int
    assert out["done"] is True
    assert out["observations"] == []


@pytest.mark.parametrize(
    ("action", "answer", "reward"),
    [
        ("#### 1,000", "1000", 1.0),
        ("#### $1,000", "1000", 0),  # "$" right after the marker is not a number: no match
        ("#### -3", "-3", 1.0),
        ("#### 72.", "72", 0.0),  # strict: no numeric normalisation beyond "," and "$"
        ("#### 12 then #### 13", "12", 1.0),  # the first marker counts
        ("####42", "42", 0),  # the marker needs its space
    ],
)
def test_strict_extraction(action: str, answer: str, reward: float) -> None:
    assert run(action, answer)["reward"] == reward


def test_non_string_ground_truth_is_compared_as_string() -> None:
    assert run("#### 42", answer=42)["reward"] == 1.0


def test_attributes() -> None:
    env = GSM8kEnv(None, extras("7"))
    assert env.ground_truth == "7"
    assert (env.turns, env.max_turns) == (0, 1)
    env.step("#### 7")
    assert env.turns == 1
    assert env.get_metrics() == {}


@pytest.mark.parametrize(
    "env_config", [None, {}, {"anything": 1}, SomeConfig(), OmegaConf.create({"anything": 1})], ids=repr
)
def test_accepts_any_env_config(env_config: Any) -> None:
    env = skyrl_gym.make("gsm8k", env_config=env_config, extras=extras())
    assert env.step("#### 42")["reward"] == 1.0
    positional = GSM8kEnv(env_config, extras())
    assert positional.step("#### 42")["reward"] == 1.0


@pytest.mark.parametrize(
    ("bad_extras", "message"),
    [
        ({}, "reward_spec field is required"),
        (None, "reward_spec field is required"),
        ({"reward_spec": {}}, "ground_truth is required in reward_spec field"),
        ({"reward_spec": None}, "ground_truth is required in reward_spec field"),
    ],
)
def test_upstream_assertion_messages(bad_extras: Any, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        skyrl_gym.make("gsm8k", extras=bad_extras)
    with pytest.raises(AssertionError, match=message):
        GSM8kEnv(extras=bad_extras)


def test_extras_from_omegaconf() -> None:
    env = GSM8kEnv(extras=OmegaConf.create(extras("5")))
    assert env.step("#### 5")["reward"] == 1.0


@pytest.mark.parametrize("name", list(hostile_actions()))
def test_hostile_actions_never_raise(name: str) -> None:
    out = run(hostile_actions()[name])
    assert out["done"] is True
    assert out["reward"] in (0, 0.0, 1.0)


def test_check_env() -> None:
    passed = check_env("gsm8k")
    assert "final_observations" in passed
    assert "hostile_action[huge_100kb]" in passed
