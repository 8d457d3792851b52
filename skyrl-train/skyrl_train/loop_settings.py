"""The training loop's own settings and the small protocols it is given (a leaf: the loop's modules share it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from skyrl_train.algorithms import AdvantageConfig, DynamicSamplingType
from skyrl_train.algorithms.kl import KLEstimatorName
from skyrl_train.data.dataset import PromptRecord

__all__ = ["AsyncMode", "Handover", "LoopSettings", "Metrics", "MetricsSink", "PromptSource"]

Metrics = dict[str, float]
AsyncMode = Literal["sync", "one_step_off", "fully_async"]
PromptSource = Callable[[], Sequence[PromptRecord]]
"""Hands out the next batch of training prompts (dynamic sampling draws more than one per step)."""


class MetricsSink(Protocol):
    """Where step metrics go (``skyrl_train.tracking.Tracker`` satisfies it)."""

    def log(self, metrics: Metrics, step: int) -> None:
        """Record ``metrics`` for ``step``."""
        ...


class Handover(Protocol):
    """Hands device memory from the engines to the training backends after generation, and back before the sync."""

    async def to_training(self) -> None:
        """Generation is over: let the backends have the memory."""
        ...

    async def to_generation(self) -> None:
        """Training is over: let the engines have it (awake, ready to load weights)."""
        ...


@dataclass(frozen=True)
class LoopSettings:
    """What the loop itself needs; ``skyrl_train.wiring.loop_settings`` fills it from the run config.

    The defaults are the run config's (``tests/test_wiring.py`` checks that they stay so).
    """

    n_samples_per_prompt: int = 5  # trajectories per prompt (a GRPO group)
    policy_mini_batch_size: int = 256  # PROMPTS per optimizer step
    update_epochs_per_batch: int = 1  # passes over each step's trajectories
    advantage_estimator: str = "grpo"
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    use_kl_in_reward: bool = False
    kl_estimator_type: KLEstimatorName = "k3"
    zero_variance_filter: bool = False  # mask groups whose rewards are all equal out of the loss
    dynamic_sampling: DynamicSamplingType | None = None  # DAPO: "filter" or "replace" zero-variance groups
    max_sample_batches: int = 30  # dynamic sampling: prompt batches a step may draw before it fails
    min_replace_ratio: float = 0.3  # "replace": informative share of a batch needed to copy from it
    value_clip: float | None = 0.2  # critic: how far a value may move from its value at collection; None: no clip
    logprob_temperature: float = 1.0  # must equal the sampling temperature
    reuse_update_log_probs: bool = True  # one update on one mini-batch: old log-probs from its forward pass
    eval_n_samples_per_prompt: int = 1
    seed: int = 42  # seeds the per-step sampling seeds and the mini-batch shuffles
    # Which loop of skyrl_train.modes runs: "sync", "one_step_off" (the next step generates while this one trains)
    # or "fully_async" (steps take groups from a stream that never stops generating)
    async_mode: AsyncMode = "sync"
    device: str = "cpu"  # where the models compute (trainer.device, resolved): logged as system/device_is_cuda
