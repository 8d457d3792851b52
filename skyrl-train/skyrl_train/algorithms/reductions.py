"""Masked statistics and the one place where a per-token loss becomes a scalar.

Every loss in ``algorithms/`` computes a per-token loss ``[B, T]`` and hands it to ``reduce_loss``. A reduction is a
set of per-token weights (``loss_weights``): the scalar loss is ``Σ_{i,t} loss[i, t] · w[i, t]``. Writing reductions
as weights keeps gradient accumulation exact: compute the weights once over a whole mini-batch, slice them with the
micro-batches, and the micro-batch losses add up to the mini-batch loss.

Shapes: ``B`` rows (one response each), ``T`` response tokens. Masks are 0/1 tensors of any real or bool dtype.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

LossReduction = Literal["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean"]
LOSS_REDUCTIONS: tuple[str, ...] = get_args(LossReduction)

LossMetrics = dict[str, torch.Tensor | float]
"""A loss's metrics by name: detached 0-dim tensors on the loss's device, or plain floats.

The losses here return tensors: reading a GPU value into Python waits for every kernel queued before it, so the
backend reads all micro-batches' metrics at once, after the last one (``TrainingBackend.forward_backward``).
"""


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is set; over all elements, or along ``dim``."""
    masked = x * mask
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is set; 0 where the mask selects nothing."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (Bessel-corrected) variance of the elements of ``x`` selected by ``mask``; a 0-dim tensor."""
    count = mask.sum()
    mean = masked_mean(x, mask)
    sum_sq = masked_sum((x - mean) ** 2, mask)
    return sum_sq / (count - 1).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Z-score ``x`` with the mean and unbiased variance of its masked elements.

    Args:
        x: ``[B, T]`` float values (advantages or returns).
        mask: ``[B, T]`` 0/1; only these elements enter the statistics.
        shift_mean: subtract the mean (``False`` only rescales, keeping the mean).
        eps: added to the variance before the square root.

    Returns:
        ``[B, T]`` float; unmasked positions are transformed too and should be masked by the caller.
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    return whitened if shift_mean else whitened + mean


def loss_weights(
    loss_mask: torch.Tensor,
    reduction: LossReduction = "token_mean",
    *,
    group_index: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    trajectory_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token weights ``w`` that turn a per-token loss into ``reduction``: ``loss = Σ loss[i, t] · w[i, t]``.

    - ``token_mean``: every valid token counts the same: ``w = m / Σm``.
    - ``sequence_mean``: mean over tokens of each sequence, then over sequences that have a valid token.
    - ``seq_mean_token_sum_norm`` (Dr.GRPO, arXiv 2503.20783): token sum of each sequence divided by the constant
      ``max_seq_len``, then mean over the trajectories (``trajectory_index``; without it, over all ``B`` rows), so
      no length normalisation biases the gradient, and how a trajectory splits into step-wise rows does not either.
    - ``prompt_mean``: token mean within each prompt group, then mean over groups that have a valid token.

    Args:
        loss_mask: ``[B, T]`` 0/1; 1 marks a token that is trained on.
        reduction: one of ``LOSS_REDUCTIONS``.
        group_index: ``[B]`` integer prompt-group id of each row; required by ``prompt_mean``.
        max_seq_len: the normaliser of ``seq_mean_token_sum_norm`` (the longest response the generator may produce).
        trajectory_index: ``[B]`` id of the trajectory each row belongs to (step-wise rows share one); the
            sequence count of ``seq_mean_token_sum_norm``. None: every row is a trajectory.

    Returns:
        ``[B, T]`` float32 weights, zero on masked tokens.

    Raises:
        ValueError: an unknown reduction, or a reduction missing ``group_index`` / ``max_seq_len``.
    """
    mask = loss_mask.float()
    if reduction == "token_mean":
        return mask / mask.sum().clamp(min=1)
    if reduction == "sequence_mean":
        tokens_per_row = mask.sum(-1, keepdim=True)
        num_rows = (tokens_per_row > 0).sum().clamp(min=1)
        return mask / tokens_per_row.clamp(min=1) / num_rows
    if reduction == "seq_mean_token_sum_norm":
        if max_seq_len is None or max_seq_len <= 0:
            raise ValueError("loss_reduction 'seq_mean_token_sum_norm' needs a positive max_seq_len")
        sequences = mask.shape[0] if trajectory_index is None else int(torch.unique(trajectory_index).numel())
        return mask / (max_seq_len * max(sequences, 1))
    if reduction == "prompt_mean":
        return _prompt_mean_weights(mask, group_index)
    raise ValueError(f"unknown loss_reduction {reduction!r}; available: {', '.join(LOSS_REDUCTIONS)}")


def _prompt_mean_weights(mask: torch.Tensor, group_index: torch.Tensor | None) -> torch.Tensor:
    if group_index is None:
        raise ValueError(
            "loss_reduction 'prompt_mean' needs each row's prompt group: compute "
            "loss_weights(loss_mask, 'prompt_mean', group_index=...) and pass it as token_weights"
        )
    _, group = torch.unique(group_index.to(mask.device), return_inverse=True)
    tokens_per_group = torch.zeros(int(group.max()) + 1, device=mask.device).index_add_(0, group, mask.sum(-1))
    num_groups = (tokens_per_group > 0).sum().clamp(min=1)
    return mask / tokens_per_group[group].clamp(min=1).unsqueeze(-1) / num_groups


def reduce_loss(
    token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    reduction: LossReduction = "token_mean",
    *,
    token_weights: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar; every loss in ``algorithms/`` ends here.

    Args:
        token_loss: ``[B, T]`` float per-token loss.
        loss_mask: ``[B, T]`` 0/1; masked tokens never contribute to the value, even if ``token_loss`` is inf or
            nan there.
        reduction: used to build weights when ``token_weights`` is not given.
        token_weights: ``[B, T]`` precomputed ``loss_weights`` (e.g. over a whole mini-batch, sliced to this
            micro-batch, or for ``prompt_mean``); overrides ``reduction``.
        max_seq_len: forwarded to ``loss_weights`` for ``seq_mean_token_sum_norm``.

    Returns:
        0-dim tensor.
    """
    weights = token_weights
    if weights is None:
        weights = loss_weights(loss_mask, reduction, max_seq_len=max_seq_len)
    # where() rather than a product: 0 · inf is nan, and padding positions may hold anything
    return torch.where(loss_mask.bool(), token_loss * weights, torch.zeros_like(token_loss)).sum()
