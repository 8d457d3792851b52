"""From generated trajectories to the tensors one RL step trains on.

:func:`to_experience` collates a :class:`GeneratorOutput` into a :class:`TrainingBatch` whose ``tensors``
hold ``rewards`` (token-level) and, when the engine reported them, ``rollout_log_probs`` and ``policy_versions``
(:data:`POLICY_VERSIONS`: the version of the policy that generated each token), plus the ``[B]``
prompt-group index the advantage estimators, mini-batches and ``prompt_mean`` need. A trajectory that failed (env
error, engine error, timeout) stays in its prompt's group, so mini-batches are made of whole prompts whatever
failed; :attr:`Experience.failed` marks it, so its zero reward never enters its group's statistics (see
``skyrl_train.algorithms.advantages``); the generator has already zeroed its loss mask. A trajectory of several
step-wise rows (see ``skyrl_train.generators.base``) enters group statistics once, through its last row
(:attr:`Experience.counted`); :attr:`Experience.trajectory_end` maps every row to that row.

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

POLICY_VERSIONS = "policy_versions"
"""``tensors`` key of the ``[B, T]`` policy version of each generated token (float; -1 on observations, 0 on padding:
read it where the loss mask is 1)."""


@dataclass
class Experience:
    """One step's trajectories as tensors, with what the loop needs to compute advantages and log metrics."""

    batch: TrainingBatch  # tensors["rewards"] and (when reported) tensors["rollout_log_probs"], [B, T]
    group_index: torch.Tensor  # [B] int64 prompt group of each row, failed rows included
    trajectory_ids: list[str]
    stop_reasons: list[str]
    last_step: torch.Tensor | None = None  # [B] bool: the row ends its trajectory; None: every row does

    @property
    def step_wise(self) -> bool:
        """Whether some trajectory spans several rows."""
        return self.last_step is not None and not bool(self.last_step.all())

    @property
    def counted(self) -> torch.Tensor:
        """``[B]`` bool: the rows that enter group statistics (last rows of trajectories that did not fail)."""
        return _last_step(self) & ~self.failed

    @property
    def trajectory_end(self) -> torch.Tensor:
        """``[B]`` int64: for each row, the row that ends its trajectory (itself without step-wise rows)."""
        rows = len(self.stop_reasons)
        if self.last_step is None:
            return torch.arange(rows, dtype=torch.long)
        ends, end = [0] * rows, rows - 1
        for row in reversed(range(rows)):  # a trajectory's rows are consecutive, its last row flagged
            if bool(self.last_step[row]):
                end = row
            ends[row] = end
        return torch.tensor(ends, dtype=torch.long)

    @property
    def sequence_rewards(self) -> torch.Tensor:
        """``[B]`` float: each row's summed token rewards."""
        return self.batch.tensors["rewards"].sum(-1)

    @property
    def trajectory_rewards(self) -> torch.Tensor:
        """``[B]`` float: the reward of each row's trajectory, summed over its rows (its one row without steps)."""
        rewards = self.sequence_rewards
        if not self.step_wise:
            return rewards
        end = self.trajectory_end
        return torch.zeros_like(rewards).index_add(0, end, rewards)[end]

    @property
    def failed(self) -> torch.Tensor:
        """``[B]`` bool: the trajectories that failed (stop reason in ``FAILURE_STOP_REASONS``)."""
        return torch.tensor([reason in FAILURE_STOP_REASONS for reason in self.stop_reasons], dtype=torch.bool)

    @property
    def num_groups(self) -> int:
        """The number of prompt groups, whether or not some of their trajectories failed."""
        return int(torch.unique(self.group_index).numel())


def prompt_uid(trajectory_id: str) -> str:
    """The prompt part of ``"<prompt uid>:<sample index>"``."""
    return trajectory_id.rsplit(":", 1)[0]


def group_index_of(trajectory_ids: Sequence[str]) -> torch.Tensor:
    """``[B]`` group ids: rows of one prompt share an id, in order of first appearance."""
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(prompt_uid(t), len(ids)) for t in trajectory_ids], dtype=torch.long)


def to_experience(output: GeneratorOutput, pad_token_id: int) -> Experience:
    """Collate a generator's output (see the module docstring).

    A trajectory whose env failed before its prompt was rendered has no prompt tokens; it gets one pad token, so
    the row can ride along (masked) with its group.
    """
    _check_steps(output)
    stop_reasons = [str(reason) for reason in output.stop_reasons]
    prompts = [
        list(ids) if ids or reason not in FAILURE_STOP_REASONS else [pad_token_id]
        for ids, reason in zip(output.prompt_token_ids, stop_reasons, strict=True)
    ]
    per_token: dict[str, Sequence[Sequence[float]]] = {"rewards": output.rewards}
    if output.rollout_logprobs is not None:
        per_token["rollout_log_probs"] = output.rollout_logprobs
    if output.policy_versions is not None:
        per_token[POLICY_VERSIONS] = output.policy_versions
    batch = collate(prompts, output.response_ids, output.loss_masks, pad_token_id=pad_token_id, per_token=per_token)
    return Experience(
        batch=batch,
        group_index=group_index_of(output.trajectory_ids),
        trajectory_ids=list(output.trajectory_ids),
        stop_reasons=stop_reasons,
        last_step=None if output.is_last_step is None else torch.tensor(output.is_last_step, dtype=torch.bool),
    )


def _check_steps(output: GeneratorOutput) -> None:
    """Raise ``ValueError`` unless ``is_last_step`` describes consecutive rows per trajectory, its last one flagged."""
    flags = output.is_last_step
    if flags is None:
        return
    if len(flags) != len(output):
        raise ValueError(
            f"the generator returned {len(flags)} is_last_step flags for {len(output)} rows: give one per row"
        )
    if flags and not flags[-1]:
        raise ValueError(
            "the generator's last row is not flagged is_last_step: every trajectory must end in a last row"
        )
    for row in range(len(flags) - 1):
        if not flags[row] and output.trajectory_ids[row] != output.trajectory_ids[row + 1]:
            raise ValueError(
                f"row {row} ({output.trajectory_ids[row]!r}) is not a last step but row {row + 1} belongs to "
                f"{output.trajectory_ids[row + 1]!r}: a trajectory's rows must be consecutive, its last one flagged"
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
        last_step=None if experience.last_step is None else experience.last_step[rows.cpu()],
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
        last_step=_concat_last_steps(parts),
    )


def _concat_last_steps(parts: Sequence[Experience]) -> torch.Tensor | None:
    if all(part.last_step is None for part in parts):
        return None
    return torch.cat([_last_step(part) for part in parts])


def _last_step(experience: Experience) -> torch.Tensor:
    """``[B]`` bool: the rows that end their trajectory."""
    rows = len(experience.stop_reasons)
    return experience.last_step if experience.last_step is not None else torch.ones(rows, dtype=torch.bool)
