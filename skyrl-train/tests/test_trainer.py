"""The loop over scripted rollouts and the tiny policy: which rows dynamic sampling trains on, and that taking the
old log-probs from the update's own forward pass changes neither losses nor gradients."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.algorithms import OffPolicyCorrectionConfig, PolicyLossConfig, loss_weights
from skyrl_train.backends import BackendConfig, LossFn, TorchBackend, TrainingBatch
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.dynamic_sampling import DynamicSamplingError
from skyrl_train.generators.base import GeneratorInput, GeneratorOutput
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.objective import Objective, add_token_weights
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


def _trainer(
    model_dir: Path, flat: set[str], micro_batch_sizes: tuple[int, int] = (2, 8), **settings: Any
) -> tuple[Trainer, list[TrainingBatch]]:
    """A trainer over scripted rollouts; the returned list collects every mini-batch the policy trains on.

    ``micro_batch_sizes``: rows per micro-batch of the update and of no-grad forwards.
    """
    train_rows, forward_rows = micro_batch_sizes
    policy = TorchBackend(
        BackendConfig(
            str(model_dir),
            gradient_checkpointing=False,
            micro_train_batch_size=train_rows,
            micro_forward_batch_size=forward_rows,
        )
    )
    trained: list[TrainingBatch] = []
    forward_backward = policy.forward_backward

    def recording(batch: TrainingBatch, loss_fn: LossFn, **kwargs: Any) -> dict[str, float]:
        trained.append(batch)
        return forward_backward(batch, loss_fn, **kwargs)

    policy.forward_backward = recording  # type: ignore[method-assign]
    trainer = Trainer(
        settings=LoopSettings(**{"n_samples_per_prompt": N, "policy_mini_batch_size": 2, **settings}),
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


# -- old log-probs from the update's forward pass ---------------------------------------------------------------


class VariedScriptedRewards(ScriptedRewards):
    """:class:`ScriptedRewards` whose samples differ in their tokens, so a group's gradients do not cancel out."""

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        output = await super().generate(batch)
        samples = [int(t.rsplit(":", 1)[1]) for t in batch.trajectory_ids]
        return dataclasses.replace(output, response_ids=[[7 + i, 20 + 3 * i, 9] for i in samples])


def _recorded_step(
    model_dir: Path,
    flat: set[str],
    prompts: list[PromptRecord],
    dropout: float = 0.0,
    micro_batch_sizes: tuple[int, int] = (2, 8),
    **settings: Any,
) -> tuple[dict[str, float], dict[str, torch.Tensor], int]:
    """One step: its metrics, the policy's gradients at the optimizer step, and how many no-grad forwards ran."""
    trainer, _ = _trainer(model_dir, flat, micro_batch_sizes, **settings)
    trainer.generator = VariedScriptedRewards(flat)
    policy = trainer.policy
    assert isinstance(policy, TorchBackend)
    policy.model.config.attention_dropout = dropout
    grads: dict[str, torch.Tensor] = {}
    forwards = 0
    forward, optim_step = policy.forward, policy.optim_step

    def counting_forward(*args: Any, **kwargs: Any) -> Any:
        nonlocal forwards
        forwards += 1
        return forward(*args, **kwargs)

    def recording_optim_step() -> dict[str, float]:
        grads.update({n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None})
        return optim_step()

    policy.forward = counting_forward  # type: ignore[method-assign]
    policy.optim_step = recording_optim_step  # type: ignore[method-assign]
    metrics = asyncio.run(trainer.train_step(prompts))
    return metrics, grads, forwards


@pytest.mark.parametrize(
    ("flat", "settings"),
    [
        (set(), {}),
        ({"p0"}, {"zero_variance_filter": True}),  # the gap still covers the masked-out group's tokens
        ({"p0", "p1"}, {"zero_variance_filter": True}),  # nothing to train: the gap needs a forward of its own
    ],
)
@pytest.mark.parametrize("micro_batch_sizes", [(4, 4), (2, 8)])
def test_reusing_the_update_forward_gives_the_same_losses_and_gradients(
    tiny_model_dir: Path, flat: set[str], settings: dict[str, Any], micro_batch_sizes: tuple[int, int]
) -> None:
    prompts = _prompts("p0", "p1")
    separate, separate_grads, separate_forwards = _recorded_step(
        tiny_model_dir, flat, prompts, micro_batch_sizes=micro_batch_sizes, reuse_update_log_probs=False, **settings
    )
    reused, reused_grads, reused_forwards = _recorded_step(
        tiny_model_dir, flat, prompts, micro_batch_sizes=micro_batch_sizes, **settings
    )
    trained = separate["policy/optimizer_steps"] == 1.0
    assert separate_forwards == 1
    assert reused_forwards == (0 if trained else 1)
    assert reused["policy/optimizer_steps"] == separate["policy/optimizer_steps"]
    assert reused_grads.keys() == separate_grads.keys()
    assert bool(separate_grads) == trained
    keys = ["policy/rollout_logprob_gap", "reward/mean", "policy/advantage_abs_mean"]
    if trained:
        keys += ["policy/loss", "policy/pg_loss", "policy/grad_norm", "policy/clip_frac"]
    if micro_batch_sizes[0] == micro_batch_sizes[1]:
        # The same micro-batches in both passes: the no-grad forward's log-probs are bit for bit the training
        # forward's, so everything is identical.
        for key in keys:
            assert reused[key] == pytest.approx(separate[key], rel=1e-6), key  # the gap: summed in another order
        assert all(torch.equal(reused_grads[name], grad) for name, grad in separate_grads.items())
        return
    # Other micro-batch shapes round differently: the separate pass's ratios are 1 ± 1e-6 instead of exactly 1.
    for key in keys:
        assert reused[key] == pytest.approx(separate[key], rel=1e-5, abs=1e-6), key
    for name, grad in separate_grads.items():
        assert float((reused_grads[name] - grad).norm()) <= 1e-5 * float(grad.norm()) + 1e-12, name


@pytest.mark.parametrize(
    "settings",
    [
        {"update_epochs_per_batch": 2},  # the second epoch trains a policy that no longer sampled the batch
        {"policy_mini_batch_size": 1},  # two mini-batches: the same for the second one
        {"use_kl_in_reward": True},  # the reward's KL penalty needs the old log-probs before the update
        {"reuse_update_log_probs": False},
    ],
)
def test_old_log_probs_get_their_own_forward_unless_the_update_is_on_policy(
    tiny_model_dir: Path, settings: dict[str, Any]
) -> None:
    settings = {"policy_mini_batch_size": 2, **settings}
    _, _, forwards = _recorded_step(tiny_model_dir, set(), _prompts("p0", "p1"), **settings)
    assert forwards == 1


def test_dropout_keeps_the_separate_old_log_prob_forward(tiny_model_dir: Path) -> None:
    # A training forward with dropout is not the no-grad forward: its log-probs cannot stand in for old ones.
    _, _, forwards = _recorded_step(tiny_model_dir, set(), _prompts("p0", "p1"), dropout=0.1)
    assert forwards == 1


def test_loop_work_runs_on_the_compute_thread_with_the_same_results(tiny_model_dir: Path) -> None:
    plain, _ = _trainer(tiny_model_dir, set())
    plain.generator = VariedScriptedRewards(set())
    expected = asyncio.run(plain.train_step(_prompts("p0", "p1")))
    compute = ComputeThread("test-loop")
    try:
        trainer, trained = _trainer(tiny_model_dir, set())
        trainer.generator = VariedScriptedRewards(set())
        assert isinstance(trainer.policy, TorchBackend)
        trainer.compute = trainer.policy.compute = compute
        threads: list[int] = []
        prepare = trainer._prepare

        def recording_prepare(*args: Any, **kwargs: Any) -> None:
            threads.append(threading.get_ident())
            prepare(*args, **kwargs)

        trainer._prepare = recording_prepare  # type: ignore[method-assign]
        metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
        assert threads == [compute.call(threading.get_ident)]
    finally:
        compute.close()
    assert len(trained) == 1
    for key in ("policy/loss", "policy/grad_norm", "policy/rollout_logprob_gap", "reward/mean"):
        assert metrics[key] == expected[key], key


# -- metrics and guards of the update ---------------------------------------------------------------------------


class UnevenLengths(VariedScriptedRewards):
    """Odd samples answer in one token: a group's advantages no longer cancel in a token mean (pg_loss ≠ 0)."""

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        output = await super().generate(batch)
        odd = [int(t.rsplit(":", 1)[1]) % 2 == 1 for t in batch.trajectory_ids]

        def cut(rows: list[list[Any]]) -> list[list[Any]]:
            return [row[-1:] if short else row for row, short in zip(rows, odd, strict=True)]

        assert output.rollout_logprobs is not None
        return dataclasses.replace(
            output,
            response_ids=cut(output.response_ids),
            loss_masks=cut(output.loss_masks),
            rewards=cut(output.rewards),
            rollout_logprobs=cut(output.rollout_logprobs),
        )


def _uneven_step(model_dir: Path, micro_train_rows: int) -> dict[str, float]:
    trainer, _ = _trainer(model_dir, set(), (micro_train_rows, 8))
    trainer.generator = UnevenLengths(set())
    return asyncio.run(trainer.train_step(_prompts("p0", "p1")))


def test_pg_loss_does_not_depend_on_the_micro_batch_size(tiny_model_dir: Path) -> None:
    """The micro-batch losses are shares of the batch loss: the metric adds them up (it averaged them once)."""
    whole = _uneven_step(tiny_model_dir, 4)
    split = _uneven_step(tiny_model_dir, 1)
    assert whole["policy/pg_loss"] != 0.0
    assert split["policy/pg_loss"] == pytest.approx(whole["policy/pg_loss"], rel=1e-5)
    assert split["policy/loss"] == pytest.approx(whole["policy/loss"], rel=1e-5)


def test_optimizer_steps_skipped_for_a_non_finite_gradient_are_counted(tiny_model_dir: Path) -> None:
    trainer, _ = _trainer(tiny_model_dir, set(), policy_mini_batch_size=1)
    trainer.generator = VariedScriptedRewards(set())
    policy = trainer.policy
    assert isinstance(policy, TorchBackend)
    optim_step = policy.optim_step
    calls = 0

    def poisoned_optim_step() -> dict[str, float]:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first of the two mini-batches gets an inf gradient
            next(p for p in policy.model.parameters() if p.grad is not None).grad.fill_(math.inf)  # type: ignore[union-attr]
        return optim_step()

    policy.optim_step = poisoned_optim_step  # type: ignore[method-assign]
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    assert metrics["policy/optimizer_steps"] == 2.0
    assert metrics["policy/skipped_steps"] == 1.0
    clean = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    assert clean["policy/skipped_steps"] == 0.0


class WithoutLogprobs(VariedScriptedRewards):
    """Rollouts from an engine that reports no log-probs."""

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        return dataclasses.replace(await super().generate(batch), rollout_logprobs=None)


def test_missing_rollout_log_probs_fail_a_step_that_corrects_with_them(tiny_model_dir: Path) -> None:
    trainer, trained = _trainer(tiny_model_dir, set())
    trainer.generator = WithoutLogprobs(set())
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))  # nothing needs them: the step runs
    assert "policy/rollout_logprob_gap" not in metrics
    assert len(trained) == 1
    trainer.objective = Objective(
        policy_loss_type="regular",
        policy_loss=PolicyLossConfig(off_policy_correction=OffPolicyCorrectionConfig(tis_ratio_type="token")),
    )
    with pytest.raises(ValueError, match=r"off_policy correction needs the inference engine's log-probs"):
        asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    assert len(trained) == 1  # it failed before any model work


def test_the_value_loss_is_a_token_mean_whatever_the_policy_reduction() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    batch = TrainingBatch(
        input_ids=torch.ones(2, 5, dtype=torch.long),
        attention_mask=torch.ones(2, 5, dtype=torch.long),
        response_mask=mask,
    )
    objective = Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig(loss_reduction="sequence_mean"))
    add_token_weights(batch, torch.tensor([0, 0]), objective)
    assert torch.equal(batch.tensors["token_weights"], loss_weights(mask, "sequence_mean"))
    assert torch.equal(batch.tensors["value_token_weights"], mask / 4)


def test_a_mini_batch_with_nothing_to_learn_keeps_the_lr_schedule_without_touching_the_weights(
    tiny_model_dir: Path,
) -> None:
    trainer, trained = _trainer(tiny_model_dir, flat={"p0", "p1"}, zero_variance_filter=True, policy_mini_batch_size=1)
    policy = trainer.policy
    assert isinstance(policy, TorchBackend)
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    assert metrics["policy/optimizer_steps"] == 0.0
    assert not trained
    assert policy.scheduler.last_epoch == 2  # both mini-batches advanced the schedule
    assert all(torch.equal(p, before[name]) for name, p in policy.model.named_parameters())
