"""``gsm8k``: one-turn grade-school math; the model answers once, ending with ``#### <number>``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs._extras import ground_truth
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, EpisodeSample
from skyrl_gym.envs.gsm8k import utils

__all__ = ["GSM8kEnv"]


class GSM8kEnv(BaseTextEnv):
    """Single-turn GSM8K: the episode ends after the first step.

    The reward is :func:`skyrl_gym.envs.gsm8k.utils.compute_score` in strict mode: ``1.0`` when the number after
    the first ``#### `` equals the ground truth (``,`` and ``$`` removed), ``0.0`` when it differs, and the
    integer ``0`` when the response has no ``#### <number>`` at all.

    Args:
        env_config: Unused; accepted for the common constructor signature.
        extras: Must hold ``{"reward_spec": {"ground_truth": "<answer>"}}``.

    Attributes:
        ground_truth: The reference answer, compared as a string.

    Raises:
        AssertionError: ``extras`` lacks ``reward_spec`` or its ``ground_truth`` (0.4 messages).
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.ground_truth = ground_truth(extras)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Score the answer; the episode is always done, with no further observations."""
        self.turns += 1
        reward = utils.compute_score(action, self.ground_truth)
        # A dict literal: calling the TypedDict class takes twice as long, ≈7% of a whole gsm8k episode.
        return {"observations": [], "reward": reward, "done": True, "metadata": {}}

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """A two-line word problem with its correct answer."""
        return EpisodeSample(
            prompt=[
                {
                    "role": "user",
                    "content": "Tom has 3 boxes of 12 pencils and gives away 7 pencils. How many pencils are left? "
                    "End your response with '#### <number>'.",
                }
            ],
            extras={"reward_spec": {"method": "rule", "ground_truth": "29"}},
            actions=("3 * 12 = 36 pencils, and 36 - 7 = 29.\n#### 29",),
        )
