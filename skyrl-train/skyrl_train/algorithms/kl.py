"""KL divergence to a reference policy: per-token estimators, the KL loss term, and KL in the reward.

Estimators follow Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html). With tokens
sampled from the policy ``π`` and ``log ρ = log π_ref − log π``, each estimates ``KL(π ‖ π_ref)`` per token:

- ``k1 = −log ρ``: unbiased, high variance, can be negative.
- ``k2 = ½ (log ρ)²``: biased, low variance, always ≥ 0.
- ``k3 = (ρ − 1) − log ρ``: unbiased and always ≥ 0 (the default).
- ``abs = |log ρ|``.

Shapes: logprobs ``[B, T]`` float, ``loss_mask`` ``[B, T]`` 0/1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from skyrl_train.algorithms.reductions import LossMetrics, LossReduction, masked_mean, reduce_loss

KLEstimatorName = Literal["k1", "k2", "k3", "abs"]


def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``log π − log π_ref`` per token; ``[B, T]``."""
    return log_probs - ref_log_probs


def kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``½ (log π − log π_ref)²`` per token; ``[B, T]``."""
    return 0.5 * (log_probs - ref_log_probs) ** 2


def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``exp(log ρ) − 1 − log ρ`` with ``log ρ = log π_ref − log π``, per token; ``[B, T]``.

    ``log ρ`` is clamped to ``[−20, 20]`` before ``exp`` and the estimate to ``[−10, 10]``: one token the reference
    finds near-impossible must not dominate the loss (or overflow).
    """
    log_rho = (ref_log_probs - log_probs).clamp(-20.0, 20.0)
    return (log_rho.exp() - 1.0 - log_rho).clamp(-10.0, 10.0)


def kl_abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``|log π − log π_ref|`` per token; ``[B, T]``."""
    return (log_probs - ref_log_probs).abs()


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
    "abs": kl_abs,
}


def approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimatorName = "k3") -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` by the named estimator (unmasked; see the module docstring)."""
    try:
        function = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown kl_estimator_type {estimator!r}; available: {', '.join(KL_ESTIMATORS)}") from None
    return function(log_probs, ref_log_probs)


def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    estimator: KLEstimatorName = "k3",
    reduction: LossReduction = "sequence_mean",
    *,
    token_weights: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """The KL-to-reference loss term (GRPO's ``β·KL``, DeepSeekMath arXiv 2402.03300); multiply by ``kl_loss_coef``.

    Gradients flow through ``log_probs``. By default the per-token KL is averaged within each sequence and then over
    sequences; ``token_weights`` (from ``loss_weights``) override ``reduction``.

    Returns:
        ``(loss, {"kl": mean per-token KL over valid tokens})``, both 0-dim tensors (the metric detached).
    """
    kl = approx_kl(log_probs, ref_log_probs, estimator)
    loss = reduce_loss(kl, loss_mask, reduction, token_weights=token_weights, max_seq_len=max_seq_len)
    return loss, {"kl": masked_mean(kl.detach(), loss_mask)}


def apply_kl_penalty(
    token_level_rewards: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    kl_coef: float,
    estimator: KLEstimatorName = "k3",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward (Ziegler et al., arXiv 1909.08593): ``r_t ← r_t − β·KL_t`` on every valid token.

    Args:
        token_level_rewards: ``[B, T]`` float.
        log_probs: ``[B, T]`` float logprobs of the policy that sampled the batch (no gradient needed).
        ref_log_probs: ``[B, T]`` float reference logprobs.
        loss_mask: ``[B, T]`` 0/1.
        kl_coef: ``β``, e.g. the current ``KLController.value``.
        estimator: per-token KL estimator.

    Returns:
        ``(rewards, {"kl": mean over sequences of each sequence's summed KL})``; rewards are ``[B, T]`` float.
        Feed the ``kl`` metric to ``KLController.update``; it is a float, read on the host once per batch, since
        the controller's next coefficient depends on it.
    """
    kl = approx_kl(log_probs.detach(), ref_log_probs.detach(), estimator) * loss_mask
    sequence_kl = kl.sum(-1).mean()
    return token_level_rewards - kl_coef * kl, {"kl": sequence_kl.item(), "kl_coef": kl_coef}


class KLController(Protocol):
    """Holds the KL coefficient ``value`` and adapts it once per training step."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after ``n_steps`` samples whose mean KL was ``current_kl``."""
        ...


@dataclass
class FixedKLController:
    """A constant KL coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Leave the coefficient unchanged."""


@dataclass
class AdaptiveKLController:
    """Proportional controller that steers the observed KL towards ``kl_target``.

    PPO's adaptive KL penalty (Schulman et al., arXiv 1707.06347, §4) in the smooth form of Ziegler et al.
    (arXiv 1909.08593): ``e = clip(KL / target − 1, −0.2, 0.2)``, ``β ← β · (1 + e · n_steps / horizon)``.
    """

    value: float  # the current β; starts at the configured KL coefficient
    kl_target: float = 0.1  # the KL per sequence the controller aims for
    horizon: int = 10000  # samples over which an error of 20 % changes β by 20 %

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` towards the coefficient that keeps the KL at ``kl_target``."""
        error = min(max(current_kl / self.kl_target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(
    kind: Literal["fixed", "adaptive"], kl_coef: float, kl_target: float = 0.1, horizon: int = 10000
) -> KLController:
    """A ``fixed`` or ``adaptive`` controller starting at ``kl_coef``."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, kl_target, horizon)
    raise ValueError(f"unknown kl_ctrl type {kind!r}; available: fixed, adaptive")
