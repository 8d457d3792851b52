"""The critic's loss for GAE-based PPO, and how well the critic predicts the returns."""

from __future__ import annotations

import torch

from skyrl_train.algorithms.reductions import LossMetrics, LossReduction, masked_mean, reduce_loss


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    value_clip: float | None = 0.2,
    reduction: LossReduction = "token_mean",
    *,
    token_weights: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Clipped value loss (PPO, arXiv 1707.06347, as in its reference implementation).

    ``V_clip = V_old + clip(V − V_old, −ε_v, ε_v)``; ``L_t = ½ max((V − R)², (V_clip − R)²)``: the critic may not
    move a prediction more than ``ε_v = value_clip`` away from the value it had when the batch was collected, unless
    that reduces the error. ``value_clip=None`` gives the plain ``½ (V − R)²``.

    Args:
        values: ``[B, T]`` float predictions of the critic being trained (carries the graph).
        old_values: ``[B, T]`` float predictions at collection time.
        returns: ``[B, T]`` float targets (GAE returns).
        loss_mask: ``[B, T]`` 0/1.
        value_clip: ``ε_v``, or None for no clipping.
        reduction: per-token → scalar; ``token_weights`` (from ``loss_weights``) override it.
        token_weights: ``[B, T]`` float precomputed reduction weights.
        max_seq_len: for ``seq_mean_token_sum_norm``.

    Returns:
        ``(loss, {"vf_clip_frac", "values_mean"})``, all 0-dim tensors (the metrics detached).
    """
    unclipped = (values - returns) ** 2
    if value_clip is None:
        token_loss, clipped = unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped_error = (clipped_values - returns) ** 2
        token_loss, clipped = torch.maximum(unclipped, clipped_error), clipped_error > unclipped
    loss = 0.5 * reduce_loss(token_loss, loss_mask, reduction, token_weights=token_weights, max_seq_len=max_seq_len)
    metrics: LossMetrics = {
        "vf_clip_frac": masked_mean(clipped.float(), loss_mask),
        "values_mean": masked_mean(values.detach(), loss_mask),
    }
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 − Var[R − V] / Var[R]`` over the valid tokens: how much of the returns' variance the critic explains.

    1 is a perfect critic, 0 one no better than predicting the mean return, below 0 a worse one. When the
    returns do not vary (or no token is valid) the ratio is undefined and 0 is returned, a finite value that
    metric files and comparisons can hold.

    Shapes: ``[B, T]`` float ``values`` and ``returns``, ``[B, T]`` 0/1 ``mask``.
    """
    mask = mask.float()
    count = mask.sum()
    if count < 1:
        return 0.0
    returns = returns.detach().float()
    residual = returns - values.detach().float()
    var_returns = _masked_var(returns, mask, count)
    if var_returns <= 0:
        return 0.0
    return float(1.0 - _masked_var(residual, mask, count) / var_returns)


def _masked_var(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> float:
    """Population variance of ``x`` over the tokens where ``mask`` is 1."""
    mean = (x * mask).sum() / count
    return float((((x - mean) ** 2) * mask).sum() / count)
