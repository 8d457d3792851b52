"""From generated trajectories to the tensors one RL step trains on.

:func:`to_training_batch` collates a :class:`GeneratorOutput` into a :class:`TrainingBatch` whose ``tensors``
hold ``rewards`` (token-level) and ``rollout_log_probs``, plus the ``[B]`` prompt-group index the advantage
estimators and ``prompt_mean`` need. Trajectories that failed (env error, engine error, timeout) get a group of
their own, so their zero reward never enters the statistics of the prompt group they came from; the generator
has already zeroed their loss mask.

:func:`select_rows` and :func:`concat_experiences` reshape a step's experience by whole prompt groups (DAPO's
dynamic sampling keeps, drops, duplicates and accumulates groups).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from skyrl_train.backends.base import TrainingBatch
from skyrl_train.batch import collate, concat_batches
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

    @property
    def num_groups(self) -> int:
        """The number of prompt groups (a failed row counts as a group of its own)."""
        return int(torch.unique(self.group_index).numel())


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


def select_rows(experience: Experience, rows: torch.Tensor, group_index: torch.Tensor) -> Experience:
    """The rows at ``rows`` (``[M]`` int64, repeats allowed) with the new group ids ``group_index`` (``[M]``)."""
    if rows.shape != group_index.shape:
        raise ValueError(f"rows {tuple(rows.shape)} and group_index {tuple(group_index.shape)} must have one shape")
    picked = rows.tolist()
    return Experience(
        batch=experience.batch.select(rows),
        group_index=group_index.clone(),
        trajectory_ids=[experience.trajectory_ids[i] for i in picked],
        stop_reasons=[experience.stop_reasons[i] for i in picked],
    )


def concat_experiences(parts: Sequence[Experience], pad_token_id: int) -> Experience:
    """One experience holding the rows of ``parts`` in order, re-padded to a common layout.

    Group ids of later parts are shifted past those of earlier ones: two parts never share a group, even when
    the same prompt was sampled in both, so every group keeps the statistics it was selected for.
    """
    offset, group_index = 0, []
    for part in parts:
        group_index.append(part.group_index + offset)
        offset += int(part.group_index.max()) + 1 if len(part.group_index) else 0
    return Experience(
        batch=concat_batches([part.batch for part in parts], pad_token_id),
        group_index=torch.cat(group_index),
        trajectory_ids=[i for part in parts for i in part.trajectory_ids],
        stop_reasons=[r for part in parts for r in part.stop_reasons],
    )
