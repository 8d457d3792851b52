"""Settings of the default generator (:class:`~skyrl_train.generators.skyrl_gym_generator.SkyRLGymGenerator`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FailurePolicy", "GeneratorConfig"]

FailurePolicy = Literal["mask", "raise"]
"""``mask``: a failed trajectory is returned with loss mask and rewards all 0; ``raise``: ``generate`` raises."""


@dataclass(frozen=True)
class GeneratorConfig:
    """Settings of :class:`~skyrl_train.generators.skyrl_gym_generator.SkyRLGymGenerator`.

    Lengths are in tokens, times in seconds.
    """

    max_turns: int = 1  # turns per trajectory; every env also gets it as extras["max_turns"]
    max_input_length: int = 4096  # most tokens one engine call may take (prompt + response so far)
    max_generate_length: int | None = 1024  # new tokens per turn at most (sampling_params.max_tokens also caps)
    max_response_length: int | None = None  # response tokens per trajectory at most (generated + observations)
    batched: bool = False  # single-turn only: one engine call for the whole batch
    env_configs: Mapping[str, Any] = field(default_factory=dict)  # env class → its env_config for make()
    max_concurrent_trajectories: int | None = None  # trajectories running at once; None: all of them
    timeout_s: float | None = None  # deadline per trajectory, counted from when it starts running; None: none
    close_timeout_s: float = 60.0  # deadline for get_metrics + close of one env
    max_env_workers: int | None = 32  # own env thread pool of this size; None: skyrl_gym's; 0: inline (debugging)
    zero_reward_on_non_stop: bool = False  # training only: zero the rewards of trajectories not ending in "stop"
    apply_overlong_filtering: bool = False  # training only: zero the loss mask of trajectories ending in "length"
    on_failure: FailurePolicy = "mask"  # what a failed trajectory does to the batch (generator module docstring)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # extra chat template variables
    end_of_turn_token_id: int | None = None  # None: detected from the chat template

    def __post_init__(self) -> None:
        _require(self.max_turns >= 1, f"max_turns must be >= 1, got {self.max_turns}")
        _require(self.max_input_length >= 1, f"max_input_length must be >= 1, got {self.max_input_length}")
        for name in ("max_generate_length", "max_response_length", "max_concurrent_trajectories"):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"{name} must be None or >= 1, got {value}")
        workers = self.max_env_workers
        _require(workers is None or workers >= 0, f"max_env_workers must be None or >= 0, got {workers}")
        for name in ("timeout_s", "close_timeout_s"):
            value = getattr(self, name)
            _require(value is None or value > 0, f"{name} must be positive, got {value}")
        _require(not self.batched or self.max_turns == 1, "batched mode is single-turn: set max_turns=1")
        _require(self.on_failure in ("mask", "raise"), f"on_failure must be 'mask' or 'raise', not {self.on_failure!r}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
