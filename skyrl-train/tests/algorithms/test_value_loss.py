from __future__ import annotations

import pytest
import torch

from skyrl_train.algorithms import explained_variance, value_loss


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


def test_explained_variance_over_valid_tokens() -> None:
    returns = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the 9s are padding and must not count
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    mean_only = torch.full_like(returns, 2.5)
    assert explained_variance(mean_only, returns, mask) == pytest.approx(0.0)
    # residual 1 everywhere: Var[R − V] = 0, a constant offset is fully "explained"
    assert explained_variance(returns - 1, returns, mask) == pytest.approx(1.0)
    # V = R + (±1): Var[R] = 1.25, Var[R − V] = 1 → 1 − 1/1.25
    noisy = returns + torch.tensor([[1.0, -1.0, 0.0], [1.0, -1.0, 0.0]])
    assert explained_variance(noisy, returns, mask) == pytest.approx(1 - 1 / 1.25)


def test_explained_variance_is_zero_when_returns_do_not_vary() -> None:
    flat = torch.ones(2, 3)
    assert explained_variance(torch.zeros(2, 3), flat, torch.ones(2, 3)) == 0.0
    assert explained_variance(torch.zeros(2, 3), flat, torch.zeros(2, 3)) == 0.0
