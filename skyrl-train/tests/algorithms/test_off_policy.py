from __future__ import annotations

import math

import pytest
import torch

from skyrl_train.algorithms import OffPolicyCorrectionConfig, apply_off_policy_correction
from skyrl_train.algorithms.off_policy import outlier_token_mask, sequence_mask, truncated_is_weights


def log_ratios(*rows: list[float]) -> torch.Tensor:
    """``old − rollout`` log ratios for the given per-token ratios ``π_old/π_rollout``."""
    return torch.tensor([[math.log(r) for r in ratios] for ratios in rows], dtype=torch.float64)


def test_token_tis_truncates_each_ratio_at_c() -> None:
    weights = truncated_is_weights(log_ratios([3.0, 0.5, 1.5]), torch.ones(1, 3), "token", clip_high=2.0)
    assert weights.tolist()[0] == pytest.approx([2.0, 0.5, 1.5])


def test_sequence_tis_uses_the_product_of_the_valid_ratios() -> None:
    log_ratio = log_ratios([2.0, 2.0, 2.0], [1.5, 1.0, 100.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    weights = truncated_is_weights(log_ratio, mask, "sequence", clip_high=5.0)
    # row 0: 2·2·2 = 8 → 5; row 1: 1.5·1 = 1.5 (the padding ratio 100 is ignored)
    assert weights[0].tolist() == pytest.approx([5.0] * 3)
    assert weights[1].tolist() == pytest.approx([1.5] * 3)


def test_geometric_mask_bounds_the_per_token_drift() -> None:
    log_ratio = torch.tensor([[0.005, 0.005], [0.02, 0.0], [-0.02, -0.02]])
    keep = sequence_mask(log_ratio, torch.ones(3, 2), "geometric", low=0.99, high=1.01)
    # geometric means e^0.005 = 1.005 (kept), e^0.01 = 1.01005 (out), e^−0.02 = 0.980 (out)
    assert keep.tolist() == [True, False, False]


def test_product_mask_bounds_the_sequence_ratio() -> None:
    log_ratio = log_ratios([1.5, 1.2], [1.5, 1.5], [0.4, 1.0])
    keep = sequence_mask(log_ratio, torch.ones(3, 2), "product", low=0.5, high=2.0)
    assert keep.tolist() == [True, False, False]  # 1.8, 2.25, 0.4


def test_outlier_token_mask_rejects_a_sequence_with_any_extreme_token() -> None:
    log_ratio = log_ratios([1.0, 50.0], [1.0, 1.0], [1.0, 1e-5])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    assert outlier_token_mask(log_ratio, mask, low=1e-4, high=10.0).tolist() == [False, True, True]


def test_apply_correction_multiplies_and_masks_the_per_token_loss() -> None:
    old = torch.zeros(2, 2, dtype=torch.float64)
    rollout = -log_ratios([3.0, 1.0], [1.5, 1.5])
    config = OffPolicyCorrectionConfig(tis_ratio_type="token", sequence_mask_metric="product", product_mask_high=2.5)
    loss, metrics = apply_off_policy_correction(torch.ones(2, 2), old, rollout, torch.ones(2, 2), config)
    # row 0: product 3 > 2.5 → masked; row 1: product 2.25 kept, with TIS weights (1.5, 1.5)
    assert loss.flatten().tolist() == pytest.approx([0.0, 0.0, 1.5, 1.5])
    assert metrics["off_policy/seq_masked_frac"] == pytest.approx(0.5)
    assert metrics["off_policy/is_ratio_mean"] == pytest.approx((3.0 + 1.0 + 1.5 + 1.5) / 4)
    assert metrics["off_policy/tis_clip_frac"] == pytest.approx(0.25)


def test_correction_is_off_by_default_and_needs_rollout_logprobs_when_on() -> None:
    loss = torch.ones(1, 2)
    unchanged, metrics = apply_off_policy_correction(
        loss, torch.zeros(1, 2), None, torch.ones(1, 2), OffPolicyCorrectionConfig()
    )
    assert unchanged is loss
    assert metrics == {}
    with pytest.raises(ValueError, match="rollout_log_probs"):
        apply_off_policy_correction(
            loss, torch.zeros(1, 2), None, torch.ones(1, 2), OffPolicyCorrectionConfig(tis_ratio_type="sequence")
        )
