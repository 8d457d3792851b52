"""The loop with dynamic sampling, over scripted rollouts and the tiny policy: which rows it trains on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.algorithms import PolicyLossConfig
from skyrl_train.backends import BackendConfig, LossFn, TorchBackend, TrainingBatch
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.dynamic_sampling import DynamicSamplingError
from skyrl_train.generators.base import GeneratorInput, GeneratorOutput
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.objective import Objective
from skyrl_train.trainer import LoopSettings, Trainer

N = 2  # samples per prompt
PROMPT_TOKEN = 100  # prompt k is the token PROMPT_TOKEN + k, so a trained row names its prompt


class NoEngine:
    """The weight sync's counterpart; rollouts come from :class:`ScriptedRewards`, not from an engine."""

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        raise AssertionError("the scripted generator does not call the engine")

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _ in weights:
            pass

    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def close(self) -> None:
        pass


class ScriptedRewards:
    """Rollouts without a model: prompts in ``flat`` earn 1 on every sample; the others 0 and 1 (variance)."""

    def __init__(self, flat: set[str]) -> None:
        self.flat = flat
        self.calls: list[list[str]] = []  # the prompt uids of each generate call

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        uids = [t.rsplit(":", 1)[0] for t in batch.trajectory_ids]
        self.calls.append(list(dict.fromkeys(uids)))
        samples = [int(t.rsplit(":", 1)[1]) for t in batch.trajectory_ids]
        rewards = [1.0 if uid in self.flat else float(i % 2) for uid, i in zip(uids, samples, strict=True)]
        return GeneratorOutput(
            prompt_token_ids=[[5, PROMPT_TOKEN + int(uid[1:])] for uid in uids],
            response_ids=[[7, 8, 9]] * len(uids),
            loss_masks=[[1, 1, 1]] * len(uids),
            rewards=[[0.0, 0.0, r] for r in rewards],
            rollout_logprobs=[[0.0, 0.0, 0.0]] * len(uids),
            stop_reasons=["stop"] * len(uids),
            trajectory_ids=list(batch.trajectory_ids),
        )


def _prompts(*uids: str) -> list[PromptRecord]:
    return [PromptRecord([{"role": "user", "content": uid}], "scripted", {}, uid) for uid in uids]


def _trainer(model_dir: Path, flat: set[str], **settings: Any) -> tuple[Trainer, list[TrainingBatch]]:
    """A trainer over scripted rollouts; the returned list collects every mini-batch the policy trains on."""
    policy = TorchBackend(
        BackendConfig(
            str(model_dir), gradient_checkpointing=False, micro_train_batch_size=2, micro_forward_batch_size=8
        )
    )
    trained: list[TrainingBatch] = []
    forward_backward = policy.forward_backward

    def recording(batch: TrainingBatch, loss_fn: LossFn, **kwargs: Any) -> dict[str, float]:
        trained.append(batch)
        return forward_backward(batch, loss_fn, **kwargs)

    policy.forward_backward = recording  # type: ignore[method-assign]
    trainer = Trainer(
        settings=LoopSettings(n_samples_per_prompt=N, policy_mini_batch_size=2, **settings),
        objective=Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig()),
        policy=policy,
        engine=NoEngine(),
        generator=ScriptedRewards(flat),
        sampling_params=SamplingParams(max_tokens=3),
        eval_sampling_params=SamplingParams(max_tokens=3),
        pad_token_id=0,
    )
    return trainer, trained


def _trained_prompts(trained: list[TrainingBatch]) -> list[int]:
    """The prompt number of every trained row, in order."""
    return [int(row[-4]) - PROMPT_TOKEN for batch in trained for row in batch.input_ids]


def _refills(*batches: list[PromptRecord]) -> Iterator[list[PromptRecord]]:
    yield from batches


def test_filter_trains_only_on_groups_with_reward_variance(tiny_model_dir: Path) -> None:
    trainer, trained = _trainer(tiny_model_dir, flat={"p0", "p1", "p2"}, dynamic_sampling="filter")
    refills = _refills(_prompts("p2", "p3"), _prompts("p4", "p5"), _prompts("p6", "p7"))
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1"), lambda: next(refills)))
    # p0, p1 flat (nothing kept) → p2 flat, p3 kept → p4 kept: the step is full, p5 is dropped, p6/p7 untouched.
    assert trainer.generator.calls == [["p0", "p1"], ["p2", "p3"], ["p4", "p5"]]  # type: ignore[attr-defined]
    assert sorted(_trained_prompts(trained)) == [3, 3, 4, 4]
    for batch in trained:  # every trained row has a non-zero GRPO advantage: its group's rewards vary
        assert bool((batch.tensors["advantages"][:, -1].abs() > 0.5).all())
    assert metrics["dynamic_sampling/sample_batches"] == 3.0
    assert metrics["dynamic_sampling/groups_sampled"] == 6.0
    assert metrics["dynamic_sampling/groups_kept"] == 2.0
    assert metrics["reward/mean"] == pytest.approx((6 * 1.0 + 6 * 0.5) / 12)  # over all 12 sampled rows


def test_filter_without_a_prompt_source_names_next_prompts(tiny_model_dir: Path) -> None:
    trainer, _ = _trainer(tiny_model_dir, flat={"p0"}, dynamic_sampling="filter")
    with pytest.raises(DynamicSamplingError, match="got no next_prompts"):
        asyncio.run(trainer.train_step(_prompts("p0", "p1")))


def test_filter_gives_up_after_max_sample_batches(tiny_model_dir: Path) -> None:
    trainer, trained = _trainer(
        tiny_model_dir, flat={"p0", "p1", "p2"}, dynamic_sampling="filter", max_sample_batches=2
    )
    refills = _refills(_prompts("p2", "p3"), _prompts("p4", "p5"))
    with pytest.raises(DynamicSamplingError, match="max_sample_batches=2"):
        asyncio.run(trainer.train_step(_prompts("p0", "p1"), lambda: next(refills)))
    assert trained == []
    assert trainer.global_step == 0


def test_replace_trains_on_copies_of_informative_groups(tiny_model_dir: Path) -> None:
    trainer, trained = _trainer(tiny_model_dir, flat={"p0"}, dynamic_sampling="replace", min_replace_ratio=0.5)
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    assert trainer.generator.calls == [["p0", "p1"]]  # type: ignore[attr-defined]
    assert _trained_prompts(trained) == [1, 1, 1, 1]  # p0's group replaced by a copy of p1's
    assert metrics["dynamic_sampling/groups_replaced"] == 1.0
