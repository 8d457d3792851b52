from __future__ import annotations

import math

import pytest
import torch

from skyrl_train.algorithms import loss_weights, masked_mean, masked_whiten, reduce_loss

INF, NAN = math.inf, math.nan

# Row 0: two valid tokens (1, 2); row 1: one valid token (4); row 2: three valid tokens (3, 3, 6).
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
LOSS = torch.tensor([[1.0, 2.0, INF], [4.0, NAN, -INF], [3.0, 3.0, 6.0]])


def test_token_mean_counts_every_valid_token_once() -> None:
    assert reduce_loss(LOSS, MASK, "token_mean").item() == pytest.approx((1 + 2 + 4 + 3 + 3 + 6) / 6)


def test_sequence_mean_averages_per_sequence_first() -> None:
    expected = ((1 + 2) / 2 + 4 / 1 + (3 + 3 + 6) / 3) / 3
    assert reduce_loss(LOSS, MASK, "sequence_mean").item() == pytest.approx(expected)


def test_seq_mean_token_sum_norm_divides_by_constant_length() -> None:
    expected = ((1 + 2) / 5 + 4 / 5 + (3 + 3 + 6) / 5) / 3
    assert reduce_loss(LOSS, MASK, "seq_mean_token_sum_norm", max_seq_len=5).item() == pytest.approx(expected)


def test_seq_mean_token_sum_norm_counts_trajectories_not_their_step_wise_rows() -> None:
    # Rows 0 and 1 are two steps of one trajectory: two trajectories in all, however the first is split.
    from skyrl_train.algorithms.policy_losses import PolicyLossConfig
    from skyrl_train.backends.base import TrainingBatch
    from skyrl_train.objective import Objective, add_token_weights

    whole = reduce_loss(LOSS, MASK, "seq_mean_token_sum_norm", max_seq_len=5).item() * 3  # 3 one-row trajectories
    split = ((1 + 2 + 4) / 5 + (3 + 3 + 6) / 5) / 2
    ids = torch.zeros(3, 3, dtype=torch.long)
    batch = TrainingBatch(ids, torch.ones_like(ids), MASK.clone())
    objective = Objective("regular", PolicyLossConfig(loss_reduction="seq_mean_token_sum_norm", max_seq_len=5))
    add_token_weights(batch, torch.tensor([0, 0, 1]), objective, trajectory_index=torch.tensor([1, 1, 2]))
    assert reduce_loss(LOSS, MASK, token_weights=batch.tensors["token_weights"]).item() == pytest.approx(split)
    assert split * 2 == pytest.approx(whole)  # the same token sums: only the count of sequences differs


def test_prompt_mean_is_token_mean_per_group_then_mean_over_groups() -> None:
    weights = loss_weights(MASK, "prompt_mean", group_index=torch.tensor([7, 7, 3]))
    expected = ((1 + 2 + 4) / 3 + (3 + 3 + 6) / 3) / 2
    assert reduce_loss(LOSS, MASK, token_weights=weights).item() == pytest.approx(expected)


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean", "prompt_mean"])
def test_fully_masked_rows_do_not_change_the_result(reduction: str) -> None:
    padded_mask = torch.cat([MASK, torch.zeros(1, 3)])
    padded_loss = torch.cat([LOSS, torch.tensor([[100.0, 100.0, 100.0]])])
    plain = reduce_loss(LOSS, MASK, token_weights=loss_weights(MASK, reduction, group_index=torch.tensor([0, 0, 1])))
    padded_weights = loss_weights(padded_mask, reduction, group_index=torch.tensor([0, 0, 1, 2]))
    assert reduce_loss(padded_loss, padded_mask, token_weights=padded_weights).item() == pytest.approx(plain.item())


def test_mini_batch_weights_sliced_per_micro_batch_add_up_to_the_mini_batch_loss() -> None:
    weights = loss_weights(MASK, "token_mean")
    micro = [reduce_loss(LOSS[i : i + 1], MASK[i : i + 1], token_weights=weights[i : i + 1]) for i in range(3)]
    assert sum(m.item() for m in micro) == pytest.approx(reduce_loss(LOSS, MASK, "token_mean").item())


def test_gradient_never_reaches_masked_tokens() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    reduce_loss(loss, torch.tensor([[1.0, 0.0, 1.0]]), "token_mean").backward()
    assert loss.grad is not None
    assert loss.grad.tolist() == [[0.5, 0.0, 0.5]]


def test_reduction_errors_say_what_is_missing() -> None:
    with pytest.raises(ValueError, match="group_index"):
        loss_weights(MASK, "prompt_mean")
    with pytest.raises(ValueError, match="max_seq_len"):
        loss_weights(MASK, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="available: token_mean"):
        loss_weights(MASK, "token_sum")


def test_empty_mask_gives_zero_not_nan() -> None:
    zeros = torch.zeros(2, 3)
    for reduction in ("token_mean", "sequence_mean"):
        assert reduce_loss(torch.ones(2, 3), zeros, reduction).item() == 0.0


def test_masked_mean_and_whiten() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    # mean 2, unbiased variance ((−1)² + 0² + 1²) / 2 = 1
    assert masked_whiten(x, mask)[0, :3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    assert masked_whiten(x, mask, shift_mean=False)[0, :3].tolist() == pytest.approx([1.0, 2.0, 3.0], abs=1e-6)
