"""The generator protocol: prompts + environments + an inference engine → token-level trajectories.

The trainer calls a :class:`Generator` and never sees environments, sandboxes or agent loops; long-horizon agent
layers plug in by implementing this protocol.

Per trajectory ``i`` the output holds the prompt ids and the response ids. The response interleaves tokens the
model generated (``loss_masks[i][t] == 1``) and tokens of environment observations (``0``). ``rewards[i]`` is
token-level: each turn's reward sits on that turn's last generated token, zeros elsewhere. ``rollout_logprobs``
has the engine's log-probability for generated tokens and ``0.0`` for observation tokens; ``policy_versions``, when
the engine reports them, the policy version of each generated token (turns of one trajectory may differ when
weights change between them) and ``-1`` for observation tokens.

Step-wise samples. A trajectory that cannot be one token row (an agent that rewrote its context, so a later prompt
does not extend the earlier ones) may be several rows: ``is_last_step`` then flags each row, a trajectory's rows
are consecutive and share its trajectory id, and only its last row is flagged. A trajectory's reward is the sum of
its rows' rewards (an outcome reward usually sits on the last row); the trainer scores each trajectory once, on its
last row (a group's statistics count trajectories, not rows), and gives every row of it that row's advantage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from skyrl_gym.envs.base_text_env import ConversationType
from skyrl_train.inference.base import SamplingParams

TrajectoryStopReason = Literal[
    "stop",  # the env said done
    "length",  # the response hit its token budget
    "max_turns",  # the turn limit ended the episode
    "context",  # the next prompt would exceed max_input_length
    "env_error",  # the env raised in init/step/close
    "engine_error",  # the inference engine failed for this trajectory
    "timeout",  # the trajectory ran past its deadline
]

FAILURE_STOP_REASONS: frozenset[TrajectoryStopReason] = frozenset({"env_error", "engine_error", "timeout"})
"""Stop reasons of trajectories that failed; they are masked out of the loss and out of group statistics."""


@dataclass
class GeneratorInput:
    """One batch of prompts to roll out; every list has one entry per trajectory."""

    prompts: list[ConversationType]
    env_classes: list[str]
    env_extras: list[dict[str, Any]]
    trajectory_ids: list[str]  # "<prompt uid>:<sample index>"; samples of one prompt share the uid
    sampling_params: SamplingParams
    training: bool = True  # False for evaluation rollouts
    global_step: int = 0


@dataclass
class GeneratorOutput:
    """Token-level trajectories, aligned with the :class:`GeneratorInput` they came from."""

    prompt_token_ids: list[list[int]]
    response_ids: list[list[int]]
    loss_masks: list[list[int]]
    rewards: list[list[float]]
    rollout_logprobs: list[list[float]] | None
    stop_reasons: list[TrajectoryStopReason]
    trajectory_ids: list[str]
    env_metrics: list[dict[str, Any]] = field(default_factory=list)  # per row, from env.get_metrics()
    metrics: dict[str, float] = field(default_factory=dict)  # batch-level rollout statistics
    # Per response token, the policy version that generated it (-1 on observation tokens); None when the engine
    # does not report versions (see skyrl_train.inference.versioned).
    policy_versions: list[list[int]] | None = None
    # Per row, whether it ends its trajectory (see "Step-wise samples" above); None: every row is a whole trajectory.
    is_last_step: list[bool] | None = None

    def __len__(self) -> int:
        return len(self.response_ids)

    def last_steps(self) -> list[bool]:
        """Per row, whether it ends its trajectory (all True without step-wise samples)."""
        return list(self.is_last_step) if self.is_last_step is not None else [True] * len(self)

    def trajectory_rewards(self) -> list[float]:
        """Each trajectory's reward (its token rewards summed over all its rows), in input order."""
        totals, running = [], 0.0
        for rewards, last in zip(self.rewards, self.last_steps(), strict=True):
            running += sum(rewards)
            if last:
                totals.append(running)
                running = 0.0
        return totals


@runtime_checkable
class Generator(Protocol):
    """Anything that turns a :class:`GeneratorInput` into a :class:`GeneratorOutput` of its trajectories, in order.

    One row per input trajectory, or with step-wise samples one or more (see the module docstring).
    """

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        """Roll out every trajectory of ``batch``; never raises for one trajectory's failure."""
        ...
