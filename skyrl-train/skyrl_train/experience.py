"""From generated trajectories to the tensors one RL step trains on.

:func:`to_training_batch` collates a :class:`GeneratorOutput` into a :class:`TrainingBatch` whose ``tensors``
hold ``rewards`` (token-level) and ``rollout_log_probs``, plus the ``[B]`` prompt-group index the advantage
estimators and ``prompt_mean`` need. Trajectories that failed (env error, engine error, timeout) get a group of
their own, so their zero reward never enters the statistics of the prompt group they came from; the generator
has already zeroed their loss mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from skyrl_train.backends.base import TrainingBatch
from skyrl_train.batch import collate
from skyrl_train.generators.base import FAILURE_STOP_REASONS, GeneratorOutput


@dataclass
class Experience:
    """One step's trajectories as tensors, with what the loop needs to compute advantages and log metrics."""

    batch: TrainingBatch  # tensors["rewards"], tensors["rollout_log_probs"] ([B, T]) besides the layout
    group_index: torch.Tensor  # [B] int64 prompt group of each row (failed rows: a group of their own)
    trajectory_ids: list[str]
    stop_reasons: list[str]

    @property
    def sequence_rewards(self) -> torch.Tensor:
        """``[B]`` float: each trajectory's summed token rewards."""
        return self.batch.tensors["rewards"].sum(-1)


def prompt_uid(trajectory_id: str) -> str:
    """The prompt part of ``"<prompt uid>:<sample index>"``."""
    return trajectory_id.rsplit(":", 1)[0]


def group_index_of(trajectory_ids: Sequence[str], stop_reasons: Sequence[str]) -> torch.Tensor:
    """``[B]`` group ids: rows of one prompt share an id; each failed row gets a fresh one."""
    ids: dict[str, int] = {}
    out = []
    for trajectory_id, reason in zip(trajectory_ids, stop_reasons, strict=True):
        key = trajectory_id if reason in FAILURE_STOP_REASONS else prompt_uid(trajectory_id)
        out.append(ids.setdefault(key, len(ids)))
    return torch.tensor(out, dtype=torch.long)


def to_experience(output: GeneratorOutput, pad_token_id: int) -> Experience:
    """Collate a generator's output (see the module docstring)."""
    logprobs = output.rollout_logprobs or [[0.0] * len(r) for r in output.response_ids]
    batch = collate(
        output.prompt_token_ids,
        output.response_ids,
        output.loss_masks,
        pad_token_id=pad_token_id,
        per_token={"rewards": output.rewards, "rollout_log_probs": logprobs},
    )
    stop_reasons = [str(reason) for reason in output.stop_reasons]
    return Experience(
        batch=batch,
        group_index=group_index_of(output.trajectory_ids, stop_reasons),
        trajectory_ids=list(output.trajectory_ids),
        stop_reasons=stop_reasons,
    )
