from __future__ import annotations

import torch

from skyrl_train.algorithms import (
    apply_overlong_filtering,
    filter_groups,
    mask_zero_variance_groups,
    replace_groups,
    truncated_rows,
    zero_reward_on_non_stop,
    zero_variance_rows,
)

# group 5: all 1 (no signal); group 3: 0 and 1; group 8: equal within the tolerance; group 1: 1 and 0
SCORES = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5 + 1e-8, 1.0, 0.0], dtype=torch.float64)
GROUPS = torch.tensor([5, 5, 3, 3, 8, 8, 1, 1])


def test_zero_variance_rows_uses_the_tolerance() -> None:
    assert zero_variance_rows(SCORES, GROUPS).tolist() == [True, True, False, False, True, True, False, False]
    assert zero_variance_rows(SCORES, GROUPS, tol=1e-12).tolist()[4:6] == [False, False]


def test_mask_zero_variance_groups_keeps_the_batch_shape() -> None:
    masked = mask_zero_variance_groups(torch.ones(8, 2), SCORES, GROUPS)
    assert masked[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def test_filter_keeps_informative_groups_in_order_and_reports_the_shortfall() -> None:
    result = filter_groups(SCORES, GROUPS, target_num_groups=1)
    assert result.row_index.tolist() == [2, 3]
    assert result.group_index.tolist() == [0, 0]
    assert result.num_groups_needed == 0
    result = filter_groups(SCORES, GROUPS, target_num_groups=4)
    assert result.row_index.tolist() == [2, 3, 6, 7]
    assert result.group_index.tolist() == [0, 0, 1, 1]
    assert result.num_groups_needed == 2


def test_replace_swaps_zero_variance_groups_for_informative_ones() -> None:
    result = replace_groups(SCORES, GROUPS, min_replace_ratio=0.5, generator=torch.Generator().manual_seed(0))
    assert result.num_groups_needed == 0
    rows = result.row_index.tolist()
    assert rows[2:4] == [2, 3]
    assert rows[6:8] == [6, 7]
    assert {tuple(rows[0:2]), tuple(rows[4:6])} <= {(2, 3), (6, 7)}  # replacements come from informative groups
    assert result.group_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # duplicates get their own ids


def test_replace_asks_for_more_groups_below_the_minimum_ratio() -> None:
    result = replace_groups(SCORES, GROUPS, min_replace_ratio=0.75)  # needs ceil(0.75·4) = 3, has 2
    assert result.row_index.tolist() == [2, 3, 6, 7]
    assert result.num_groups_needed == 1


def test_overlong_filtering_masks_truncated_responses() -> None:
    truncated = truncated_rows(["stop", "length", None])
    assert truncated.tolist() == [False, True, False]
    assert apply_overlong_filtering(torch.ones(3, 2), truncated).tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]


def test_zero_reward_on_non_stop() -> None:
    rewards = torch.tensor([[0.0, 1.0], [0.0, 1.0], [2.0, 0.0]])
    zeroed = zero_reward_on_non_stop(rewards, ["stop", "length", "stop"])
    assert zeroed.tolist() == [[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]]
