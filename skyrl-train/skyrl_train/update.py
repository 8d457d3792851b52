"""The update of one step: policy (and critic) optimizer steps over mini-batches of whole prompt groups.

::

    for each update epoch, for each mini-batch (``policy_mini_batch_size`` groups, shuffled):
        policy.forward_backward(mini_batch, loss) ; optim_step
        critic.forward_backward(mini_batch, value loss) ; optim_step   (same mini-batches, when there is one)

The critic learns from the same shuffled mini-batches right after the policy, and neither update changes what the
other one sees (old log-probs, values, advantages and returns were all computed before the first update).

**One update on the policy that sampled** (``reuse_forward``): with one update epoch over one mini-batch, the single
training forward pass runs on exactly the weights the old log-probs would be computed with, so the batch is sent
without old log-probs and each micro-batch takes the detached log-probs of its own forward pass
(:func:`on_policy_update`). ``policy/rollout_logprob_gap`` then comes back among the loss function's metrics from
wherever the backend runs the loss (Ray workers with FSDP); no forward pass runs after the optimizer step.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import torch

from skyrl_train.algorithms import masked_mean
from skyrl_train.backends.base import LossFn, LossMetrics, ModelOutput, TrainingBackend, TrainingBatch
from skyrl_train.experience import Experience
from skyrl_train.loop_settings import LoopSettings, Metrics
from skyrl_train.objective import Objective, add_token_weights, make_loss_fn, make_value_loss_fn

__all__ = ["GAP", "GAP_MASK", "ROLLOUT", "Models", "mean_gap", "on_policy_update", "update"]

logger = logging.getLogger(__name__)

GAP = "policy/rollout_logprob_gap"
GAP_MASK = "logprob_gap_mask"
"""``tensors`` key of the ``[B, T]`` mask the rollout log-prob gap is measured over, when the update measures it."""
ROLLOUT = "rollout_log_probs"
_TRAINED_MASK = "trained_mask"
"""``tensors`` key of the ``[B, T]`` mask of the tokens an on-policy update trains on (:func:`on_policy_update`)."""


@dataclass(frozen=True)
class Models:
    """The models a step computes with (the reference and the critic only when the run has them)."""

    policy: TrainingBackend
    ref: TrainingBackend | None = None
    critic: TrainingBackend | None = None


def update(
    experience: Experience,
    *,
    models: Models,
    objective: Objective,
    settings: LoopSettings,
    step: int,
    reuse_forward: bool = False,
) -> Metrics:
    """Update epochs over mini-batches of whole prompt groups (step ``step``); return averaged loss metrics.

    ``reuse_forward``: the batch has no old log-probs; see "One update on the policy that sampled" above.
    """
    loss_fn = make_loss_fn(objective)
    value_loss_fn = make_value_loss_fn(settings.value_clip)
    gap: Metrics = {}  # the gap of a mini-batch with nothing to train on, from a forward of its own
    sums: defaultdict[str, float] = defaultdict(float)
    skipped: defaultdict[str, float] = defaultdict(float)  # optimizer steps skipped, per model
    count = 0
    rng = random.Random(settings.seed * 1_000_003 + step)
    for _ in range(settings.update_epochs_per_batch):
        for rows in _mini_batches(experience.group_index, settings.policy_mini_batch_size, rng):
            mini = experience.batch.select(rows)
            if mini.response_mask.sum() == 0:  # nothing to learn from (e.g. every group zero-variance or failed)
                if reuse_forward:
                    gap = _measure_gap(models.policy, mini, settings)  # before the step, which leaves the weights
                _advance_schedules(models)
                continue
            ends = experience.trajectory_end[rows]
            add_token_weights(mini, experience.group_index[rows], objective, trajectory_index=ends)
            sent, sent_loss_fn = on_policy_update(mini, loss_fn) if reuse_forward else (mini, loss_fn)
            stats = models.policy.forward_backward(
                sent, sent_loss_fn, temperature=settings.logprob_temperature, with_entropy=objective.needs_entropy
            )
            stats.update(models.policy.optim_step())
            if models.critic is not None:
                stats.update(_critic_step(models.critic, mini, value_loss_fn))
            for key, value in stats.items():
                (skipped if key.endswith("skipped") else sums)[key] += value
            count += 1
    metrics = {k if "/" in k else f"policy/{k}": v / count for k, v in sums.items()} if count else {}
    metrics["policy/optimizer_steps"] = float(count)
    metrics.update(_skipped_steps(skipped, step))
    metrics.update(gap)
    return metrics


def _advance_schedules(models: Models) -> None:
    """An optimizer step without gradients: weights and moments stay, the LR schedules keep to the plan.

    The schedules are sized for every mini-batch of the run; skipping a mini-batch without stepping would leave a
    decaying schedule short of its end.
    """
    models.policy.optim_step()
    if models.critic is not None:
        models.critic.optim_step()


def _measure_gap(policy: TrainingBackend, batch: TrainingBatch, settings: LoopSettings) -> Metrics:
    """``policy/rollout_logprob_gap`` of ``batch`` from a forward pass of its own; {} without rollout log-probs.

    For an on-policy mini-batch with nothing to train on: no training forward runs to measure the gap.
    """
    if ROLLOUT not in batch.tensors:
        return {}
    log_probs = policy.forward(batch, temperature=settings.logprob_temperature).log_probs
    return {GAP: mean_gap(batch.tensors[ROLLOUT], log_probs, batch.tensors[GAP_MASK])}


def _mini_batches(group_index: torch.Tensor, size: int, rng: random.Random) -> Iterator[torch.Tensor]:
    """Row indices of each mini-batch: ``size`` whole groups, groups in shuffled order."""
    groups: dict[int, list[int]] = defaultdict(list)
    for row, group in enumerate(group_index.tolist()):
        groups[group].append(row)
    order = list(groups)
    rng.shuffle(order)
    for start in range(0, len(order), size):
        rows = [row for group in order[start : start + size] for row in groups[group]]
        yield torch.tensor(sorted(rows), dtype=torch.long)


def _critic_step(critic: TrainingBackend, mini: TrainingBatch, loss_fn: LossFn) -> Metrics:
    """One critic optimizer step on a mini-batch; metrics under ``critic/`` (``value_loss``, ``grad_norm``, …)."""
    stats = critic.forward_backward(mini, loss_fn)
    stats["value_loss"] = stats.pop("loss")
    stats.update(critic.optim_step())
    return {key if "/" in key else f"critic/{key}": value for key, value in stats.items()}


def mean_gap(rollout: torch.Tensor, log_probs: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean ``|rollout − log_probs|`` (both ``[B, T]``) over the tokens of ``mask``; 0 over none."""
    return float(masked_mean((rollout - log_probs.detach().to(rollout.device)).abs(), mask.to(rollout.device)))


def on_policy_update(mini: TrainingBatch, loss_fn: LossFn) -> tuple[TrainingBatch, LossFn]:
    """The batch and loss function to send for an update whose forward pass also gives the old log-probs.

    Only valid when the forward pass runs on the weights that sampled the batch and computes what a no-grad forward
    would. The gap to the rollout log-probs is measured over the generated tokens (``tensors[GAP_MASK]``), which
    include groups the zero-variance filter left out of ``response_mask``. The backend combines non-loss metrics
    over micro-batches and ranks weighted by their ``response_mask`` tokens, and pads a rank's short share with
    copies of a row whose ``response_mask`` alone is zeroed; so the batch sent carries the generated tokens as
    ``response_mask`` (the gap's weights, zero on padding) and the trained ones under ``_TRAINED_MASK``, which the
    loss function turns back into the mask it trains with.
    """
    trained = mini.response_mask
    tensors = {name: t for name, t in mini.tensors.items() if name != GAP_MASK}
    sent = replace(mini, response_mask=mini.tensors[GAP_MASK], tensors={**tensors, _TRAINED_MASK: trained})
    # Generated over trained tokens of the mini-batch: converts the backend's weights back (see below).
    scale = float(sent.response_mask.sum()) / float(trained.sum())
    return sent, _with_current_as_old(loss_fn, scale)


def _with_current_as_old(loss_fn: LossFn, scale: float) -> LossFn:
    """``loss_fn`` on a micro-batch of :func:`on_policy_update`'s batch, with the forward's log-probs as old ones.

    Its metrics add ``policy/rollout_logprob_gap``: the mean over the micro-batch's generated tokens (its
    ``response_mask``, ``g`` of them), which the backend's weighting by ``g`` makes the mean over all of them.
    ``loss_fn`` sees the ``t`` trained tokens as its mask, and its metrics are means over those; each is multiplied
    by ``t / g · scale`` (``scale``: the mini-batch's generated over its trained tokens), so that the backend's
    ``g``-weighted mean comes out as the ``t``-weighted one. ``*_loss`` shares are summed, not weighted: they stay.
    """

    def on_policy_loss_fn(output: ModelOutput, batch: TrainingBatch) -> tuple[torch.Tensor, LossMetrics]:
        current = output.log_probs.detach()
        generated = batch.response_mask
        trained = batch.tensors[_TRAINED_MASK] * generated  # 0 on padding rows, whose generated mask alone is 0
        tensors = {**batch.tensors, "old_log_probs": current}
        loss, metrics = loss_fn(output, replace(batch, response_mask=trained, tensors=tensors))
        # Tensors, not floats: reading them here would make the host wait for the device every micro-batch.
        share = trained.sum().float() / generated.sum().float().clamp(min=1.0) * scale
        metrics = {name: v if name.endswith("_loss") else v * share for name, v in metrics.items()}
        if ROLLOUT in batch.tensors:
            rollout = batch.tensors[ROLLOUT]
            metrics[GAP] = masked_mean((rollout - current.to(rollout.device)).abs(), generated.to(rollout.device))
        return loss, metrics

    return on_policy_loss_fn


def _skipped_steps(skipped: Mapping[str, float], step: int) -> Metrics:
    """``policy/skipped_steps`` (and ``critic/skipped_steps``): optimizer steps dropped for a non-finite gradient."""
    metrics: Metrics = {}
    for key, count in skipped.items():
        name = key.rsplit("skipped", 1)[0] or "policy/"
        metrics[f"{name}skipped_steps"] = count
        if count:
            logger.warning(
                "step %d: %d %s optimizer step(s) skipped for a non-finite gradient norm", step, count, name[:-1]
            )
    metrics.setdefault("policy/skipped_steps", 0.0)
    return metrics
