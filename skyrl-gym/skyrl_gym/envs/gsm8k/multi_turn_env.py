"""``gsm8k_multi_turn``: GSM8K with retries; a wrong or missing answer gets feedback and another turn."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs._extras import ground_truth, turn_budget
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, EpisodeSample
from skyrl_gym.envs.gsm8k import utils

__all__ = ["DEFAULT_MAX_TURNS", "MISSING_ANSWER_FEEDBACK", "WRONG_ANSWER_FEEDBACK", "GSM8kMultiTurnEnv"]

DEFAULT_MAX_TURNS = 5
"""Turn budget when ``extras`` sets none."""

WRONG_ANSWER_FEEDBACK = "Your answer is incorrect. Check your work and try again. End with '#### ANSWER'."
"""The user message after a well-formatted but wrong answer."""

MISSING_ANSWER_FEEDBACK = (
    "I could not find a final answer. Solve the problem and end your response with '#### ANSWER', "
    "where ANSWER is a number."
)
"""The user message after a response without ``#### <number>``."""


class GSM8kMultiTurnEnv(BaseTextEnv):
    """GSM8K with up to ``max_turns`` attempts and turn-level rewards.

    Each step's reward: ``1.0`` for a correct answer, ``0.2 / max_turns`` for a well-formatted wrong answer
    (``#### <number>`` present), ``0.0`` otherwise. The episode ends on a correct answer or when
    ``turns >= max_turns``; until then each step returns one user message asking for another attempt.

    Args:
        env_config: Unused; accepted for the common constructor signature.
        extras: Must hold ``{"reward_spec": {"ground_truth": ...}}``; the turn budget comes from
            ``extras["max_turns"]``, else ``extras["extra_info"]["max_turns"]``, else :data:`DEFAULT_MAX_TURNS`.

    Attributes:
        ground_truth: The reference answer, compared as a string.

    Raises:
        AssertionError: ``extras`` lacks ``reward_spec`` or its ``ground_truth`` (0.4 messages).
        ValueError: ``max_turns`` is not a whole number >= 1.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.ground_truth = ground_truth(extras)
        self.max_turns = turn_budget(extras, DEFAULT_MAX_TURNS)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Score one attempt; end the episode on success or when the turn budget is used up."""
        self.turns += 1
        answer = utils.extract_solution(action)
        correct = answer is not None and answer == str(self.ground_truth)
        if correct:
            reward = 1.0
        elif answer is not None:
            reward = 0.2 / self.max_turns
        else:
            reward = 0.0
        metadata = {"parsed_answer": answer}
        if correct or self.turns >= self.max_turns:
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata=metadata)
        feedback = WRONG_ANSWER_FEEDBACK if answer is not None else MISSING_ANSWER_FEEDBACK
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": feedback}], reward=reward, done=False, metadata=metadata
        )

    def get_metrics(self) -> dict[str, Any]:
        """``{"steps": turns taken}``."""
        return {"steps": self.turns}

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """``{"avg_steps": mean steps per episode}``; ``{}`` for no episodes."""
        steps = [m["steps"] for m in metrics if "steps" in m]
        if not steps:
            return {}
        return {"avg_steps": sum(steps) / len(steps)}

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """A word problem answered wrongly, then correctly."""
        return EpisodeSample(
            prompt=[
                {
                    "role": "user",
                    "content": "A baker makes 4 trays of 15 rolls and sells 38. How many rolls are left? "
                    "End your response with '#### <number>'.",
                }
            ],
            extras={"reward_spec": {"method": "rule", "ground_truth": "22"}, "max_turns": 3},
            actions=("4 * 15 = 45, 45 - 38 = 7.\n#### 7", "4 * 15 = 60, and 60 - 38 = 22.\n#### 22"),
        )
