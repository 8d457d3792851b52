"""Step-wise rows (``GeneratorOutput.is_last_step``): a trajectory split over several rows enters its group's
statistics once, and every one of its rows trains with its last row's advantage."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.algorithms import broadcast_from_last_steps, fold_into_last_steps
from skyrl_train.backends import TrainingBatch
from skyrl_train.experience import concat_experiences, select_rows, to_experience
from skyrl_train.generators.base import GeneratorInput, GeneratorOutput

from .test_trainer import PROMPT_TOKEN, _prompts, _trainer

# Per trajectory id: the rewards of its rows (several rows: step-wise). p0's first trajectory took two samples.
SPLIT = {"p0:0": [0.0, 1.0], "p0:1": [0.0], "p1:0": [1.0], "p1:1": [0.0, 0.0, 0.0]}


class StepWiseRewards:
    """Rollouts whose trajectories span the rows :data:`SPLIT` gives them; row ``k`` of a trajectory has ``k`` in
    its first response token, so a trained row says which step it is."""

    def __init__(self, split: dict[str, list[float]]) -> None:
        self.split = split

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        rows: list[tuple[str, int, float, bool]] = []
        for trajectory_id in batch.trajectory_ids:
            rewards = self.split[trajectory_id]
            rows += [(trajectory_id, k, r, k == len(rewards) - 1) for k, r in enumerate(rewards)]
        return GeneratorOutput(
            prompt_token_ids=[[5, PROMPT_TOKEN + int(t.split(":")[0][1:])] for t, *_ in rows],
            response_ids=[[30 + k, 8 + int(t[-1]), 9] for t, k, _, _ in rows],
            loss_masks=[[1, 1, 1]] * len(rows),
            rewards=[[0.0, 0.0, r] for _, _, r, _ in rows],
            rollout_logprobs=[[0.0, 0.0, 0.0]] * len(rows),
            stop_reasons=["stop"] * len(rows),
            trajectory_ids=[t for t, *_ in rows],
            is_last_step=[last for *_, last in rows],
        )


def _output(split: dict[str, list[float]]) -> GeneratorOutput:
    ids = list(split)
    batch = GeneratorInput([[]] * len(ids), ["x"] * len(ids), [{}] * len(ids), ids, sampling_params=None)  # type: ignore[arg-type]
    return asyncio.run(StepWiseRewards(split).generate(batch))


def test_rows_map_to_the_row_ending_their_trajectory_and_only_that_one_counts() -> None:
    experience = to_experience(_output(SPLIT), pad_token_id=0)
    assert experience.step_wise
    assert experience.trajectory_end.tolist() == [1, 1, 2, 3, 6, 6, 6]
    assert experience.counted.tolist() == [False, True, True, True, False, False, True]
    assert experience.group_index.tolist() == [0, 0, 0, 1, 1, 1, 1]  # a trajectory's rows stay in its prompt's group
    picked = select_rows(experience, torch.tensor([3, 4, 5, 6]), torch.tensor([0, 0, 0, 0]))
    assert picked.trajectory_end.tolist() == [0, 3, 3, 3]
    joined = concat_experiences([experience, picked], pad_token_id=0)
    assert joined.trajectory_end.tolist() == [1, 1, 2, 3, 6, 6, 6, 7, 10, 10, 10]
    whole = to_experience(_output({"p9:0": [1.0], "p9:1": [0.0]}), pad_token_id=0)
    assert not whole.step_wise
    assert whole.counted.tolist() == [True, True]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([True, True], "2 is_last_step flags for 3 rows"),
        ([True, True, False], "last row is not flagged"),
        ([False, True, True], None),  # p9:0 over two rows: valid
    ],
)
def test_inconsistent_step_flags_are_rejected_with_the_rule(flags: list[bool], message: str | None) -> None:
    output = _output({"p9:0": [0.0, 1.0], "p9:1": [0.0]})
    output.is_last_step = flags
    if message is None:
        assert to_experience(output, pad_token_id=0).trajectory_end.tolist() == [1, 1, 2]
        return
    with pytest.raises(ValueError, match=message):
        to_experience(output, pad_token_id=0)


def test_rows_of_one_trajectory_must_be_consecutive() -> None:
    output = _output({"p9:0": [0.0, 1.0], "p9:1": [0.0]})
    output.trajectory_ids = ["p9:0", "p9:1", "p9:0"]
    output.is_last_step = [False, True, True]
    with pytest.raises(ValueError, match="consecutive"):
        to_experience(output, pad_token_id=0)


def test_broadcast_gives_each_row_its_last_rows_value_on_its_own_tokens() -> None:
    values = torch.tensor([[9.0, 9.0, 9.0], [0.5, 0.5, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 1, 1]])
    out = broadcast_from_last_steps(values, mask, torch.tensor([1, 1, 2]))
    assert out.tolist() == [[0.5, 0.5, 0.5], [0.5, 0.5, 0.0], [0.0, -1.0, -1.0]]


def test_folding_moves_every_rows_rewards_onto_its_trajectorys_last_trained_token() -> None:
    rewards = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, -0.25, 0.0], [0.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    folded = fold_into_last_steps(rewards, mask, torch.tensor([1, 1, 3, 3]))
    assert folded.tolist() == [
        [0.0, 0.0, 0.0],
        [0.0, 0.5, 1.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 1.75],
    ]  # at index 1: its last trained token
    output = _output({"p9:0": [0.5, 1.0], "p9:1": [0.0]})
    assert output.trajectory_rewards() == [1.5, 0.0]
    assert to_experience(output, pad_token_id=0).trajectory_rewards.tolist() == [1.5, 1.5, 0.0]


def _trained_rows(trained: list[TrainingBatch]) -> dict[tuple[int, int, int], float]:
    """(prompt, sample, step) of every trained row → its advantage (constant over the row's tokens)."""
    rows = {}
    for batch in trained:
        advantages, mask = batch.tensors["advantages"], batch.response_mask.bool()
        for row, ids in enumerate(batch.input_ids.tolist()):
            if ids[-4] < PROMPT_TOKEN:
                continue  # a padding row of the micro-batch
            key = (ids[-4] - PROMPT_TOKEN, ids[-2] - 8, ids[-3] - 30)
            row_advantages = advantages[row][mask[row]]
            assert torch.allclose(row_advantages, row_advantages[:1])
            rows[key] = float(row_advantages[0]) if mask[row].any() else 0.0
    return rows


def _step(model_dir: Path, split: dict[str, list[float]], **settings: Any) -> tuple[dict[str, float], dict[Any, float]]:
    trainer, trained = _trainer(model_dir, set(), **settings)
    trainer.generator = StepWiseRewards(split)
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    return metrics, _trained_rows(trained)


def test_every_row_of_a_trajectory_trains_with_the_trajectorys_grpo_advantage(tiny_model_dir: Path) -> None:
    metrics, rows = _step(tiny_model_dir, SPLIT)
    a = 1 / 2**0.5  # GRPO over two trajectories with rewards 1 and 0: ±(0.5 / std 0.707)
    expected = {(0, 0, 0): a, (0, 0, 1): a, (0, 1, 0): -a, (1, 0, 0): a, (1, 1, 0): -a, (1, 1, 1): -a, (1, 1, 2): -a}
    assert rows.keys() == expected.keys()
    for key, value in expected.items():
        assert rows[key] == pytest.approx(value, abs=1e-4), key
    assert metrics["reward/mean"] == 0.5  # four trajectories, two rewarded: not 2 of 7 rows
    assert metrics["rollout/stop_stop"] == 1.0


def test_a_reward_on_an_earlier_row_counts_for_the_trajectory(tiny_model_dir: Path) -> None:
    # p0:0 earns its 1 on its first sample: the same trajectory reward, so the same advantages as SPLIT's.
    metrics, rows = _step(tiny_model_dir, {**SPLIT, "p0:0": [1.0, 0.0]})
    _, expected = _step(tiny_model_dir, SPLIT)
    assert rows.keys() == expected.keys()
    for key, value in expected.items():
        assert rows[key] == pytest.approx(value, abs=1e-4), key
    assert metrics["reward/mean"] == 0.5


def test_a_group_whose_trajectories_agree_is_zero_variance_whatever_its_step_rows(tiny_model_dir: Path) -> None:
    # p1's trajectories both earn 1; its split trajectory's first row (reward 0 on the row) is not a trajectory.
    split = {**SPLIT, "p1:0": [1.0], "p1:1": [0.0, 1.0]}
    _, rows = _step(tiny_model_dir, split, zero_variance_filter=True)
    assert {key for key, value in rows.items() if value != 0.0} == {(0, 0, 0), (0, 0, 1), (0, 1, 0)}


def test_dynamic_sampling_counts_trajectories_not_rows(tiny_model_dir: Path) -> None:
    split = {**SPLIT, "p1:0": [1.0], "p1:1": [0.0, 1.0]}
    trainer, trained = _trainer(tiny_model_dir, set(), dynamic_sampling="replace", min_replace_ratio=0.5)
    trainer.generator = StepWiseRewards(split)
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    assert metrics["dynamic_sampling/groups_replaced"] == 1.0  # p1 is replaced by a copy of p0
    assert {key[0] for key in _trained_rows(trained)} == {0}


def test_gae_refuses_step_wise_rows(tiny_model_dir: Path) -> None:
    trainer, _ = _trainer(tiny_model_dir, set(), advantage_estimator="gae")
    trainer.generator = StepWiseRewards(SPLIT)
    with pytest.raises(ValueError, match="outcome estimator"):
        asyncio.run(trainer.train_step(_prompts("p0", "p1")))


def test_evaluation_scores_each_trajectory_once(tiny_model_dir: Path) -> None:
    trainer, _ = _trainer(tiny_model_dir, set(), eval_n_samples_per_prompt=2)
    trainer.generator = StepWiseRewards(SPLIT)
    metrics = asyncio.run(trainer.evaluate(_prompts("p0", "p1")))
    assert metrics["eval/all/reward_mean"] == 0.5
    assert metrics["eval/None/reward_mean"] == 0.5  # the prompts carry no data_source
