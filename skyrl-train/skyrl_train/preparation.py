"""What a step computes between its rollouts and its update: old, reference and value predictions, rewards, advantages.

:func:`prepare` fills the batch in place, in this order::

    token staleness      (tokens that carry the policy version that sampled them)
    old_log_probs        policy.forward(batch)      unless the update's own forward pass gives them
    ref_log_probs        ref.forward(batch)         when a KL term needs it
    values               critic.forward(batch)      when there is a critic
    rewards −= β·KL                                 KL in reward, optional
    step-wise rows: rewards folded into each trajectory's last row
    zero-variance groups masked out                 optional
    advantages, returns  estimator(rewards, mask, groups, values); step-wise rows take their last row's

Failed trajectories stay in the batch (masked) but take no part in the advantages' statistics: see "Failed
trajectories" in ``skyrl_train.algorithms.advantages``.
"""

from __future__ import annotations

import torch

from skyrl_train.algorithms import (
    KLController,
    apply_kl_penalty,
    broadcast_from_last_steps,
    estimate_advantages,
    explained_variance,
    fold_into_last_steps,
    get_advantage_estimator,
    mask_zero_variance_groups,
    masked_mean,
)
from skyrl_train.backends.base import TrainingBackend, TrainingBatch
from skyrl_train.experience import POLICY_VERSIONS, Experience
from skyrl_train.loop_settings import LoopSettings, Metrics
from skyrl_train.objective import TOKEN_STALENESS, Objective
from skyrl_train.update import GAP, GAP_MASK, ROLLOUT, Models, mean_gap

__all__ = ["add_token_staleness", "prepare"]


def prepare(
    experience: Experience,
    metrics: Metrics,
    *,
    models: Models,
    objective: Objective,
    settings: LoopSettings,
    kl_controller: KLController | None,
    version: int,
    old_log_probs: bool = True,
) -> None:
    """Fill the batch's tensors as the module docstring says; add their statistics to ``metrics``.

    ``version`` is the policy version the update starts from (token staleness is measured against it).
    ``old_log_probs=False``: the update's forward pass will give them; the gap to the rollout log-probs is then
    measured there, over the tokens generated (``tensors[GAP_MASK]``).

    Raises:
        ValueError: the objective needs the engine's rollout log-probs and the generator returned none, or
            step-wise rows meet the ``gae`` estimator.
    """
    batch = experience.batch
    _check_rollout_log_probs(objective, batch)
    if POLICY_VERSIONS in batch.tensors:
        metrics.update(add_token_staleness(batch, version))
    _predict(batch, metrics, models, settings.logprob_temperature, old_log_probs)
    rewards = batch.tensors["rewards"]
    if settings.use_kl_in_reward and kl_controller is not None:
        rewards = _penalise_kl(batch, rewards, metrics, kl_controller, settings)
    if experience.step_wise:
        _check_step_wise(settings.advantage_estimator)
        rewards = fold_into_last_steps(rewards, batch.response_mask, experience.trajectory_end)
    _advantages(experience, rewards, settings)
    metrics["policy/advantage_abs_mean"] = masked_mean(batch.tensors["advantages"].abs(), batch.response_mask).item()
    metrics["policy/trained_token_fraction"] = batch.response_mask.mean().item()
    if models.critic is not None:
        values, returns, mask = batch.tensors["values"], batch.tensors["returns"], batch.response_mask
        metrics["critic/explained_variance"] = explained_variance(values, returns, mask)
        metrics["critic/returns_mean"] = masked_mean(returns, mask).item()


def _predict(batch: TrainingBatch, metrics: Metrics, models: Models, temperature: float, old_log_probs: bool) -> None:
    """The models' forward passes over the batch, before any update: old and reference log-probs, values."""
    if old_log_probs:
        batch.tensors["old_log_probs"] = models.policy.forward(batch, temperature=temperature).log_probs.detach()
        if ROLLOUT in batch.tensors:
            metrics[GAP] = mean_gap(batch.tensors[ROLLOUT], batch.tensors["old_log_probs"], batch.response_mask)
    else:
        # The gap is measured on the training forward, over the tokens generated (before any filter).
        batch.tensors[GAP_MASK] = batch.response_mask
    if models.ref is not None:
        batch.tensors["ref_log_probs"] = models.ref.forward(batch, temperature=temperature).log_probs.detach()
    if models.critic is not None:
        batch.tensors["values"] = _critic_values(models.critic, batch)


def _penalise_kl(
    batch: TrainingBatch, rewards: torch.Tensor, metrics: Metrics, controller: KLController, settings: LoopSettings
) -> torch.Tensor:
    """``rewards − β·KL(old ‖ ref)``; the controller adapts ``β`` to the measured KL."""
    rewards, kl_metrics = apply_kl_penalty(
        rewards,
        batch.tensors["old_log_probs"],
        batch.tensors["ref_log_probs"],
        batch.response_mask,
        controller.value,
        settings.kl_estimator_type,
    )
    controller.update(kl_metrics["kl"], len(batch))
    metrics.update({f"reward/{k}": v for k, v in kl_metrics.items()})
    return rewards


def _advantages(experience: Experience, rewards: torch.Tensor, settings: LoopSettings) -> None:
    """``tensors["advantages"]`` and ``tensors["returns"]`` (after the zero-variance filter, when it is on)."""
    batch = experience.batch
    counted = experience.counted  # surviving trajectories, once each (their last row)
    if settings.zero_variance_filter:
        batch.response_mask = mask_zero_variance_groups(
            batch.response_mask, experience.trajectory_rewards, experience.group_index, valid=counted
        )
    advantages, returns = estimate_advantages(
        get_advantage_estimator(settings.advantage_estimator),
        rewards,
        batch.response_mask,
        settings.advantage,
        group_index=experience.group_index,
        values=batch.tensors.get("values"),
        valid=counted,
    )
    if experience.step_wise:
        # Every step-wise row takes its trajectory's last row's advantage and return (see ``generators.base``).
        mask, end = batch.response_mask, experience.trajectory_end
        advantages = broadcast_from_last_steps(advantages, mask, end)
        returns = broadcast_from_last_steps(returns, mask, end)
    batch.tensors["advantages"] = advantages
    batch.tensors["returns"] = returns


def _check_step_wise(estimator: str) -> None:
    """Raise ``ValueError`` when step-wise rows meet ``gae``, whose per-token values belong to one row."""
    if estimator == "gae":
        raise ValueError(
            "the generator returned step-wise rows (is_last_step) and algorithm.advantage_estimator is 'gae', "
            "whose per-token advantages do not carry from one row to another: use an outcome estimator "
            "(grpo, rloo, maxrl, reinforce++) or a generator that returns one row per trajectory"
        )


def _critic_values(critic: TrainingBackend, batch: TrainingBatch) -> torch.Tensor:
    """``[B, T]`` values of the batch's response tokens, as the critic predicts them before this step's update."""
    values = critic.forward(batch).values
    if values is None:
        raise TypeError(f"the critic ({type(critic).__name__}) returned no values: build it as a CriticBackend")
    return values.detach()


def add_token_staleness(batch: TrainingBatch, version: int) -> Metrics:
    """Store ``tensors["token_staleness"]`` (policy ``version`` minus each token's); return its mean and maximum.

    Both statistics are over the generated tokens the engine gave a version.
    """
    versions = batch.tensors[POLICY_VERSIONS].float()
    staleness = torch.where(versions >= 0, float(version) - versions, torch.zeros_like(versions))
    batch.tensors[TOKEN_STALENESS] = staleness
    generated = staleness[(batch.response_mask > 0) & (versions >= 0)]
    if generated.numel() == 0:
        return {}
    return {"async/token_staleness": generated.mean().item(), "async/token_staleness_max": generated.max().item()}


def _check_rollout_log_probs(objective: Objective, batch: TrainingBatch) -> None:
    """Fail before any model work when the objective needs rollout log-probs the generator did not return."""
    needed_by = objective.needs_rollout_log_probs
    if needed_by is not None and ROLLOUT not in batch.tensors:
        raise ValueError(
            f"{needed_by} needs the inference engine's log-probs of the sampled tokens, but the generator returned "
            "none (GeneratorOutput.rollout_logprobs is None): sample with SamplingParams(logprobs=True) from an "
            "engine that reports them, or turn the correction off"
        )
