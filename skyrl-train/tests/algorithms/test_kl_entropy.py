from __future__ import annotations

import math

import pytest
import torch

from skyrl_train.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    approx_kl,
    entropy_bonus,
    entropy_from_logits,
    kl_loss,
    make_kl_controller,
)

LOG_2 = math.log(2)


def test_kl_estimators_by_hand() -> None:
    # π = 0.5, π_ref = 0.25: log π − log π_ref = log 2, ρ = π_ref/π = 0.5
    log_probs, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert approx_kl(log_probs, ref, "k1").item() == pytest.approx(LOG_2)
    assert approx_kl(log_probs, ref, "k2").item() == pytest.approx(0.5 * LOG_2**2)
    assert approx_kl(log_probs, ref, "k3").item() == pytest.approx(0.5 - 1 + LOG_2)
    assert approx_kl(log_probs, ref, "abs").item() == pytest.approx(LOG_2)
    assert approx_kl(ref, log_probs, "k1").item() == pytest.approx(-LOG_2)  # k1 can be negative
    assert approx_kl(ref, log_probs, "abs").item() == pytest.approx(LOG_2)


def test_k3_is_clamped() -> None:
    log_probs, ref = torch.tensor([[0.0, -100.0]]), torch.tensor([[-100.0, 0.0]])
    # log ρ = −100 → clamped to −20: e^−20 + 19 ≈ 19 → 10; log ρ = 100 → 20: e^20 − 21 → 10
    assert approx_kl(log_probs, ref, "k3").tolist() == [[10.0, 10.0]]
    assert approx_kl(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), "k3").item() == pytest.approx(
        math.exp(-0.5) - 1 + 0.5
    )


def test_unknown_kl_estimator() -> None:
    with pytest.raises(ValueError, match="available: k1, k2, k3, abs"):
        approx_kl(torch.zeros(1, 1), torch.zeros(1, 1), "k4")  # type: ignore[arg-type]


def test_kl_loss_averages_per_sequence_and_has_gradients() -> None:
    log_probs = torch.tensor([[math.log(0.5), math.log(0.5)], [math.log(0.25), 0.0]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)], [math.log(0.5), 5.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, metrics = kl_loss(log_probs, ref, mask, "k1")
    # row 0: (log 2 + 0)/2; row 1: −log 2 (the masked token's KL of 5 is ignored)
    assert loss.item() == pytest.approx((LOG_2 / 2 - LOG_2) / 2)
    assert metrics["kl"] == pytest.approx((LOG_2 + 0 - LOG_2) / 3)
    loss.backward()
    assert log_probs.grad is not None
    torch.testing.assert_close(log_probs.grad, torch.tensor([[0.25, 0.25], [0.5, 0.0]]))


def test_kl_penalty_in_reward() -> None:
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    log_probs = torch.tensor([[math.log(0.5), math.log(0.5), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    shaped, metrics = apply_kl_penalty(rewards, log_probs, ref, mask, kl_coef=0.1, estimator="k1")
    assert shaped[0].tolist() == pytest.approx([-0.1 * LOG_2, 1.0, 0.0])
    assert metrics["kl"] == pytest.approx(LOG_2)


def test_fixed_controller_never_moves() -> None:
    controller = FixedKLController(0.05)
    controller.update(current_kl=10.0, n_steps=1000)
    assert controller.value == 0.05


def test_adaptive_controller_follows_the_proportional_rule() -> None:
    controller = AdaptiveKLController(0.1, kl_target=0.1, horizon=10000)
    controller.update(current_kl=0.2, n_steps=1000)  # error clip(2 − 1) = 0.2 → ×(1 + 0.2·0.1)
    assert controller.value == pytest.approx(0.102)
    controller.update(current_kl=0.09, n_steps=1000)  # error −0.1 → ×(1 − 0.01)
    assert controller.value == pytest.approx(0.102 * 0.99)
    controller.update(current_kl=0.0, n_steps=1000)  # error −1 clipped to −0.2 → ×0.98
    assert controller.value == pytest.approx(0.102 * 0.99 * 0.98)


def test_make_kl_controller() -> None:
    assert isinstance(make_kl_controller("fixed", 0.01), FixedKLController)
    adaptive = make_kl_controller("adaptive", 0.01, kl_target=0.2, horizon=500)
    assert adaptive == AdaptiveKLController(0.01, 0.2, 500)
    with pytest.raises(ValueError, match="fixed, adaptive"):
        make_kl_controller("pid", 0.01)  # type: ignore[arg-type]


def test_entropy_by_hand() -> None:
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3)]])
    # uniform over two: log 2; probabilities (1/4, 3/4): −(¼ log ¼ + ¾ log ¾)
    expected = [LOG_2, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    assert entropy_from_logits(logits).tolist() == pytest.approx(expected)


def test_chunked_entropy_matches_categorical_in_value_and_gradient() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=generator, dtype=torch.float64).requires_grad_()
    chunked = entropy_from_logits(logits, chunk_size=3)
    reference = torch.distributions.Categorical(logits=logits).entropy()
    assert chunked.shape == (2, 5)
    torch.testing.assert_close(chunked.double(), reference, atol=1e-5, rtol=0)
    (chunked_grad,) = torch.autograd.grad(chunked.sum(), logits)
    (reference_grad,) = torch.autograd.grad(reference.sum(), logits)
    torch.testing.assert_close(chunked_grad, reference_grad, atol=1e-5, rtol=0)


def test_entropy_bonus_is_minus_coef_times_mean_entropy() -> None:
    entropy = torch.tensor([[1.0, 3.0, 100.0]])
    bonus = entropy_bonus(entropy, torch.tensor([[1.0, 1.0, 0.0]]), entropy_coef=0.01)
    assert bonus.item() == pytest.approx(-0.01 * 2.0)
