from __future__ import annotations

import math
import warnings

import pytest
import torch

from skyrl_train.algorithms import (
    CISPOConfig,
    KLCovConfig,
    OffPolicyCorrectionConfig,
    PolicyLossConfig,
    cispo_loss,
    clip_cov_loss,
    cross_entropy_loss,
    dual_clip_loss,
    get_policy_loss,
    gspo_loss,
    kl_cov_loss,
    list_policy_losses,
    loss_weights,
    ppo_clip_loss,
    sapo_loss,
)

CONFIG = PolicyLossConfig()
SEQUENCE_MEAN = PolicyLossConfig(loss_reduction="sequence_mean")


def ratios(*values: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_probs`` (a leaf that records gradients) and ``old_log_probs`` giving these importance ratios."""
    old = torch.full((1, len(values)), math.log(0.1), dtype=torch.float64)
    new = (old + torch.tensor([[math.log(r) for r in values]], dtype=torch.float64)).requires_grad_()
    return new, old


def row(*values: float) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


def grad(loss: torch.Tensor, log_probs: torch.Tensor) -> list[float]:
    (gradient,) = torch.autograd.grad(loss, log_probs)
    return [float(g) for g in gradient[0]]


def test_builtin_losses_are_registered() -> None:
    assert list_policy_losses() == [
        "cispo",
        "clip_cov",
        "cross_entropy",
        "dual_clip",
        "gspo",
        "kl_cov",
        "regular",
        "sapo",
    ]
    assert get_policy_loss("regular") is ppo_clip_loss


def test_ppo_clip_matches_hand_computed_values_and_gradients() -> None:
    log_probs, old = ratios(1.5, 0.5, 1.1, 0.5)
    advantages, mask = row(1.0, 1.0, -1.0, -1.0), row(1.0, 1.0, 1.0, 1.0)
    loss, metrics = ppo_clip_loss(log_probs, old, advantages, mask, CONFIG)
    # −min(1.5·1, 1.2·1) = −1.2 (clipped); −min(0.5, 0.8) = −0.5
    # −min(−1.1, −1.1) = 1.1; −min(−0.5, −0.8) = 0.8 (clipped)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.1 + 0.8) / 4)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["ratio_min"] == pytest.approx(0.5)
    # dL/dlog π_t = −Â_t r_t / 4 where the unclipped term is active, 0 where the clip is active
    assert grad(loss, log_probs) == pytest.approx([0.0, -0.5 / 4, 1.1 / 4, 0.0])


def test_clip_higher_lets_positive_advantage_tokens_grow_further() -> None:
    log_probs, old = ratios(1.5)
    config = PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.28)
    loss, _ = ppo_clip_loss(log_probs, old, row(1.0), row(1.0), config)
    assert loss.item() == pytest.approx(-1.28)
    assert grad(loss, log_probs) == [0.0]
    log_probs, old = ratios(1.25)
    loss, _ = ppo_clip_loss(log_probs, old, row(1.0), row(1.0), config)
    assert grad(loss, log_probs) == pytest.approx([-1.25])  # inside [0.8, 1.28]: still learning


def test_dual_clip_bounds_the_loss_of_negative_advantages() -> None:
    log_probs, old = ratios(4.0, 2.0, 4.0)
    advantages = row(-1.0, -1.0, 1.0)
    loss, metrics = dual_clip_loss(log_probs, old, advantages, row(1.0, 1.0, 1.0), CONFIG)
    # r=4, Â=−1: PPO gives 4, capped at c·|Â| = 3; r=2, Â=−1: 2 < 3 stays; Â>0 is plain PPO: −1.2
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 3)
    assert grad(loss, log_probs) == pytest.approx([0.0, 2.0 / 3, 0.0])


def test_dual_clip_needs_c_above_one() -> None:
    log_probs, old = ratios(1.0)
    with pytest.raises(ValueError, match="clip_ratio_c > 1"):
        dual_clip_loss(log_probs, old, row(1.0), row(1.0), PolicyLossConfig(clip_ratio_c=1.0))


@pytest.mark.parametrize(
    "loss_fn", [ppo_clip_loss, dual_clip_loss, gspo_loss, cispo_loss, sapo_loss, clip_cov_loss, kl_cov_loss]
)
def test_padding_tokens_never_change_loss_or_gradient(loss_fn: object) -> None:
    assert callable(loss_fn)
    log_probs, old = ratios(1.1, 0.9)
    advantages, mask = row(1.0, -0.5), row(1.0, 1.0)
    expected, _ = loss_fn(log_probs, old, advantages, mask, SEQUENCE_MEAN)
    expected_grad = grad(expected, log_probs)
    # the padding token holds an absurd ratio (e^100) and advantage
    padded_new = torch.cat([log_probs.detach(), row(50.0)], dim=1).requires_grad_()
    padded_old = torch.cat([old, row(-50.0)], dim=1)
    padded, _ = loss_fn(padded_new, padded_old, row(1.0, -0.5, 1e6), row(1.0, 1.0, 0.0), SEQUENCE_MEAN)
    assert padded.item() == pytest.approx(expected.item())
    assert grad(padded, padded_new) == pytest.approx([*expected_grad, 0.0])


def test_gspo_uses_the_length_normalised_sequence_ratio_on_every_token() -> None:
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    log_probs = (old + row(0.2, -0.1)).requires_grad_()
    loss, metrics = gspo_loss(log_probs, old, row(1.0, 1.0), row(1.0, 1.0), SEQUENCE_MEAN)
    s = math.exp((0.2 - 0.1) / 2)  # 1.0513, inside [0.8, 1.2]
    assert loss.item() == pytest.approx(-s)
    assert metrics["sequence_ratio_mean"] == pytest.approx(s)
    # every token gets the same weight s (token-level PPO would give e^0.2 and e^−0.1)
    assert grad(loss, log_probs) == pytest.approx([-s / 2, -s / 2])


def test_gspo_clips_whole_sequences() -> None:
    old = torch.zeros(1, 2, dtype=torch.float64)
    log_probs = (old + row(0.5, 0.5)).requires_grad_()
    loss, metrics = gspo_loss(log_probs, old, row(1.0, 1.0), row(1.0, 1.0), SEQUENCE_MEAN)
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["clip_frac"] == 1.0
    assert grad(loss, log_probs) == [0.0, 0.0]


def test_gspo_warns_without_sequence_mean() -> None:
    log_probs, old = ratios(1.0)
    with pytest.warns(UserWarning, match="sequence_mean"):
        gspo_loss(log_probs, old, row(1.0), row(1.0), CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gspo_loss(log_probs, old, row(1.0), row(1.0), SEQUENCE_MEAN)


def test_cispo_clips_the_detached_weight_but_keeps_every_gradient() -> None:
    old = torch.log(row(0.1, 0.4))
    log_probs = torch.log(row(0.6, 0.2)).requires_grad_()  # ratios 6 and 0.5
    loss, metrics = cispo_loss(log_probs, old, row(1.0, -2.0), row(1.0, 1.0), CONFIG)
    # weights: clip(6, 0, 5) = 5 and 0.5; L_t = −w_t Â_t log π_t
    assert loss.item() == pytest.approx((-5 * 1.0 * math.log(0.6) - 0.5 * -2.0 * math.log(0.2)) / 2)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert grad(loss, log_probs) == pytest.approx([-5 * 1.0 / 2, -0.5 * -2.0 / 2])


def test_cispo_rollout_anchor_takes_the_ratio_against_engine_logprobs() -> None:
    old = torch.log(row(0.1))
    rollout = torch.log(row(0.3))
    log_probs = torch.log(row(0.6)).requires_grad_()
    config = PolicyLossConfig(
        cispo=CISPOConfig(cispo_anchor="rollout"),
        off_policy_correction=OffPolicyCorrectionConfig(tis_ratio_type="token"),
    )
    loss, metrics = cispo_loss(log_probs, old, row(1.0), row(1.0), config, rollout)
    assert loss.item() == pytest.approx(-2.0 * math.log(0.6))  # ratio 0.6/0.3 = 2, no TIS on top
    assert "off_policy/tis_weight_mean" not in metrics
    with pytest.raises(ValueError, match="rollout_log_probs"):
        cispo_loss(log_probs, old, row(1.0), row(1.0), config)


@pytest.mark.parametrize(
    "correction",
    [
        OffPolicyCorrectionConfig(sequence_mask_metric="geometric"),
        OffPolicyCorrectionConfig(outlier_token_is_threshold_low=0.5),
        OffPolicyCorrectionConfig(tis_ratio_type="token", sequence_mask_metric="product"),
    ],
)
def test_cispo_rollout_anchor_keeps_the_sequence_and_outlier_masks(correction: OffPolicyCorrectionConfig) -> None:
    """Row 0 matches its rollout; row 1's trainer log-prob is far below the engine's: the masks drop row 1."""
    old = torch.log(torch.tensor([[0.5], [0.1]], dtype=torch.float64))
    rollout = torch.log(torch.tensor([[0.5], [0.5]], dtype=torch.float64))
    log_probs = torch.log(torch.tensor([[0.5], [0.5]], dtype=torch.float64)).requires_grad_()
    advantages, mask = torch.ones(2, 1, dtype=torch.float64), torch.ones(2, 1, dtype=torch.float64)
    config = PolicyLossConfig(cispo=CISPOConfig(cispo_anchor="rollout"), off_policy_correction=correction)
    loss, metrics = cispo_loss(log_probs, old, advantages, mask, config, rollout)
    (gradient,) = torch.autograd.grad(loss, log_probs)
    assert float(gradient[1, 0]) == 0.0  # the drifted sequence is masked out
    assert float(gradient[0, 0]) == pytest.approx(-0.5)  # ratio 1 · advantage 1 / 2 tokens
    assert metrics["off_policy/seq_masked_frac"] == pytest.approx(0.5)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_sapo_gate_values_and_gradients() -> None:
    r = math.exp(0.3)
    log_probs, old = ratios(1.0, r)
    loss, _ = sapo_loss(log_probs, old, row(1.0, -1.0), row(1.0, 1.0), CONFIG)
    # Â>0, τ=1, r=1: f = σ(0)·4 = 2, L = −2.   Â<0, τ=1.05: f = σ(1.05(r−1))·4/1.05, L = +f
    x = 1.05 * (r - 1)
    assert loss.item() == pytest.approx((-2.0 + sigmoid(x) * 4 / 1.05) / 2)
    # at r=1 the gate's slope is exactly the policy gradient: −Â·r = −1 (halved by the token mean)
    assert grad(loss, log_probs) == pytest.approx([-1.0 / 2, 4 * sigmoid(x) * (1 - sigmoid(x)) * r / 2])


# Four tokens with ratio 1: log π centred is (1, −1, 0, 0) and Â centred is (3, −6, 1, 2), so Cov = (3, 6, 0, 0).
COV_LOG_PROBS = (0.0, -2.0, -1.0, -1.0)
COV_ADVANTAGES = (3.0, -6.0, 1.0, 2.0)


def test_clip_cov_removes_candidate_tokens_from_the_loss() -> None:
    log_probs = row(*COV_LOG_PROBS).requires_grad_()
    loss, metrics = clip_cov_loss(log_probs, log_probs.detach(), row(*COV_ADVANTAGES), torch.ones(1, 4), CONFIG)
    # only token 0 has Cov in [1, 5] (token 1 has 6); max(int(2e-4·4), 1) = 1 token is detached
    assert loss.item() == pytest.approx((0.0 + 6.0 - 1.0 - 2.0) / 4)
    assert metrics["clip_cov_frac"] == pytest.approx(0.25)
    assert grad(loss, log_probs) == pytest.approx([0.0, 6.0 / 4, -1.0 / 4, -2.0 / 4])


def test_kl_cov_penalises_the_highest_covariance_tokens() -> None:
    log_ratio = (0.1, 0.2, 0.3, -0.4)
    log_probs = row(*COV_LOG_PROBS).requires_grad_()
    old = log_probs.detach() - row(*log_ratio)
    loss, metrics = kl_cov_loss(log_probs, old, row(*COV_ADVANTAGES), torch.ones(1, 4), CONFIG)
    policy_gradient = [-math.exp(lr) * a for lr, a in zip(log_ratio, COV_ADVANTAGES, strict=True)]
    # default 0.2 % of 4 tokens rounds to the minimum of one: token 1 (Cov 6) adds 1.0·|0.2|
    assert loss.item() == pytest.approx((sum(policy_gradient) + 0.2) / 4)
    assert metrics["kl_cov_frac"] == pytest.approx(0.25)
    wider = PolicyLossConfig(kl_cov=KLCovConfig(kl_cov_frac=50.0, ppo_kl_coef=2.0))
    loss, _ = kl_cov_loss(log_probs, old, row(*COV_ADVANTAGES), torch.ones(1, 4), wider)
    assert loss.item() == pytest.approx((sum(policy_gradient) + 2.0 * (0.2 + 0.1)) / 4)  # tokens 1 and 0


def test_cross_entropy_is_the_masked_negative_log_likelihood() -> None:
    log_probs = torch.log(row(0.5, 0.25, 0.01))
    loss, metrics = cross_entropy_loss(log_probs, log_probs, row(0.0, 0.0, 0.0), row(1.0, 1.0, 0.0), CONFIG)
    assert loss.item() == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert metrics["nll"] == pytest.approx(loss.item())


def test_losses_follow_the_configured_reduction() -> None:
    log_probs = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    # ratio 1 everywhere: L_t = −Â_t
    token_mean, _ = ppo_clip_loss(log_probs, log_probs, advantages, mask, CONFIG)
    assert token_mean.item() == pytest.approx(-5 / 4)
    sequence_mean, _ = ppo_clip_loss(log_probs, log_probs, advantages, mask, SEQUENCE_MEAN)
    assert sequence_mean.item() == pytest.approx(-(1 + 2) / 2)
    dr_grpo = PolicyLossConfig(loss_reduction="seq_mean_token_sum_norm", max_seq_len=10)
    token_sum, _ = ppo_clip_loss(log_probs, log_probs, advantages, mask, dr_grpo)
    assert token_sum.item() == pytest.approx(-(3 / 10 + 2 / 10) / 2)
    weights = loss_weights(mask, "prompt_mean", group_index=torch.tensor([0, 1]))
    prompt_mean, _ = ppo_clip_loss(log_probs, log_probs, advantages, mask, CONFIG, token_weights=weights)
    assert prompt_mean.item() == pytest.approx(-(1 + 2) / 2)


def test_token_tis_weights_the_loss_by_the_truncated_ratio() -> None:
    log_probs, old = ratios(1.0, 1.0)
    rollout = old - torch.log(row(3.0, 0.5))  # π_old/π_rollout = 3 (truncated to 2) and 0.5
    config = PolicyLossConfig(off_policy_correction=OffPolicyCorrectionConfig(tis_ratio_type="token"))
    loss, metrics = ppo_clip_loss(log_probs, old, row(1.0, 1.0), row(1.0, 1.0), config, rollout)
    assert loss.item() == pytest.approx((-2.0 - 0.5) / 2)
    assert metrics["off_policy/tis_clip_frac"] == pytest.approx(0.5)
    assert grad(loss, log_probs) == pytest.approx([-2.0 / 2, -0.5 / 2])


@pytest.mark.parametrize(
    "loss_fn", [ppo_clip_loss, dual_clip_loss, gspo_loss, cispo_loss, sapo_loss, clip_cov_loss, kl_cov_loss]
)
def test_a_huge_log_prob_mismatch_gives_a_finite_loss_and_gradient(loss_fn: object) -> None:
    # float32, as in training: an unclamped exp(100) overflows to inf and the step would be lost.
    assert callable(loss_fn)
    new = torch.tensor([[0.0, -0.1, -0.2]], requires_grad=True)
    old = torch.tensor([[-100.0, 100.0, -0.2]])
    loss, metrics = loss_fn(new, old, torch.tensor([[1.0, -1.0, 0.5]]), torch.ones(1, 3), CONFIG)
    assert math.isfinite(loss.item())
    (gradient,) = torch.autograd.grad(loss, new)
    assert bool(torch.isfinite(gradient).all())
    assert all(math.isfinite(value) for value in metrics.values())
