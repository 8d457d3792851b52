"""The per-micro-batch RL objectives handed to ``TrainingBackend.forward_backward``.

Policy: ``loss = policy_loss + kl_loss_coef · KL(π‖π_ref) − entropy_coef · H`` (:func:`make_loss_fn`). Critic:
the clipped value loss (:func:`make_value_loss_fn`). Every policy term is reduced with the same ``token_weights``
of the policy's ``loss_reduction``, the value loss with ``value_token_weights`` of its own reduction (a per-token
mean unless ``Objective.value_loss_reduction`` says otherwise); both are computed once per mini-batch by
:func:`add_token_weights`, so the micro-batch losses add up to the mini-batch loss whatever the micro-batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skyrl_train.algorithms import entropy_bonus, get_policy_loss, kl_loss, loss_weights, masked_mean, value_loss
from skyrl_train.algorithms.kl import KLEstimatorName
from skyrl_train.algorithms.policy_losses import PolicyLossConfig
from skyrl_train.algorithms.reductions import LossReduction
from skyrl_train.backends.base import LossFn, LossMetrics, ModelOutput, TrainingBatch


@dataclass(frozen=True)
class Objective:
    """Which terms the loss has and their weights."""

    policy_loss_type: str  # name in the policy-loss registry
    policy_loss: PolicyLossConfig
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_estimator_type: KLEstimatorName = "k3"
    entropy_coef: float = 0.0
    value_loss_reduction: LossReduction = "token_mean"  # the critic's reduction; the policy's is its own

    @property
    def needs_entropy(self) -> bool:
        """Whether the backend must compute per-token entropy."""
        return self.entropy_coef != 0.0

    @property
    def needs_rollout_log_probs(self) -> str | None:
        """What needs the engine's log-probs of the sampled tokens (a config name), or None if nothing does."""
        if self.policy_loss.off_policy_correction.enabled:
            return "the off_policy correction"
        if self.policy_loss_type == "cispo" and self.policy_loss.cispo.cispo_anchor == "rollout":
            return "algorithm.cispo_anchor='rollout'"
        return None


def add_token_weights(
    batch: TrainingBatch,
    group_index: torch.Tensor,
    objective: Objective,
    trajectory_index: torch.Tensor | None = None,
) -> None:
    """Store ``tensors["token_weights"]`` (policy) and ``["value_token_weights"]`` over this whole (mini-)batch.

    ``trajectory_index``: ``[B]`` the trajectory of each row (step-wise rows of one trajectory share it).
    """
    config = objective.policy_loss
    for key, reduction in (
        ("token_weights", config.loss_reduction),
        ("value_token_weights", objective.value_loss_reduction),
    ):
        batch.tensors[key] = loss_weights(
            batch.response_mask,
            reduction,
            group_index=group_index,
            max_seq_len=config.max_seq_len,
            trajectory_index=trajectory_index,
        )


def make_loss_fn(objective: Objective) -> LossFn:
    """The closure ``(model_output, micro_batch) -> (loss, metrics)`` for ``objective``.

    The micro-batch must carry ``old_log_probs``, ``advantages`` and ``token_weights`` (and ``ref_log_probs``
    with a KL loss; ``rollout_log_probs`` is used for off-policy correction when present). Its metrics are
    detached 0-dim tensors (``LossMetrics``), so a micro-batch's loss reads nothing back to the host.
    """
    policy_loss = get_policy_loss(objective.policy_loss_type)

    def loss_fn(output: ModelOutput, batch: TrainingBatch) -> tuple[torch.Tensor, LossMetrics]:
        t = batch.tensors
        weights = t["token_weights"]
        policy_weights, stale_metrics = _fresh_token_weights(weights, batch, objective)
        loss, metrics = policy_loss(
            output.log_probs,
            t["old_log_probs"],
            t["advantages"],
            batch.response_mask,
            objective.policy_loss,
            t.get("rollout_log_probs"),
            token_weights=policy_weights,
        )
        metrics = {f"policy/{k}": v for k, v in {**metrics, **stale_metrics}.items()}
        metrics["policy/pg_loss"] = loss.detach()
        if objective.use_kl_loss:
            kl, kl_metrics = kl_loss(
                output.log_probs,
                t["ref_log_probs"],
                batch.response_mask,
                objective.kl_estimator_type,
                token_weights=weights,
            )
            loss = loss + objective.kl_loss_coef * kl
            metrics["policy/kl"] = kl_metrics["kl"]
        if objective.needs_entropy:
            if output.entropy is None:
                raise ValueError("entropy_coef is set but the backend returned no entropy (with_entropy=True)")
            loss = loss + entropy_bonus(
                output.entropy, batch.response_mask, objective.entropy_coef, token_weights=weights
            )
            metrics["policy/entropy"] = masked_mean(output.entropy.detach(), batch.response_mask)
        return loss, metrics

    return loss_fn


TOKEN_STALENESS = "token_staleness"
"""``[B, T]`` float: how many policy versions older than the trained one each token's sampler was (0 for tokens
the engine gave no version); the trainer fills it from ``tensors["policy_versions"]``."""


def _fresh_token_weights(
    weights: torch.Tensor, batch: TrainingBatch, objective: Objective
) -> tuple[torch.Tensor, LossMetrics]:
    """The policy term's token weights with tokens staler than ``off_policy.max_token_staleness`` set to 0.

    Zeroing weights (not the loss mask) keeps the reduction's normaliser, as the other off-policy corrections do,
    and works for every registered loss, since each reduces with the weights it is given.
    """
    limit = objective.policy_loss.off_policy_correction.max_token_staleness
    staleness = batch.tensors.get(TOKEN_STALENESS)
    if limit is None or staleness is None:
        return weights, {}
    fresh = (staleness <= limit).to(weights.dtype)
    stale_frac = masked_mean(1.0 - fresh, batch.response_mask)
    return weights * fresh, {"off_policy/stale_token_frac": stale_frac}


def make_value_loss_fn(value_clip: float | None) -> LossFn:
    """The critic's closure ``(model_output, micro_batch) -> (loss, metrics)``: the clipped value loss.

    The micro-batch must carry ``values`` (the critic's predictions when the batch was collected), ``returns``
    and ``value_token_weights``. ``value_clip`` is ``ε_v`` of :func:`~skyrl_train.algorithms.value_loss`; None
    disables clipping. Metrics (detached 0-dim tensors): ``critic/vf_clip_frac`` and ``critic/values_mean``.
    """

    def loss_fn(output: ModelOutput, batch: TrainingBatch) -> tuple[torch.Tensor, LossMetrics]:
        if output.values is None:
            raise ValueError("the critic backend returned no values: build the critic as a CriticBackend")
        t = batch.tensors
        loss, metrics = value_loss(
            output.values,
            t["values"],
            t["returns"],
            batch.response_mask,
            value_clip,
            token_weights=t["value_token_weights"],
        )
        return loss, {f"critic/{k}": v for k, v in metrics.items()}

    return loss_fn
