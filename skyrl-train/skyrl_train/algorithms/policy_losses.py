"""Policy losses: per-token surrogate objectives of the PPO family, each reduced by ``reduce_loss``.

Every loss has the same signature (``PolicyLoss``) and is registered by name; add your own with
``@register_policy_loss("name")``. Shapes and dtypes shared by all losses:

- ``log_probs``: ``[B, T]`` float logprobs of the sampled tokens under the policy being trained (carries the graph).
- ``old_log_probs``: ``[B, T]`` float logprobs under the policy that generated the batch, computed by the trainer.
- ``advantages``: ``[B, T]`` float (from ``algorithms.advantages``).
- ``loss_mask``: ``[B, T]`` 0/1; tokens at 0 never change the loss or its gradient.
- ``rollout_log_probs``: ``[B, T]`` float logprobs reported by the inference engine, for off-policy correction.
- ``token_weights``: ``[B, T]`` float weights from ``loss_weights``; when given they replace
  ``config.loss_reduction`` (use them to normalise over a whole mini-batch or for ``prompt_mean``).
- Returns ``(loss, metrics)``: a 0-dim tensor to minimise and ``LossMetrics`` (``clip_frac``, ``approx_kl``, ratio
  statistics, ``off_policy/*``), each a detached 0-dim tensor: nothing is read back to the host.

Notation follows the papers: ``r_t = π_θ(y_t) / π_old(y_t)`` is the importance ratio and ``Â_t`` the advantage.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from skyrl_train.algorithms.off_policy import OffPolicyCorrectionConfig, apply_off_policy_correction
from skyrl_train.algorithms.reductions import LossMetrics, LossReduction, masked_mean, reduce_loss
from skyrl_train.algorithms.registry import Registry


@dataclass(frozen=True)
class CISPOConfig:
    """CISPO's bounds on its detached importance weight."""

    cispo_eps_clip_low: float = 1.0  # weight ≥ 1 − ε_low; 1.0 leaves it unbounded below
    cispo_eps_clip_high: float = 4.0  # weight ≤ 1 + ε_high
    cispo_anchor: Literal["old", "rollout"] = "old"  # ratio against the trainer's old logprobs or the engine's


@dataclass(frozen=True)
class SAPOConfig:
    """SAPO's gate temperatures: larger τ closes the gate faster as the ratio leaves 1."""

    tau_pos: float = 1.0  # for tokens with positive advantage
    tau_neg: float = 1.05  # for tokens with negative advantage (the paper keeps τ_neg > τ_pos)


@dataclass(frozen=True)
class ClipCovConfig:
    """Clip-Cov: how many high-covariance tokens lose their gradient."""

    clip_ratio: float = 2e-4  # fraction of valid tokens detached
    clip_cov_lb: float = 1.0  # only tokens whose covariance lies in [lb, ub] are candidates
    clip_cov_ub: float = 5.0


@dataclass(frozen=True)
class KLCovConfig:
    """KL-Cov: how many top-covariance tokens get a KL penalty, and how strong."""

    kl_cov_frac: float = 0.2  # PERCENT of valid tokens penalised (0.2 → 0.2 %, the paper's k = 2e-3)
    ppo_kl_coef: float = 1.0  # β on |log r_t| for the selected tokens


@dataclass(frozen=True)
class PolicyLossConfig:
    """Hyperparameters of the built-in policy losses (each loss reads only its own)."""

    eps_clip_low: float = 0.2  # PPO clip range below 1: r_t ≥ 1 − ε_low
    eps_clip_high: float = 0.2  # PPO clip range above 1; DAPO's clip-higher raises it (e.g. 0.28)
    clip_ratio_c: float = 3.0  # dual-clip bound: a negative-advantage token's loss is at most c·|Â|
    loss_reduction: LossReduction = "token_mean"  # how per-token losses become a scalar (see reductions.py)
    max_seq_len: int | None = None  # normaliser of the seq_mean_token_sum_norm reduction
    cispo: CISPOConfig = field(default_factory=CISPOConfig)
    sapo: SAPOConfig = field(default_factory=SAPOConfig)
    clip_cov: ClipCovConfig = field(default_factory=ClipCovConfig)
    kl_cov: KLCovConfig = field(default_factory=KLCovConfig)
    off_policy_correction: OffPolicyCorrectionConfig = field(default_factory=OffPolicyCorrectionConfig)


class PolicyLoss(Protocol):
    """The signature every policy loss has; see the module docstring for shapes."""

    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        config: PolicyLossConfig,
        rollout_log_probs: torch.Tensor | None = None,
        *,
        token_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LossMetrics]:
        """Return ``(loss, metrics)`` for one batch of tokens."""
        ...


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered as ``name`` (raises ``UnknownNameError`` listing the known names)."""
    return POLICY_LOSSES.get(name)


def list_policy_losses() -> list[str]:
    """Names of all registered policy losses, sorted."""
    return POLICY_LOSSES.names()


@register_policy_loss("regular")
def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """PPO clipped surrogate (Schulman et al., arXiv 1707.06347, eq. 7) with DAPO's decoupled clip range.

    ``L_t = −min(r_t Â_t, clip(r_t, 1 − ε_low, 1 + ε_high) Â_t)``. Separate ``eps_clip_low`` / ``eps_clip_high``
    are DAPO's clip-higher (Yu et al., arXiv 2503.14476): a larger ε_high lets unlikely tokens with positive
    advantage grow, which keeps entropy from collapsing.

    Shapes: ``[B, T]`` float logprobs and advantages, ``[B, T]`` 0/1 mask → 0-dim loss, 0-dim tensor metrics.
    """
    log_ratio = _log_ratio(log_probs, old_log_probs, loss_mask)
    token_loss, clipped = clipped_surrogate(log_ratio.exp(), advantages, config.eps_clip_low, config.eps_clip_high)
    metrics = {**_ratio_metrics(log_ratio, loss_mask), "clip_frac": _frac(clipped, loss_mask)}
    return _correct_and_reduce(token_loss, old_log_probs, loss_mask, config, rollout_log_probs, token_weights, metrics)


@register_policy_loss("dual_clip")
def dual_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Dual-clip PPO (Ye et al., arXiv 1912.09729): PPO clip plus a bound for negative advantages.

    For ``Â_t < 0`` the PPO loss ``r_t |Â_t|`` grows without bound as ``r_t`` does; dual clip caps it:
    ``L_t = min(L_t^PPO, c·|Â_t|)`` with ``c = clip_ratio_c > 1``, so tokens with ``r_t > c`` get no gradient.

    Shapes: ``[B, T]`` float logprobs and advantages, ``[B, T]`` 0/1 mask → 0-dim loss, 0-dim tensor metrics.
    """
    if config.clip_ratio_c <= 1.0:
        raise ValueError(f"dual clip needs clip_ratio_c > 1, got {config.clip_ratio_c}")
    log_ratio = _log_ratio(log_probs, old_log_probs, loss_mask)
    ppo_loss, clipped = clipped_surrogate(log_ratio.exp(), advantages, config.eps_clip_low, config.eps_clip_high)
    bound = -config.clip_ratio_c * advantages
    dual_clipped = (advantages < 0) & (bound < ppo_loss)
    token_loss = torch.where(dual_clipped, bound, ppo_loss)
    metrics = {
        **_ratio_metrics(log_ratio, loss_mask),
        "clip_frac": _frac(clipped, loss_mask),
        "dual_clip_frac": _frac(dual_clipped, loss_mask),
    }
    return _correct_and_reduce(token_loss, old_log_probs, loss_mask, config, rollout_log_probs, token_weights, metrics)


@register_policy_loss("gspo")
def gspo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Group Sequence Policy Optimization, GSPO-token form (Zheng et al., arXiv 2507.18071).

    The ratio is the sequence's length-normalised likelihood ratio ``s_i = exp(mean_t log r_t)``, applied per token as
    ``s_{i,t} = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]``: its value is ``s_i`` on every token, its gradient that of each
    token. The clipped surrogate then uses ``eps_clip_low/high`` (the paper's ranges are ~3e-4 / 4e-4, far tighter
    than token-level PPO). The paper averages per sequence: pair it with ``loss_reduction="sequence_mean"``.

    Shapes: ``[B, T]`` float logprobs and advantages, ``[B, T]`` 0/1 mask → 0-dim loss, 0-dim tensor metrics.
    """
    if config.loss_reduction != "sequence_mean":
        warnings.warn(
            f"GSPO is defined with a per-sequence mean; loss_reduction={config.loss_reduction!r} weights sequences "
            "by length instead. Set loss_reduction='sequence_mean'",
            stacklevel=2,
        )
    log_ratio = _log_ratio(log_probs, old_log_probs, loss_mask)
    sequence_log_ratio = masked_mean(log_ratio, loss_mask, dim=-1).unsqueeze(-1)
    token_log_ratio = sequence_log_ratio.detach() + log_probs - log_probs.detach()
    token_loss, clipped = clipped_surrogate(
        token_log_ratio.exp(), advantages, config.eps_clip_low, config.eps_clip_high
    )
    metrics = {**_ratio_metrics(log_ratio, loss_mask), "clip_frac": _frac(clipped, loss_mask)}
    sequence_ratio = sequence_log_ratio.detach().exp().squeeze(-1)
    metrics["sequence_ratio_mean"] = masked_mean(sequence_ratio, loss_mask.bool().any(-1))
    return _correct_and_reduce(token_loss, old_log_probs, loss_mask, config, rollout_log_probs, token_weights, metrics)


@register_policy_loss("cispo")
def cispo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585).

    ``L_t = −sg[clip(r_t, 1 − ε_low, 1 + ε_high)] · Â_t · log π_θ(y_t)``: the importance weight is clipped and
    detached instead of the update, so every token keeps a REINFORCE gradient. With ``cispo_anchor="rollout"`` the
    ratio is taken against ``rollout_log_probs``, which already corrects for the engine mismatch, so the configured
    TIS weight is not applied on top; the configured sequence and outlier masks still are.

    Shapes: ``[B, T]`` float logprobs and advantages, ``[B, T]`` 0/1 mask → 0-dim loss, 0-dim tensor metrics.
    """
    cispo = config.cispo
    anchor = old_log_probs
    if cispo.cispo_anchor == "rollout":
        if rollout_log_probs is None:
            raise ValueError("cispo_anchor='rollout' needs rollout_log_probs")
        anchor = rollout_log_probs
    log_ratio = _log_ratio(log_probs, anchor, loss_mask)
    ratio = log_ratio.exp().detach()
    low, high = 1.0 - cispo.cispo_eps_clip_low, 1.0 + cispo.cispo_eps_clip_high
    token_loss = -ratio.clamp(low, high) * advantages * log_probs
    metrics = {**_ratio_metrics(log_ratio, loss_mask), "clip_frac": _frac((ratio < low) | (ratio > high), loss_mask)}
    return _correct_and_reduce(
        token_loss,
        old_log_probs,
        loss_mask,
        config,
        rollout_log_probs,
        token_weights,
        metrics,
        tis=cispo.cispo_anchor == "old",
    )


@register_policy_loss("sapo")
def sapo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Soft Adaptive Policy Optimization (Gao et al., arXiv 2511.20347).

    Hard clipping is replaced by a sigmoid gate ``f(r_t) = σ(τ (r_t − 1)) · 4/τ`` with ``τ = τ_pos`` when
    ``Â_t > 0`` else ``τ_neg``; ``L_t = −f(r_t) Â_t``. At ``r_t = 1`` the gradient equals the policy gradient
    (``f'(1) = 1``) and it fades smoothly as the ratio drifts, faster for negative advantages.

    Shapes: ``[B, T]`` float logprobs and advantages, ``[B, T]`` 0/1 mask → 0-dim loss, 0-dim tensor metrics.
    """
    log_ratio = _log_ratio(log_probs, old_log_probs, loss_mask)
    tau = torch.where(advantages > 0, config.sapo.tau_pos, config.sapo.tau_neg).to(advantages.dtype)
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1.0)) * (4.0 / tau)
    token_loss = -gate * advantages
    metrics = {**_ratio_metrics(log_ratio, loss_mask), "gate_mean": masked_mean(gate.detach(), loss_mask)}
    return _correct_and_reduce(token_loss, old_log_probs, loss_mask, config, rollout_log_probs, token_weights, metrics)


@register_policy_loss("clip_cov")
def clip_cov_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Clip-Cov (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    Entropy falls fastest through tokens whose log-probability and advantage covary strongly:
    ``Cov_t = (log π_θ(y_t) − mean) · (Â_t − mean)`` over the batch's valid tokens. Among tokens that PPO has not
    already clipped and whose ``Cov_t`` lies in ``[clip_cov_lb, clip_cov_ub]``, ``clip_ratio`` of all valid tokens
    (at least one) are drawn at random, with torch's global generator, and removed from the loss. The rest is the PPO
    clipped surrogate.

    Shapes: ``[B, T]`` float logprobs and advantages, ``[B, T]`` 0/1 mask → 0-dim loss, 0-dim tensor metrics.
    """
    log_ratio = _log_ratio(log_probs, old_log_probs, loss_mask)
    token_loss, clipped = clipped_surrogate(log_ratio.exp(), advantages, config.eps_clip_low, config.eps_clip_high)
    cov = token_covariance(log_probs, advantages, loss_mask)
    settings = config.clip_cov
    candidates = loss_mask.bool() & ~clipped & (cov >= settings.clip_cov_lb) & (cov <= settings.clip_cov_ub)
    # The number of tokens to detach sizes the random draw, so it is read on the host: one wait per call.
    num_detached = max(int(settings.clip_ratio * int(loss_mask.bool().sum())), 1)
    detached = _random_subset(candidates, num_detached)
    token_loss = torch.where(detached, torch.zeros_like(token_loss), token_loss)
    metrics = {
        **_ratio_metrics(log_ratio, loss_mask),
        "clip_frac": _frac(clipped, loss_mask),
        "clip_cov_frac": _frac(detached, loss_mask),
    }
    return _correct_and_reduce(token_loss, old_log_probs, loss_mask, config, rollout_log_probs, token_weights, metrics)


@register_policy_loss("kl_cov")
def kl_cov_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """KL-Cov (Cui et al., arXiv 2505.22617): unclipped policy gradient plus a KL penalty on top-covariance tokens.

    ``L_t = −r_t Â_t`` for every token; the ``kl_cov_frac`` percent of valid tokens with the largest
    ``Cov_t`` (see ``clip_cov_loss``) add ``β·|log r_t|`` with ``β = ppo_kl_coef``.

    Shapes: ``[B, T]`` float logprobs and advantages, ``[B, T]`` 0/1 mask → 0-dim loss, 0-dim tensor metrics.
    """
    log_ratio = _log_ratio(log_probs, old_log_probs, loss_mask)
    token_loss = -log_ratio.exp() * advantages
    valid = loss_mask.bool()
    num_valid = int(valid.sum())  # sizes topk, so it is read on the host: one wait per call
    k = min(max(int(num_valid * config.kl_cov.kl_cov_frac / 100), 1), num_valid)
    cov = token_covariance(log_probs, advantages, loss_mask).masked_fill(~valid, -torch.inf)
    penalised = torch.zeros_like(valid).flatten()
    penalised[cov.flatten().topk(k).indices] = True
    penalised = penalised.view_as(valid) & valid
    token_loss = token_loss + torch.where(penalised, config.kl_cov.ppo_kl_coef * log_ratio.abs(), 0.0)
    metrics = {**_ratio_metrics(log_ratio, loss_mask), "kl_cov_frac": _frac(penalised, loss_mask)}
    return _correct_and_reduce(token_loss, old_log_probs, loss_mask, config, rollout_log_probs, token_weights, metrics)


@register_policy_loss("cross_entropy")
def cross_entropy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Supervised fine-tuning: the negative log-likelihood ``L_t = −log π_θ(y_t)`` of the masked tokens.

    ``old_log_probs``, ``advantages`` and ``rollout_log_probs`` are ignored, so the SFT path runs through the same
    backend call as RL.

    Shapes: ``[B, T]`` float logprobs and advantages, ``[B, T]`` 0/1 mask → 0-dim loss, 0-dim tensor metrics.
    """
    token_loss = -log_probs
    loss = reduce_loss(
        token_loss, loss_mask, config.loss_reduction, token_weights=token_weights, max_seq_len=config.max_seq_len
    )
    return loss, {"nll": masked_mean(token_loss.detach(), loss_mask)}


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token loss ``−min(r Â, clip(r, 1 − ε_low, 1 + ε_high) Â)`` and where the clipped term won.

    Args:
        ratio: ``[B, T]`` float importance ratio (carries the graph).
        advantages: ``[B, T]`` float.
        eps_low: clip range below 1.
        eps_high: clip range above 1.

    Returns:
        ``(token_loss, clipped)``: ``[B, T]`` float and ``[B, T]`` bool (True where the gradient is zero).
    """
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def token_covariance(log_probs: torch.Tensor, advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-token centred product ``(log π_t − mean) · (Â_t − mean)``, means over valid tokens; ``[B, T]``, detached."""
    log_probs, advantages = log_probs.detach(), advantages.detach()
    centred_log_probs = log_probs - masked_mean(log_probs, loss_mask)
    return centred_log_probs * (advantages - masked_mean(advantages, loss_mask))


LOG_RATIO_BOUND = 20.0  # |log r_t| at most this before exp, as the reference implementation clamps


def _log_ratio(log_probs: torch.Tensor, anchor_log_probs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``log r_t = log π_θ − log π_anchor``, clamped to ±``LOG_RATIO_BOUND``; 0 on masked tokens.

    Unclamped, a large policy/anchor mismatch (a stale or broken rollout log-prob) makes ``exp`` overflow to inf, the
    loss and gradient become inf/NaN and the optimizer step is skipped. Clamped, ``exp`` stays below 5e8: the clip
    terms bound the loss and the step goes ahead.
    """
    delta = (log_probs - anchor_log_probs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.where(loss_mask.bool(), delta, torch.zeros_like(log_probs))


def _ratio_metrics(log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> LossMetrics:
    """``approx_kl`` (Schulman's k3 estimate of KL(π_old ‖ π_θ)) and statistics of ``r_t`` over valid tokens.

    The extremes are 1 (no drift) when no token is valid.
    """
    log_ratio = log_ratio.detach()
    ratio = log_ratio.exp()
    valid = loss_mask.bool()
    return {
        "approx_kl": masked_mean(ratio - 1.0 - log_ratio, loss_mask),
        "ratio_mean": masked_mean(ratio, loss_mask),
        "ratio_min": _masked_extreme(ratio, valid, largest=False),
        "ratio_max": _masked_extreme(ratio, valid, largest=True),
    }


def _masked_extreme(values: torch.Tensor, valid: torch.Tensor, *, largest: bool) -> torch.Tensor:
    """The largest (or smallest) of ``values`` where ``valid``, 1 where nothing is; a 0-dim tensor.

    Taken under a mask, not over ``values[valid]``: selecting would read the number of valid tokens on the host.
    """
    if values.numel() == 0:  # a shape, known on the host
        return values.new_ones(())
    fill = -torch.inf if largest else torch.inf
    masked = values.masked_fill(~valid, fill)
    return (masked.amax() if largest else masked.amin()).masked_fill(~valid.any(), 1.0)


def _frac(flags: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(flags.float(), loss_mask)


def _random_subset(candidates: torch.Tensor, k: int) -> torch.Tensor:
    """A bool tensor shaped like ``candidates`` with ``min(k, #candidates)`` of its True entries, drawn uniformly."""
    index = candidates.flatten().nonzero().squeeze(-1)
    chosen = index[torch.randperm(index.numel(), device=index.device)[:k]]
    subset = torch.zeros_like(candidates).flatten()
    subset[chosen] = True
    return subset.view_as(candidates)


def _correct_and_reduce(
    token_loss: torch.Tensor,
    old_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_log_probs: torch.Tensor | None,
    token_weights: torch.Tensor | None,
    metrics: LossMetrics,
    tis: bool = True,
) -> tuple[torch.Tensor, LossMetrics]:
    """The shared tail of the RL losses: off-policy correction (its TIS weight only if ``tis``), the reduction."""
    token_loss, correction_metrics = apply_off_policy_correction(
        token_loss, old_log_probs, rollout_log_probs, loss_mask, config.off_policy_correction, tis=tis
    )
    loss = reduce_loss(
        token_loss, loss_mask, config.loss_reduction, token_weights=token_weights, max_seq_len=config.max_seq_len
    )
    return loss, {**metrics, **correction_metrics}
