from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.backends.base import TrainingBatch
from skyrl_train.backends.config import BackendConfig
from skyrl_train.backends.packing import model_inputs, row_costs, split_by_rows, split_by_tokens
from skyrl_train.backends.torch_backend import TorchBackend

# Two rows: prompt lengths 2 and 1 (left-padded to 3), responses 2 and 3 (right-padded to 3).
IDS = torch.tensor([[0, 11, 12, 13, 14, 0], [0, 0, 21, 22, 23, 24]])
MASK = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]])


def test_padded_layout_trims_common_left_padding_and_counts_positions() -> None:
    inputs = model_inputs(IDS, MASK, 3, packed=False)
    assert inputs.input_ids.tolist() == [[11, 12, 13, 14, 0], [0, 21, 22, 23, 24]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 3], [0, 0, 1, 2, 3]]
    assert inputs.valid.tolist() == [[True, True, False], [True, True, True]]
    assert inputs.targets().tolist() == [13, 14, 22, 23, 24]


def test_packed_layout_concatenates_real_tokens_with_restarting_positions() -> None:
    inputs = model_inputs(IDS, MASK, 3, packed=True)
    assert inputs.attention_mask is None
    assert inputs.input_ids.tolist() == [[11, 12, 13, 14, 21, 22, 23, 24]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert inputs.targets().tolist() == [13, 14, 22, 23, 24]
    assert inputs.model_kwargs()["use_cache"] is False
    keep, _, cols = inputs.logits_to_keep()
    assert isinstance(keep, torch.Tensor)
    assert keep.tolist() == [1, 2, 4, 5, 6]
    assert cols.tolist() == [0, 1, 2, 3, 4]


def test_scatter_fills_padding_with_zeros() -> None:
    inputs = model_inputs(IDS, MASK, 3, packed=True)
    grid = inputs.scatter(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert grid.tolist() == [[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]]


def test_a_response_without_prompt_has_no_first_prediction() -> None:
    inputs = model_inputs(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long), 3, packed=False)
    assert inputs.valid.tolist() == [[False, True, True]]
    keep, _, cols = inputs.logits_to_keep()
    assert keep == 3
    assert cols.tolist() == [0, 1]


def test_an_all_padding_micro_batch_still_runs_one_token() -> None:
    inputs = model_inputs(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long), 2, packed=True)
    assert inputs.input_ids.shape == (1, 1)
    assert inputs.rows.numel() == 0


def test_row_costs() -> None:
    assert row_costs(MASK, packed=True) == [4, 4]
    assert row_costs(MASK, packed=False) == [5, 4]  # span from the first real token to the end of the row


def test_split_by_rows() -> None:
    assert split_by_rows(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]


@pytest.mark.parametrize(
    ("costs", "budget", "packed", "expected"),
    [
        ([3, 3, 3, 3], 6, True, [(0, 2), (2, 4)]),
        ([3, 3, 3, 3], 7, True, [(0, 2), (2, 4)]),
        ([2, 5, 1, 1], 8, False, [(0, 1), (1, 2), (2, 4)]),  # padded: rows × longest
        ([9, 1, 1], 4, True, [(0, 1), (1, 3)]),  # a row over budget gets its own micro-batch
        ([], 4, True, []),
    ],
)
def test_split_by_tokens(costs: list[int], budget: int, packed: bool, expected: list[tuple[int, int]]) -> None:
    assert split_by_tokens(costs, budget, packed=packed) == [slice(a, b) for a, b in expected]


@pytest.mark.parametrize("packed", [False, True])
def test_rows_without_tokens_give_zeros(small_model_dir: Path, sft_loss: Any, packed: bool) -> None:
    ids = IDS.clone()
    mask = MASK.clone()
    mask[1] = 0
    batch = TrainingBatch(ids, mask, mask[:, 3:].float(), tensors={"token_weights": mask[:, 3:].float() / 2})
    config = BackendConfig(
        str(small_model_dir), micro_train_batch_size=1, micro_forward_batch_size=1, remove_padding=packed
    )
    b = TorchBackend(config)
    assert (b.forward(batch).log_probs[1] == 0).all()
    b.forward_backward(batch, sft_loss)  # the empty micro-batch back-propagates a zero graph
    grads = [p.grad for p in b.trainable_parameters() if p.grad is not None]
    assert all(torch.isfinite(g).all() for g in grads)
    assert b.optim_step()["skipped"] == 0.0
