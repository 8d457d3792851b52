"""The default generator's output: finished rollouts assembled into a ``GeneratorOutput`` with batch metrics.

A failed trajectory keeps its tokens with every loss-mask entry and reward set to 0. For training batches two
optional post-processing steps follow: rewards zeroed for trajectories not ending in ``stop``, and loss masks zeroed
for trajectories ending in ``length`` (DAPO overlong filtering).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence

from skyrl_train.generators.base import GeneratorInput, GeneratorOutput, TrajectoryStopReason
from skyrl_train.generators.trajectory import Rollout

__all__ = ["STOP_REASONS", "assemble_output", "mask_overlong", "rollout_metrics", "zero_rewards_on_non_stop"]

logger = logging.getLogger(__name__)

STOP_REASONS: tuple[TrajectoryStopReason, ...] = (
    "stop",
    "length",
    "max_turns",
    "context",
    "env_error",
    "engine_error",
    "timeout",
)
"""Every stop reason, in the order the metrics list them."""


def assemble_output(
    batch: GeneratorInput,
    rollouts: list[Rollout],
    *,
    zero_reward_on_non_stop: bool = False,
    apply_overlong_filtering: bool = False,
) -> GeneratorOutput:
    """Assemble the output: failures masked, then (training batches only) the post-processing asked for."""
    loss_masks = [[0] * len(r.loss_mask) if r.failure else list(r.loss_mask) for r in rollouts]
    rewards = [[0.0] * len(r.rewards) if r.failure else list(r.rewards) for r in rollouts]
    stop_reasons = [r.stop_reason for r in rollouts]
    if batch.training and zero_reward_on_non_stop:
        rewards = zero_rewards_on_non_stop(rewards, stop_reasons)
    if batch.training and apply_overlong_filtering:
        loss_masks = mask_overlong(loss_masks, stop_reasons)
    return GeneratorOutput(
        prompt_token_ids=[r.prompt_ids for r in rollouts],
        response_ids=[r.response_ids for r in rollouts],
        loss_masks=loss_masks,
        rewards=rewards,
        rollout_logprobs=[r.logprobs for r in rollouts] if batch.sampling_params.logprobs else None,
        stop_reasons=stop_reasons,
        trajectory_ids=list(batch.trajectory_ids),
        policy_versions=[r.versions for r in rollouts] if any(r.versioned for r in rollouts) else None,
        env_metrics=[r.env_metrics for r in rollouts],
        metrics=rollout_metrics(rollouts, rewards),
    )


def zero_rewards_on_non_stop(
    rewards: list[list[float]], stop_reasons: Sequence[TrajectoryStopReason]
) -> list[list[float]]:
    """Token-level rewards with every trajectory whose stop reason is not ``stop`` set to 0."""
    return [row if reason == "stop" else [0.0] * len(row) for row, reason in zip(rewards, stop_reasons, strict=True)]


def mask_overlong(loss_masks: list[list[int]], stop_reasons: Sequence[TrajectoryStopReason]) -> list[list[int]]:
    """Loss masks with every trajectory that stopped for ``length`` masked out (DAPO overlong filtering)."""
    return [[0] * len(row) if reason == "length" else row for row, reason in zip(loss_masks, stop_reasons, strict=True)]


def rollout_metrics(rollouts: Sequence[Rollout], rewards: Sequence[Sequence[float]]) -> dict[str, float]:
    """Batch statistics: response/generated token counts, turns, LLM vs env time, stop reasons, env rewards."""
    if not rollouts:
        return {}
    lengths = [len(r.response_ids) for r in rollouts]
    totals = [sum(row) for row in rewards]
    metrics: dict[str, float] = {
        "generate/num_trajectories": float(len(rollouts)),
        **_stats("generate/num_tokens", lengths),
        **_stats("generate/num_prompt_tokens", [len(r.prompt_ids) for r in rollouts]),
        **_stats("generate/num_generated_tokens", [r.generated_tokens for r in rollouts]),
        **_stats("generate/num_turns", [r.turns for r in rollouts]),
        **_stats("generate/llm_time_s", [r.llm_time_s for r in rollouts]),
        **_stats("generate/env_time_s", [r.env_time_s for r in rollouts]),
        **_stats("generate/trajectory_time_s", [r.total_time_s for r in rollouts]),
    }
    zero = [n for n, total in zip(lengths, totals, strict=True) if total == 0]
    nonzero = [n for n, total in zip(lengths, totals, strict=True) if total != 0]
    if zero:
        metrics["generate/avg_tokens_zero_reward"] = _mean(zero)
    if nonzero:
        metrics["generate/avg_tokens_nonzero_reward"] = _mean(nonzero)
    for reason in STOP_REASONS:
        metrics[f"generate/stop_reason/{reason}"] = float(sum(r.stop_reason == reason for r in rollouts))
    metrics.update(_env_metrics(rollouts, totals))
    return metrics


def _env_metrics(rollouts: Sequence[Rollout], totals: Sequence[float]) -> dict[str, float]:
    """Per env class: the mean trajectory reward and the env's own aggregated numeric metrics."""
    by_class: dict[str, list[int]] = {}
    for i, rollout in enumerate(rollouts):
        by_class.setdefault(rollout.env_class, []).append(i)
    metrics: dict[str, float] = {}
    for env_class, rows in by_class.items():
        metrics[f"environment/{env_class}/avg_reward"] = _mean([totals[i] for i in rows])
        envs = [rollouts[i].env for i in rows if rollouts[i].env is not None]
        aggregate = getattr(type(envs[0]), "aggregate_metrics", None) if envs else None
        if aggregate is None:
            continue
        try:
            combined = aggregate([rollouts[i].env_metrics for i in rows if rollouts[i].env_metrics])
        except Exception:  # an env's metric helper must not fail the batch; the rewards are still reported
            logger.warning("aggregate_metrics of %s raised", env_class, exc_info=True)
            continue
        for key, value in dict(combined).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[f"environment/{env_class}/{key}"] = float(value)
    return metrics


def _stats(name: str, values: Sequence[float]) -> dict[str, float]:
    return {
        f"{name}/min": float(min(values)),
        f"{name}/max": float(max(values)),
        f"{name}/mean": _mean(values),
        f"{name}/std": float(statistics.pstdev(values)) if len(values) > 1 else 0.0,
    }


def _mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values))
