from __future__ import annotations

import pytest
import torch

from skyrl_train.algorithms import value_loss


def test_clipped_value_loss_by_hand() -> None:
    values = torch.tensor([[1.5, 0.0, 7.0]], requires_grad=True)
    old_values = torch.tensor([[1.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = value_loss(values, old_values, returns, mask, value_clip=0.2)
    # token 0: (1.5 − 2)² = 0.25 vs clipped V = 1.2: (1.2 − 2)² = 0.64 → 0.64; token 1: (0 − 1)² = 1
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    assert metrics["vf_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert values.grad is not None
    # the clipped term is constant in V (zero gradient); token 1: ½·2(V − R)/2 = −0.5; padding: 0
    assert values.grad.tolist() == [[0.0, -0.5, 0.0]]


def test_unclipped_value_loss() -> None:
    values = torch.tensor([[1.5, 0.0]])
    loss, metrics = value_loss(values, torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 1.0]]), torch.ones(1, 2), None)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 1.0) / 2)
    assert metrics["vf_clip_frac"] == 0.0
