"""``aime``: one-turn competition math; the model ends with ``Answer: <answer>``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.config import config_get
from skyrl_gym.envs._extras import ground_truth
from skyrl_gym.envs.aime import utils
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, EpisodeSample

__all__ = ["AIMEEnv"]


class AIMEEnv(BaseTextEnv):
    r"""Single-turn AIME: the episode ends after the first step.

    The reward is :func:`skyrl_gym.envs.aime.utils.compute_score`: ``1.0`` when the last ``Answer:`` in the
    response's final 300 characters matches the ground truth after Minerva normalisation, else ``-1.0``.
    The step's metadata is ``{"acc": bool, "pred": normalised prediction}``.

    Args:
        env_config: Optional; ``strict_box_verify`` (default ``False``) switches to comparing the last
            ``\boxed{}`` exactly.
        extras: Must hold ``{"reward_model": {"ground_truth": "<answer>"}}`` (``reward_model``, not
            ``reward_spec``, as in the AIME datasets of skyrl-gym 0.4).

    Attributes:
        ground_truth: The reference answer.

    Raises:
        AssertionError: ``"reward_model field is required"`` or
            ``"ground_truth is required in reward_model field"``.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.ground_truth = ground_truth(extras, field="reward_model")
        self.strict_box_verify = bool(config_get(env_config, "strict_box_verify", False))

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Score the answer; the episode is always done, with no further observations."""
        self.turns += 1
        score = utils.compute_score(action, self.ground_truth, strict_box_verify=self.strict_box_verify)
        return BaseTextEnvStepOutput(
            observations=[],
            reward=score["score"],
            done=True,
            metadata={"acc": score["acc"], "pred": score["pred"]},
        )

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """A short problem with its correct answer."""
        return EpisodeSample(
            prompt=[
                {
                    "role": "user",
                    "content": "Find the remainder when 2^10 is divided by 1000. "
                    "Put your final answer on its own line as 'Answer: <answer>'.",
                }
            ],
            extras={"reward_model": {"style": "rule", "ground_truth": "24"}},
            actions=("2^10 = 1024, and 1024 mod 1000 = 24.\nAnswer: 24",),
        )
