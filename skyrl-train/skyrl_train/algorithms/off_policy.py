"""Off-policy correction between the inference engine that sampled a rollout and the trainer.

The engine's logprobs (``rollout_log_probs``, from vLLM or another sampler) differ from the trainer's logprobs of the
same tokens under the same weights (``old_log_probs``): different kernels, precision, expert routing. Yao et al.,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (2025), correct for this with a truncated
importance-sampling (TIS) weight ``min(π_old / π_rollout, C)`` on each token's loss. Sequence-level masking drops
whole responses whose ratio drifts too far.

All functions take ``[B, T]`` float logprobs and a ``[B, T]`` 0/1 ``loss_mask``; masked positions are ignored.
The correction multiplies the per-token loss; it never changes the reduction's normaliser, so a masked sequence
contributes zero but still counts in ``token_mean``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from skyrl_train.algorithms.reductions import LossMetrics, masked_mean

TISRatioType = Literal["token", "sequence"]
SequenceMaskMetric = Literal["geometric", "product"]


@dataclass(frozen=True)
class OffPolicyCorrectionConfig:
    """Which corrections to apply against the rollout logprobs; all off by default."""

    tis_ratio_type: TISRatioType | None = None  # weight the loss by a truncated IS ratio, per token or per sequence
    token_tis_ratio_clip_high: float = 2.0  # C for token-level TIS
    sequence_tis_ratio_clip_high: float = 5.0  # C for sequence-level TIS (ratio of the whole response)
    sequence_mask_metric: SequenceMaskMetric | None = None  # mask responses whose IS ratio leaves the band below
    geo_mask_low: float = 0.99  # band for the geometric-mean token ratio (per-token drift)
    geo_mask_high: float = 1.01
    product_mask_low: float = 0.5  # band for the product of token ratios (whole-sequence ratio)
    product_mask_high: float = 2.0
    outlier_token_is_threshold_low: float | None = None  # mask a response if any token ratio falls below this
    outlier_token_is_threshold_high: float | None = None  # ... or rises above this
    # Tokens sampled by a policy more than this many versions older than the one trained leave the policy loss
    # (their weight becomes 0; the normaliser is unchanged). Needs per-token versions (trainer.async_mode=fully_async).
    max_token_staleness: int | None = None

    @property
    def enabled(self) -> bool:
        """Whether any correction is configured (and so rollout logprobs are needed)."""
        outliers = (self.outlier_token_is_threshold_low, self.outlier_token_is_threshold_high)
        return self.tis_ratio_type is not None or self.sequence_mask_metric is not None or outliers != (None, None)


def truncated_is_weights(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, ratio_type: TISRatioType, clip_high: float
) -> torch.Tensor:
    """TIS weights ``min(ρ, C)``: per token ``ρ_t = π_old/π_rollout``, or per sequence ``ρ = Π_t ρ_t``.

    Args:
        log_ratio: ``[B, T]`` float ``old_log_probs − rollout_log_probs``.
        loss_mask: ``[B, T]`` 0/1.
        ratio_type: ``"token"`` or ``"sequence"``.
        clip_high: the truncation ``C``.

    Returns:
        ``[B, T]`` float, detached; a sequence weight is repeated on each of its tokens.
    """
    log_ratio = (log_ratio * loss_mask).detach()
    if ratio_type == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    elif ratio_type != "token":
        raise ValueError(f"unknown tis_ratio_type {ratio_type!r}; available: token, sequence")
    # truncate in log space: exp of a long sequence's summed log ratio would overflow
    return log_ratio.clamp(max=math.log(clip_high)).exp()


def sequence_mask(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, metric: SequenceMaskMetric, low: float, high: float
) -> torch.Tensor:
    """``[B]`` bool: True for sequences whose IS ratio lies in ``[low, high]``.

    ``geometric`` uses ``exp(mean_t log ρ_t)`` (length-independent drift per token); ``product`` uses
    ``exp(Σ_t log ρ_t)``, the importance ratio of the whole response.
    """
    log_ratio = (log_ratio * loss_mask).detach()
    if metric == "geometric":
        seq_log_ratio = masked_mean(log_ratio, loss_mask, dim=-1)
    elif metric == "product":
        seq_log_ratio = log_ratio.sum(-1)
    else:
        raise ValueError(f"unknown sequence_mask_metric {metric!r}; available: geometric, product")
    return (seq_log_ratio >= math.log(low)) & (seq_log_ratio <= math.log(high))


def outlier_token_mask(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, low: float | None, high: float | None
) -> torch.Tensor:
    """``[B]`` bool: True for sequences with no valid token whose ratio ``ρ_t`` is below ``low`` or above ``high``."""
    log_ratio = log_ratio.detach()
    outlier = torch.zeros_like(log_ratio, dtype=torch.bool)
    if low is not None:
        outlier |= log_ratio < math.log(low)
    if high is not None:
        outlier |= log_ratio > math.log(high)
    return ~(outlier & loss_mask.bool()).any(-1)


def apply_off_policy_correction(
    token_loss: torch.Tensor,
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor | None,
    loss_mask: torch.Tensor,
    config: OffPolicyCorrectionConfig,
    *,
    tis: bool = True,
) -> tuple[torch.Tensor, LossMetrics]:
    """Weight and mask a per-token loss ``[B, T]`` as ``config`` says; returns it with ``off_policy/*`` metrics.

    The metrics are detached 0-dim tensors (see ``LossMetrics``).

    ``tis=False`` applies the sequence and outlier masks only, not the TIS weight: for a loss whose ratio is
    already taken against the rollout log-probs (CISPO's ``rollout`` anchor), which is the IS correction itself.

    Raises:
        ValueError: a correction is configured but ``rollout_log_probs`` is None.
    """
    if not config.enabled:
        return token_loss, {}
    if rollout_log_probs is None:
        raise ValueError("off-policy correction is configured but no rollout_log_probs were given")
    log_ratio = old_log_probs - rollout_log_probs
    metrics: LossMetrics = {"off_policy/is_ratio_mean": masked_mean(log_ratio.detach().exp(), loss_mask)}
    if tis and config.tis_ratio_type is not None:
        token = config.tis_ratio_type == "token"
        clip_high = config.token_tis_ratio_clip_high if token else config.sequence_tis_ratio_clip_high
        weights = truncated_is_weights(log_ratio, loss_mask, config.tis_ratio_type, clip_high)
        token_loss = token_loss * weights
        metrics["off_policy/tis_weight_mean"] = masked_mean(weights, loss_mask)
        untruncated = truncated_is_weights(log_ratio, loss_mask, config.tis_ratio_type, math.inf)
        metrics["off_policy/tis_clip_frac"] = masked_mean((untruncated > clip_high).float(), loss_mask)
    keep = _kept_sequences(log_ratio, loss_mask, config)
    if keep is not None:
        has_tokens = loss_mask.bool().any(-1)
        token_loss = torch.where(keep.unsqueeze(-1), token_loss, torch.zeros_like(token_loss))
        metrics["off_policy/seq_masked_frac"] = masked_mean((~keep).float(), has_tokens.float())
    return token_loss, metrics


def _kept_sequences(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, config: OffPolicyCorrectionConfig
) -> torch.Tensor | None:
    """``[B]`` bool of sequences that pass every configured mask, or None when no mask is configured."""
    keep: torch.Tensor | None = None
    if config.sequence_mask_metric is not None:
        geometric = config.sequence_mask_metric == "geometric"
        low = config.geo_mask_low if geometric else config.product_mask_low
        high = config.geo_mask_high if geometric else config.product_mask_high
        keep = sequence_mask(log_ratio, loss_mask, config.sequence_mask_metric, low, high)
    outlier_low, outlier_high = config.outlier_token_is_threshold_low, config.outlier_token_is_threshold_high
    if outlier_low is not None or outlier_high is not None:
        no_outlier = outlier_token_mask(log_ratio, loss_mask, outlier_low, outlier_high)
        keep = no_outlier if keep is None else keep & no_outlier
    return keep
