from __future__ import annotations

import pytest
import torch

from skyrl_train.backends.base import TrainingBatch
from skyrl_train.batch import collate, concat_batches, pad_right


def test_prompts_left_padded_responses_right_padded() -> None:
    batch = collate(
        [[1, 2, 3], [4]],
        [[5], [6, 7, 8]],
        [[1], [1, 0, 1]],
        pad_token_id=0,
        per_token={"rewards": [[0.5], [0.0, 0.0, 1.0]]},
    )
    assert batch.input_ids.tolist() == [[1, 2, 3, 5, 0, 0], [0, 0, 4, 6, 7, 8]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    assert batch.tensors["rewards"].tolist() == [[0.5, 0.0, 0.0], [0.0, 0.0, 1.0]]
    assert batch.response_length == 3
    # Responses occupy the last T positions of every row.
    assert batch.input_ids[1, -3:].tolist() == [6, 7, 8]


def test_default_mask_and_empty_responses() -> None:
    batch = collate([[1], [2]], [[], [3, 4]], pad_token_id=9)
    assert batch.response_mask.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert batch.input_ids.tolist() == [[1, 9, 9], [2, 3, 4]]
    only_empty = collate([[1]], [[]], pad_token_id=0)
    assert only_empty.response_length == 1
    assert only_empty.response_mask.sum().item() == 0


def test_select_and_misaligned_inputs() -> None:
    batch = collate([[1], [2], [3]], [[4], [5], [6]], pad_token_id=0)
    assert batch.select(torch.tensor([2, 0])).input_ids.tolist() == [[3, 6], [1, 4]]
    with pytest.raises(ValueError, match="loss_masks\\[0\\] has 2 entries"):
        collate([[1]], [[2]], [[1, 1]], pad_token_id=0)
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        collate([[1], [2]], [[3]], pad_token_id=0)
    with pytest.raises(ValueError, match="at least one token"):
        collate([[]], [[3]], pad_token_id=0)
    with pytest.raises(ValueError, match="more than the width"):
        pad_right([[1.0, 2.0]], 1)


def test_concat_batches_matches_collating_all_rows_at_once() -> None:
    prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]
    responses = [[11], [12, 13, 14], [15, 16], []]
    masks = [[1], [1, 0, 1], [0, 1], []]
    rewards = [[0.5], [0.0, 0.0, 1.0], [0.0, 2.0], []]

    def part(rows: slice) -> TrainingBatch:
        return collate(
            prompts[rows], responses[rows], masks[rows], pad_token_id=0, per_token={"rewards": rewards[rows]}
        )

    joined = concat_batches([part(slice(0, 1)), part(slice(1, 3)), part(slice(3, 4))], pad_token_id=0)
    whole = part(slice(0, 4))
    assert joined.input_ids.tolist() == whole.input_ids.tolist()
    assert joined.attention_mask.tolist() == whole.attention_mask.tolist()
    assert joined.response_mask.tolist() == whole.response_mask.tolist()
    assert joined.tensors["rewards"].tolist() == whole.tensors["rewards"].tolist()


def test_concat_batches_rejects_different_tensors() -> None:
    a = collate([[1]], [[2]], pad_token_id=0, per_token={"rewards": [[1.0]]})
    b = collate([[1]], [[2]], pad_token_id=0)
    with pytest.raises(ValueError, match="different tensors"):
        concat_batches([a, b], pad_token_id=0)
    with pytest.raises(ValueError, match="at least one batch"):
        concat_batches([], pad_token_id=0)
