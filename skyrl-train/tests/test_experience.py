from __future__ import annotations

import pytest
import torch

from skyrl_train.experience import concat_experiences, select_rows, to_experience
from skyrl_train.generators.base import GeneratorOutput


def _output(uids: list[str], rewards: list[float], response_length: int = 2) -> GeneratorOutput:
    """One single-turn row per uid (sample index = position among the uid's rows); the reward on the last token."""
    seen: dict[str, int] = {}
    ids = []
    for uid in uids:
        ids.append(f"{uid}:{seen.get(uid, 0)}")
        seen[uid] = seen.get(uid, 0) + 1
    return GeneratorOutput(
        prompt_token_ids=[[1, 2]] * len(uids),
        response_ids=[[3] * response_length] * len(uids),
        loss_masks=[[1] * response_length] * len(uids),
        rewards=[[0.0] * (response_length - 1) + [r] for r in rewards],
        rollout_logprobs=None,
        stop_reasons=["stop"] * len(uids),
        trajectory_ids=ids,
    )


def test_select_rows_repeats_rows_and_takes_new_group_ids() -> None:
    experience = to_experience(_output(["a", "a", "b", "b"], [0.0, 1.0, 2.0, 3.0]), pad_token_id=0)
    picked = select_rows(experience, torch.tensor([2, 3, 2, 3]), torch.tensor([0, 0, 1, 1]))
    assert picked.sequence_rewards.tolist() == [2.0, 3.0, 2.0, 3.0]
    assert picked.group_index.tolist() == [0, 0, 1, 1]
    assert picked.trajectory_ids == ["b:0", "b:1", "b:0", "b:1"]
    assert picked.num_groups == 2
    with pytest.raises(ValueError, match="one shape"):
        select_rows(experience, torch.tensor([0, 1]), torch.tensor([0]))


def test_concat_keeps_groups_of_different_parts_apart() -> None:
    # The same prompt "a" sampled in two batches (e.g. an epoch boundary inside one step) stays two groups.
    first = to_experience(_output(["a", "a", "b", "b"], [0.0, 1.0, 0.0, 1.0], response_length=2), pad_token_id=0)
    second = to_experience(_output(["a", "a"], [1.0, 0.0], response_length=4), pad_token_id=0)
    joined = concat_experiences([first, second], pad_token_id=0)
    assert joined.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert joined.num_groups == 3
    assert joined.batch.response_length == 4
    assert joined.sequence_rewards.tolist() == [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert joined.trajectory_ids == ["a:0", "a:1", "b:0", "b:1", "a:0", "a:1"]


def test_failed_rows_stay_in_their_prompts_group_and_are_marked() -> None:
    output = _output(["a", "a", "a", "b", "b"], [1.0, 0.0, 0.0, 1.0, 0.0])
    output.stop_reasons = ["stop", "env_error", "stop", "timeout", "length"]
    experience = to_experience(output, pad_token_id=0)
    assert experience.group_index.tolist() == [0, 0, 0, 1, 1]  # mini-batches are made of whole prompts
    assert experience.failed.tolist() == [False, True, False, True, False]
    assert experience.num_groups == 2


def test_a_failed_row_without_a_prompt_gets_one_pad_token() -> None:
    """An env that fails before its prompt is rendered leaves no prompt tokens; the row still collates."""
    output = _output(["a", "a"], [1.0, 0.0])
    output.prompt_token_ids = [[1, 2], []]
    output.response_ids, output.loss_masks, output.rewards = [[3, 3], []], [[1, 1], []], [[0.0, 1.0], []]
    output.stop_reasons = ["stop", "env_error"]
    experience = to_experience(output, pad_token_id=0)
    assert experience.batch.input_ids.shape[0] == 2
    assert experience.batch.response_mask[1].sum() == 0
    output.stop_reasons = ["stop", "stop"]
    with pytest.raises(ValueError, match="at least one token"):  # a healthy row without a prompt is a bug
        to_experience(output, pad_token_id=0)


def test_missing_rollout_log_probs_are_absent_not_zeros() -> None:
    experience = to_experience(_output(["a", "a"], [1.0, 0.0]), pad_token_id=0)
    assert "rollout_log_probs" not in experience.batch.tensors
    output = _output(["a", "a"], [1.0, 0.0])
    output.rollout_logprobs = [[-0.5, -0.25], [-1.0, -2.0]]
    reported = to_experience(output, pad_token_id=0).batch.tensors["rollout_log_probs"]
    assert reported.tolist() == [[-0.5, -0.25], [-1.0, -2.0]]
