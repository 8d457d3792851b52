"""DAPO's batch filters (Yu et al., arXiv 2503.14476): dynamic sampling and overlong filtering, plus reward zeroing.

Group-relative advantages vanish when every response to a prompt gets the same reward; such groups only dilute
the batch. *Dynamic sampling* drops them (``filter_groups``) and asks the caller for more groups, or duplicates
informative groups in their place (``replace_groups``). *Overlong filtering* removes truncated responses from the
loss, since a truncation says nothing about the quality of the reasoning so far.

Shapes: ``scores`` ``[B]`` float (each row's summed reward, ``token_level_rewards.sum(-1)``), ``group_index``
``[B]`` int64 prompt-group ids, ``loss_mask`` / ``token_level_rewards`` ``[B, T]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from skyrl_train.algorithms.groups import group_stats

DynamicSamplingType = Literal["filter", "replace"]
"""The dynamic sampling strategies: ``filter_groups`` and ``replace_groups``."""


def zero_variance_rows(
    scores: torch.Tensor, group_index: torch.Tensor, tol: float = 1e-6, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B]`` bool: True for rows whose group's rewards have std ≤ ``tol``.

    Only ``valid`` rows (``[B]`` bool, default all; False marks failed trajectories) count, so a group left with
    fewer than two valid rows is zero-variance: it has no spread to learn from (its advantage is 0 too).
    """
    _, std, _ = group_stats(scores.double(), group_index, valid)  # float64: tol is far below float32 resolution
    return std <= tol


def mask_zero_variance_groups(
    loss_mask: torch.Tensor,
    scores: torch.Tensor,
    group_index: torch.Tensor,
    tol: float = 1e-6,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``loss_mask`` ``[B, T]`` with the rows of zero-variance groups set to 0 (the batch keeps its shape)."""
    keep = ~zero_variance_rows(scores, group_index, tol, valid).to(loss_mask.device)
    return loss_mask * keep.unsqueeze(-1).to(loss_mask.dtype)


@dataclass(frozen=True)
class DynamicSamplingResult:
    """Which rows to train on, and how many more groups the caller must sample first."""

    row_index: torch.Tensor  # [M] int64 rows of the input batch, group by group; may repeat rows (replace)
    group_index: torch.Tensor  # [M] int64 fresh group ids 0, 1, …; a duplicated group gets its own id
    num_groups_needed: int  # 0: the batch is ready; otherwise sample this many more groups and call again


def filter_groups(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    target_num_groups: int,
    tol: float = 1e-6,
    valid: torch.Tensor | None = None,
) -> DynamicSamplingResult:
    """DAPO dynamic sampling, ``filter`` strategy: keep the first ``target_num_groups`` groups with reward variance.

    Groups keep their order of first appearance. If fewer informative groups exist, all are kept and
    ``num_groups_needed`` says how many are missing; the caller samples again (up to its ``max_sample_batches``)
    and calls this on the accumulated batch. Variance is over the ``valid`` rows (see :func:`zero_variance_rows`);
    a kept group keeps its failed rows.
    """
    zero_variance = zero_variance_rows(scores, group_index, tol, valid).tolist()
    informative = [rows for rows in _rows_by_group(group_index) if not zero_variance[rows[0]]]
    kept = informative[:target_num_groups]
    return _result(kept, target_num_groups - len(kept), group_index.device)


def replace_groups(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    min_replace_ratio: float = 0.3,
    tol: float = 1e-6,
    generator: torch.Generator | None = None,
    valid: torch.Tensor | None = None,
) -> DynamicSamplingResult:
    """Dynamic sampling, ``replace`` strategy: swap each zero-variance group for a random informative one.

    Replacement needs at least ``ceil(min_replace_ratio · G)`` informative groups out of ``G``; the result then has
    ``G`` groups again (the same number of rows when groups are equal-sized) and ``num_groups_needed == 0``. With
    fewer, only the informative groups are returned and ``num_groups_needed`` says how many more informative groups
    the caller must sample before calling again. Variance is over the ``valid`` rows (see
    :func:`zero_variance_rows`).
    """
    zero_variance = zero_variance_rows(scores, group_index, tol, valid).tolist()
    groups = _rows_by_group(group_index)
    informative = [rows for rows in groups if not zero_variance[rows[0]]]
    required = max(math.ceil(min_replace_ratio * len(groups)), 1)
    if len(informative) < required:
        return _result(informative, required - len(informative), group_index.device)
    picks = torch.randint(len(informative), (len(groups),), generator=generator).tolist()
    replaced = [informative[pick] if zero_variance[rows[0]] else rows for rows, pick in zip(groups, picks, strict=True)]
    return _result(replaced, 0, group_index.device)


def apply_overlong_filtering(loss_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """``loss_mask`` ``[B, T]`` with truncated responses (``truncated`` ``[B]`` bool) masked out entirely."""
    return loss_mask * (~truncated.bool()).unsqueeze(-1).to(loss_mask.device, loss_mask.dtype)


def truncated_rows(stop_reasons: Sequence[str | None]) -> torch.Tensor:
    """``[B]`` bool: True where generation stopped for length (stop reason ``"length"``)."""
    return torch.tensor([reason == "length" for reason in stop_reasons], dtype=torch.bool)


def zero_reward_on_non_stop(token_level_rewards: torch.Tensor, stop_reasons: Sequence[str | None]) -> torch.Tensor:
    """``token_level_rewards`` ``[B, T]`` with every row whose stop reason is not ``"stop"`` set to 0.

    Unlike overlong filtering the response stays in the loss, now with no reward: the policy learns that
    running out of budget earns nothing.
    """
    stopped = torch.tensor([reason == "stop" for reason in stop_reasons], device=token_level_rewards.device)
    return token_level_rewards * stopped.unsqueeze(-1).to(token_level_rewards.dtype)


def _rows_by_group(group_index: torch.Tensor) -> list[list[int]]:
    """Row numbers of each group, groups in order of first appearance."""
    rows: dict[int, list[int]] = {}
    for row, group in enumerate(group_index.tolist()):
        rows.setdefault(group, []).append(row)
    return list(rows.values())


def _result(groups: list[list[int]], num_groups_needed: int, device: torch.device) -> DynamicSamplingResult:
    row_index = [row for rows in groups for row in rows]
    new_group_index = [i for i, rows in enumerate(groups) for _ in rows]
    return DynamicSamplingResult(
        row_index=torch.tensor(row_index, dtype=torch.long, device=device),
        group_index=torch.tensor(new_group_index, dtype=torch.long, device=device),
        num_groups_needed=num_groups_needed,
    )
