"""The RL loop: generate → score → reference/old log-probs → advantages → update → sync → evaluate.

The trainer calls protocols only (a :class:`Generator`, an :class:`InferenceEngine`, :class:`TrainingBackend`
models) and owns no device detail, so the same loop runs in one CPU process in tests and over Ray workers.

One step, in order::

    prompts ──generator──► trajectories ──► Experience (token rewards, masks, rollout log-probs, groups)
        old_log_probs = policy.forward(batch)              (the policy that sampled, as the trainer computes it)
        ref_log_probs = ref.forward(batch)                 (when a KL term needs it)
        rewards −= β·KL                                    (KL in reward, optional)
        advantages = estimator(rewards, mask, groups)      (GRPO by default)
        for each update epoch, for each mini-batch: policy.forward_backward(mini_batch, loss) ; optim_step
        engine.update_weights(policy.get_weights())        (paused while it loads)

Metrics per step include the mean ``|rollout log-prob − trainer log-prob|`` over generated tokens
(``policy/rollout_logprob_gap``): on an on-policy step it measures how far the engine's numerics are from the
trainer's, and must stay small.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from skyrl_train.algorithms import (
    AdvantageConfig,
    KLController,
    apply_kl_penalty,
    get_advantage_estimator,
    mask_zero_variance_groups,
    masked_mean,
)
from skyrl_train.algorithms.kl import KLEstimatorName
from skyrl_train.backends.base import TrainingBackend, TrainingBatch
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.experience import Experience, to_experience
from skyrl_train.generators.base import Generator, GeneratorInput
from skyrl_train.inference.base import InferenceEngine, SamplingParams
from skyrl_train.objective import Objective, add_token_weights, make_loss_fn

logger = logging.getLogger(__name__)

Metrics = dict[str, float]


class MetricsSink(Protocol):
    """Where step metrics go (``skyrl_train.tracking.Tracker`` satisfies it)."""

    def log(self, metrics: Metrics, step: int) -> None:
        """Record ``metrics`` for ``step``."""
        ...


@dataclass(frozen=True)
class LoopSettings:
    """What the loop itself needs; the entry point fills it from the run config."""

    n_samples_per_prompt: int = 4  # trajectories per prompt (a GRPO group)
    policy_mini_batch_size: int = 16  # PROMPTS per optimizer step
    update_epochs_per_batch: int = 1  # passes over each step's trajectories
    advantage_estimator: str = "grpo"
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    use_kl_in_reward: bool = False
    kl_estimator_type: KLEstimatorName = "k3"
    zero_variance_filter: bool = False  # mask groups whose rewards are all equal out of the loss
    logprob_temperature: float = 1.0  # must equal the sampling temperature
    eval_n_samples_per_prompt: int = 1
    seed: int = 0


@dataclass
class Trainer:
    """Runs RL steps and evaluations over injected components. See the module docstring for one step."""

    settings: LoopSettings
    objective: Objective
    policy: TrainingBackend
    engine: InferenceEngine
    generator: Generator
    sampling_params: SamplingParams
    eval_sampling_params: SamplingParams
    pad_token_id: int
    ref: TrainingBackend | None = None
    kl_controller: KLController | None = None
    sink: MetricsSink | None = None
    global_step: int = 0
    callbacks: list[Callable[[Trainer, Metrics], None]] = field(default_factory=list)

    # ------------------------------------------------------------------------------------------ one RL step

    async def train_step(self, prompts: Sequence[PromptRecord]) -> Metrics:
        """Roll out ``prompts``, update the policy on the trajectories and sync the engine; return metrics."""
        timings: Metrics = {}
        start = time.monotonic()
        output = await self.generator.generate(self._generator_input(prompts, training=True))
        timings["timing/generate_s"] = time.monotonic() - start
        experience = to_experience(output, self.pad_token_id)
        metrics = {**output.metrics, **self._reward_metrics(experience)}
        start = time.monotonic()
        self._prepare(experience, metrics)
        timings["timing/prepare_s"] = time.monotonic() - start
        start = time.monotonic()
        metrics.update(self._update(experience))
        timings["timing/update_s"] = time.monotonic() - start
        timings["timing/weight_sync_s"] = await self.sync_weights()
        self.global_step += 1
        metrics.update(timings)
        metrics["timing/step_s"] = sum(timings.values())
        self._emit(metrics)
        return metrics

    def _generator_input(self, prompts: Sequence[PromptRecord], *, training: bool) -> GeneratorInput:
        n = self.settings.n_samples_per_prompt if training else self.settings.eval_n_samples_per_prompt
        rows = [(p, i) for p in prompts for i in range(n)]
        params = self.sampling_params if training else self.eval_sampling_params
        if params.seed is None:
            # A seed per step (the generator offsets it per trajectory and turn) makes a step's samples depend
            # only on the run seed and the step, so a resumed run draws exactly what the uninterrupted one did.
            params = replace(params, seed=(self.settings.seed * 1_000_003 + self.global_step * 2 + training) << 20)
        return GeneratorInput(
            prompts=[p.messages for p, _ in rows],
            env_classes=[p.env_class for p, _ in rows],
            env_extras=[p.extras for p, _ in rows],
            trajectory_ids=[f"{p.uid}:{i}" for p, i in rows],
            sampling_params=params,
            training=training,
            global_step=self.global_step,
        )

    def _prepare(self, experience: Experience, metrics: Metrics) -> None:
        """Fill old/ref log-probs and advantages into ``experience.batch.tensors``."""
        batch = experience.batch
        temperature = self.settings.logprob_temperature
        batch.tensors["old_log_probs"] = self.policy.forward(batch, temperature=temperature).log_probs.detach()
        metrics["policy/rollout_logprob_gap"] = _logprob_gap(batch)
        if self.ref is not None:
            batch.tensors["ref_log_probs"] = self.ref.forward(batch, temperature=temperature).log_probs.detach()
        rewards = batch.tensors["rewards"]
        if self.settings.use_kl_in_reward and self.kl_controller is not None:
            rewards, kl_metrics = apply_kl_penalty(
                rewards,
                batch.tensors["old_log_probs"],
                batch.tensors["ref_log_probs"],
                batch.response_mask,
                self.kl_controller.value,
                self.settings.kl_estimator_type,
            )
            self.kl_controller.update(kl_metrics["kl"], len(batch))
            metrics.update({f"reward/{k}": v for k, v in kl_metrics.items()})
        if self.settings.zero_variance_filter:
            batch.response_mask = mask_zero_variance_groups(
                batch.response_mask, experience.sequence_rewards, experience.group_index
            )
        estimator = get_advantage_estimator(self.settings.advantage_estimator)
        advantages, returns = estimator(
            rewards, batch.response_mask, self.settings.advantage, group_index=experience.group_index
        )
        batch.tensors["advantages"] = advantages
        batch.tensors["returns"] = returns
        metrics["policy/advantage_abs_mean"] = masked_mean(advantages.abs(), batch.response_mask).item()
        metrics["policy/trained_token_fraction"] = batch.response_mask.mean().item()

    def _update(self, experience: Experience) -> Metrics:
        """Update epochs over mini-batches of whole prompt groups; return averaged loss metrics."""
        loss_fn = make_loss_fn(self.objective)
        sums: defaultdict[str, float] = defaultdict(float)
        count = 0
        rng = random.Random(self.settings.seed * 1_000_003 + self.global_step)
        for _ in range(self.settings.update_epochs_per_batch):
            for rows in self._mini_batches(experience.group_index, rng):
                mini = experience.batch.select(rows)
                if mini.response_mask.sum() == 0:
                    continue  # nothing to learn from (e.g. every group zero-variance)
                add_token_weights(mini, experience.group_index[rows], self.objective.policy_loss)
                stats = self.policy.forward_backward(
                    mini,
                    loss_fn,
                    temperature=self.settings.logprob_temperature,
                    with_entropy=self.objective.needs_entropy,
                )
                stats.update(self.policy.optim_step())
                for key, value in stats.items():
                    sums[key] += value
                count += 1
        metrics = {k if "/" in k else f"policy/{k}": v / count for k, v in sums.items()} if count else {}
        metrics["policy/optimizer_steps"] = float(count)
        return metrics

    def _mini_batches(self, group_index: torch.Tensor, rng: random.Random) -> Iterator[torch.Tensor]:
        """Row indices of each mini-batch: ``policy_mini_batch_size`` whole groups, groups in shuffled order."""
        groups: dict[int, list[int]] = defaultdict(list)
        for row, group in enumerate(group_index.tolist()):
            groups[group].append(row)
        order = list(groups)
        rng.shuffle(order)
        size = self.settings.policy_mini_batch_size
        for start in range(0, len(order), size):
            rows = [row for group in order[start : start + size] for row in groups[group]]
            yield torch.tensor(sorted(rows), dtype=torch.long)

    async def sync_weights(self) -> float:
        """Push the policy's weights into the engine (generation paused meanwhile); return the seconds it took."""
        start = time.monotonic()
        await self.engine.pause()
        try:
            await self.engine.update_weights(self.policy.get_weights())
        finally:
            await self.engine.resume()
        return time.monotonic() - start

    # ------------------------------------------------------------------------------------------ evaluation

    async def evaluate(self, prompts: Sequence[PromptRecord]) -> Metrics:
        """Roll out ``prompts`` with the evaluation sampling params; mean reward per ``data_source`` and overall."""
        output = await self.generator.generate(self._generator_input(prompts, training=False))
        rewards = [sum(r) for r in output.rewards]
        n = self.settings.eval_n_samples_per_prompt
        by_source: defaultdict[str, list[float]] = defaultdict(list)
        for index, reward in enumerate(rewards):
            by_source[prompts[index // n].data_source].append(reward)
        metrics = {f"eval/{src}/reward_mean": sum(v) / len(v) for src, v in by_source.items()}
        metrics["eval/all/reward_mean"] = sum(rewards) / max(len(rewards), 1)
        metrics["eval/all/pass_rate"] = sum(r > 0 for r in rewards) / max(len(rewards), 1)
        return metrics

    # ------------------------------------------------------------------------------------------ helpers

    def _reward_metrics(self, experience: Experience) -> Metrics:
        rewards = experience.sequence_rewards
        metrics = {
            "reward/mean": rewards.mean().item(),
            "reward/max": rewards.max().item(),
            "reward/min": rewards.min().item(),
        }
        for reason in set(experience.stop_reasons):
            metrics[f"rollout/stop_{reason}"] = experience.stop_reasons.count(reason) / len(experience.stop_reasons)
        return metrics

    def _emit(self, metrics: Metrics) -> None:
        if self.sink is not None:
            self.sink.log(metrics, self.global_step)
        for callback in self.callbacks:
            callback(self, metrics)


def _logprob_gap(batch: TrainingBatch) -> float:
    """Mean |engine log-prob − trainer log-prob| over the tokens the model generated (loss mask 1)."""
    gap = (batch.tensors["rollout_log_probs"] - batch.tensors["old_log_probs"]).abs()
    return float(masked_mean(gap, batch.response_mask).item())


def state_for_checkpoint(trainer: Trainer) -> dict[str, Any]:
    """JSON-safe loop state to store with a checkpoint (the adaptive KL coefficient)."""
    return {"kl_coef": trainer.kl_controller.value if trainer.kl_controller is not None else None}
