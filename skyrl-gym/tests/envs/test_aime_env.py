import dataclasses
from typing import Any

import pytest
from omegaconf import OmegaConf

import skyrl_gym
from skyrl_gym.checker import check_env, hostile_actions
from skyrl_gym.envs.aime.env import AIMEEnv

PROMPT = [{"role": "user", "content": "Compute 2^10 mod 1000. End with 'Answer: <answer>'."}]


def extras(answer: Any = "24") -> dict[str, Any]:
    return {"reward_model": {"style": "rule", "ground_truth": answer}}


def run(action: str, answer: Any = "24", env_config: Any = None) -> Any:
    env = skyrl_gym.make("aime", env_config=env_config, extras=extras(answer))
    env.init(PROMPT)
    return env.step(action)


def test_correct_answer() -> None:
    out = run("2^10 = 1024.\nAnswer: 24")
    assert (out["reward"], out["done"], out["observations"]) == (1.0, True, [])
    assert out["metadata"] == {"acc": True, "pred": "24"}


def test_wrong_answer_scores_minus_one() -> None:
    out = run("Answer: 25")
    assert out["reward"] == -1.0
    assert out["metadata"] == {"acc": False, "pred": "25"}
    assert out["done"] is True


def test_missing_answer_scores_minus_one() -> None:
    out = run("I think it is 24.")
    assert out["reward"] == -1.0
    assert out["metadata"] == {"acc": False, "pred": "[INVALID]"}


@pytest.mark.parametrize(
    "action",
    ["Answer: $24$", "Answer: \\boxed{24}", "answer:24<|im_end|>", "Answer: 7\nso actually\nAnswer: 24"],
)
def test_minerva_normalisation(action: str) -> None:
    assert run(action)["reward"] == 1.0


def test_only_the_tail_is_searched() -> None:
    assert run("Answer: 24\n" + "x" * 400)["reward"] == -1.0


def test_integer_ground_truth() -> None:
    assert run("Answer: 24", answer=24)["reward"] == 1.0


def test_attributes() -> None:
    env = AIMEEnv(None, extras())
    assert env.ground_truth == "24"
    assert (env.turns, env.max_turns) == (0, 1)
    env.step("Answer: 24")
    assert env.turns == 1


@dataclasses.dataclass
class AimeConfig:
    strict_box_verify: bool = False


@pytest.mark.parametrize(
    ("env_config", "strict"),
    [
        (None, False),
        ({"strict_box_verify": True}, True),
        (AimeConfig(strict_box_verify=True), True),
        (AimeConfig(), False),
        (OmegaConf.create({"strict_box_verify": True}), True),
        (OmegaConf.create({"other": 1}), False),
    ],
    ids=repr,
)
def test_env_config_kinds_and_strict_box_mode(env_config: Any, strict: bool) -> None:
    boxed_only = "So the result is \\boxed{24}."
    assert run(boxed_only, env_config=env_config)["reward"] == (1.0 if strict else -1.0)


@pytest.mark.parametrize(
    ("bad_extras", "message"),
    [
        ({}, "reward_model field is required"),
        (None, "reward_model field is required"),
        ({"reward_spec": {"ground_truth": "24"}}, "reward_model field is required"),
        ({"reward_model": {"style": "rule"}}, "ground_truth is required in reward_model field"),
    ],
)
def test_upstream_assertion_messages(bad_extras: Any, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        skyrl_gym.make("aime", extras=bad_extras)


@pytest.mark.parametrize("name", list(hostile_actions()))
def test_hostile_actions_never_raise(name: str) -> None:
    out = run(hostile_actions()[name])
    assert out["done"] is True
    assert out["reward"] == -1.0


def test_check_env() -> None:
    assert "hostile_action[unicode]" in check_env("aime")
