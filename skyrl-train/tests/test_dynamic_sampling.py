"""DAPO dynamic sampling over scripted batches: which groups a step trains on and how many batches it draws."""

from __future__ import annotations

import asyncio

import pytest
import torch

from skyrl_train.dynamic_sampling import (
    DynamicSamplingError,
    collect_informative_groups,
    count_informative_groups,
    replace_uninformative_groups,
)
from skyrl_train.experience import Experience, to_experience
from skyrl_train.generators.base import GeneratorOutput

N = 2  # samples per prompt


def _batch(groups: list[tuple[str, list[float]]], response_length: int = 2) -> Experience:
    """An experience with one group of ``N`` rows per ``(prompt uid, rewards)``."""
    uids = [uid for uid, rewards in groups for _ in rewards]
    rewards = [r for _, rs in groups for r in rs]
    ids = [f"{uid}:{i}" for uid, rs in groups for i in range(len(rs))]
    output = GeneratorOutput(
        prompt_token_ids=[[1, 2]] * len(uids),
        response_ids=[[3] * response_length] * len(uids),
        loss_masks=[[1] * response_length] * len(uids),
        rewards=[[0.0] * (response_length - 1) + [r] for r in rewards],
        rollout_logprobs=None,
        stop_reasons=["stop"] * len(uids),
        trajectory_ids=ids,
    )
    return to_experience(output, pad_token_id=0)


class Script:
    """``sample(attempt)`` returning scripted batches in order, recording the attempts it was asked for."""

    def __init__(self, *batches: Experience) -> None:
        self.batches = list(batches)
        self.attempts: list[int] = []

    async def __call__(self, attempt: int) -> Experience:
        self.attempts.append(attempt)
        return self.batches[attempt]


def _groups(experience: Experience) -> list[list[float]]:
    """Each group's rewards, groups in order."""
    rewards: dict[int, list[float]] = {}
    for group, reward in zip(experience.group_index.tolist(), experience.sequence_rewards.tolist(), strict=True):
        rewards.setdefault(group, []).append(reward)
    return list(rewards.values())


FLAT = [1.0, 1.0]
ZERO = [0.0, 0.0]


def test_filter_draws_batches_until_the_informative_groups_fill_the_step() -> None:
    script = Script(
        _batch([("a", FLAT), ("b", [0.0, 1.0]), ("c", ZERO)]),
        _batch([("d", ZERO), ("e", FLAT), ("f", FLAT)], response_length=5),
        _batch([("g", [1.0, 0.0]), ("h", [0.25, 0.5]), ("i", [0.5, 0.75])], response_length=3),
    )
    experience, metrics = asyncio.run(collect_informative_groups(script, 3, 10, pad_token_id=0))
    assert script.attempts == [0, 1, 2]
    # Only groups whose rewards vary, in sampling order; the surplus group "i" of the last batch is dropped.
    assert _groups(experience) == [[0.0, 1.0], [1.0, 0.0], [0.25, 0.5]]
    assert [t.split(":")[0] for t in experience.trajectory_ids] == ["b", "b", "g", "g", "h", "h"]
    assert experience.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert count_informative_groups(experience) == experience.num_groups == 3
    assert experience.batch.response_length == 3  # re-padded to the widest kept batch (the 5-token one kept none)
    assert metrics == {
        "dynamic_sampling/sample_batches": 3.0,
        "dynamic_sampling/groups_sampled": 9.0,
        "dynamic_sampling/groups_informative": 4.0,
        "dynamic_sampling/groups_kept": 3.0,
    }


def test_filter_stops_at_the_first_batch_when_it_is_enough() -> None:
    script = Script(_batch([("a", [0.0, 1.0]), ("b", [1.0, 0.0])]))
    experience, metrics = asyncio.run(collect_informative_groups(script, 2, 10, pad_token_id=0))
    assert script.attempts == [0]
    assert experience.num_groups == 2
    assert metrics["dynamic_sampling/sample_batches"] == 1.0


def test_filter_fails_after_max_sample_batches_naming_the_fixes() -> None:
    script = Script(_batch([("a", FLAT), ("b", [0.0, 1.0])]), _batch([("c", ZERO), ("d", FLAT)]))
    with pytest.raises(DynamicSamplingError, match="found 1 of the 2 groups") as info:
        asyncio.run(collect_informative_groups(script, 2, 2, pad_token_id=0))
    assert script.attempts == [0, 1]
    assert "algorithm.max_sample_batches" in str(info.value)
    assert "algorithm.dynamic_sampling=replace" in str(info.value)


def test_replace_copies_informative_groups_over_zero_variance_ones() -> None:
    script = Script(_batch([("a", FLAT), ("b", [0.0, 1.0]), ("c", ZERO), ("d", [0.5, 1.0])]))
    experience, metrics = asyncio.run(replace_uninformative_groups(script, 0.5, 10, torch.Generator().manual_seed(0)))
    assert script.attempts == [0]
    groups = _groups(experience)
    assert len(groups) == 4  # the batch keeps its number of groups and rows
    assert len(experience.group_index) == 8
    assert all(g in ([0.0, 1.0], [0.5, 1.0]) for g in groups)  # every group now has reward variance
    assert groups[1] == [0.0, 1.0]
    assert groups[3] == [0.5, 1.0]
    assert count_informative_groups(experience) == 4
    assert metrics["dynamic_sampling/groups_replaced"] == 2.0
    assert metrics["dynamic_sampling/groups_informative"] == 2.0


def test_replace_draws_a_fresh_batch_below_min_replace_ratio_then_fails() -> None:
    poor = _batch([("a", FLAT), ("b", ZERO), ("c", FLAT), ("d", [0.0, 1.0])])  # 1 of 4 informative
    good = _batch([("e", [0.0, 1.0]), ("f", ZERO)])  # 1 of 2
    script = Script(poor, good)
    experience, metrics = asyncio.run(replace_uninformative_groups(script, 0.5, 10, torch.Generator()))
    assert script.attempts == [0, 1]
    assert _groups(experience) == [[0.0, 1.0], [0.0, 1.0]]  # only the second batch's groups
    assert metrics["dynamic_sampling/sample_batches"] == 2.0
    assert metrics["dynamic_sampling/groups_replaced"] == 1.0

    with pytest.raises(DynamicSamplingError, match=r"algorithm\.min_replace_ratio=0\.5"):
        asyncio.run(replace_uninformative_groups(Script(poor, poor), 0.5, 2, torch.Generator()))
