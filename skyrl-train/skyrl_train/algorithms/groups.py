"""Prompt groups: the rows sampled from the same prompt, identified by an integer group index per row."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def group_index_from_uids(uids: Sequence[Hashable], device: torch.device | str | None = None) -> torch.Tensor:
    """Integer group index ``[B]`` (int64) from per-row prompt uids; ids follow the order of first appearance."""
    ids: dict[Hashable, int] = {}
    index = [ids.setdefault(uid, len(ids)) for uid in uids]
    return torch.tensor(index, dtype=torch.long, device=device)


def group_stats(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, unbiased standard deviation and size of each row's prompt group, broadcast back to the rows.

    Args:
        scores: ``[B]`` float, one scalar per row (e.g. the sequence reward).
        group_index: ``[B]`` integer group id per row; ids need not be contiguous.

    Returns:
        ``(mean, std, count)``, each ``[B]`` with ``scores``' dtype. A group of one has std 0.
    """
    _, group = torch.unique(group_index.to(scores.device), return_inverse=True)
    num_groups = int(group.max()) + 1 if group.numel() else 0
    zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    count = zeros.index_add(0, group, torch.ones_like(scores))
    mean = zeros.index_add(0, group, scores) / count
    squared_error = zeros.index_add(0, group, (scores - mean[group]) ** 2)
    std = (squared_error / (count - 1).clamp(min=1)).sqrt()
    return mean[group], std[group], count[group]
