"""Prompt groups: the rows sampled from the same prompt, identified by an integer group index per row."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def group_index_from_uids(uids: Sequence[Hashable], device: torch.device | str | None = None) -> torch.Tensor:
    """Integer group index ``[B]`` (int64) from per-row prompt uids; ids follow the order of first appearance."""
    ids: dict[Hashable, int] = {}
    index = [ids.setdefault(uid, len(ids)) for uid in uids]
    return torch.tensor(index, dtype=torch.long, device=device)


def group_stats(
    scores: torch.Tensor, group_index: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, unbiased standard deviation and size of each row's prompt group, broadcast back to the rows.

    Args:
        scores: ``[B]`` float, one scalar per row (e.g. the sequence reward).
        group_index: ``[B]`` integer group id per row; ids need not be contiguous.
        valid: ``[B]`` bool, the rows that count (default all). Rows at False (failed trajectories) take no part
            in any group's statistics; they are given the statistics of the valid rows of their group.

    Returns:
        ``(mean, std, count)``, each ``[B]`` with ``scores``' dtype; ``count`` counts valid rows only. A group with
        one valid row has std 0; one with none has mean 0, std 0 and count 0.
    """
    _, group = torch.unique(group_index.to(scores.device), return_inverse=True)
    num_groups = int(group.max()) + 1 if group.numel() else 0
    weight = torch.ones_like(scores) if valid is None else valid.to(scores.device, scores.dtype)
    zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    count = zeros.index_add(0, group, weight)
    mean = zeros.index_add(0, group, scores * weight) / count.clamp(min=1)
    squared_error = zeros.index_add(0, group, (scores - mean[group]) ** 2 * weight)
    std = (squared_error / (count - 1).clamp(min=1)).sqrt()
    return mean[group], std[group], count[group]
