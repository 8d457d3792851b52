from __future__ import annotations

import math

import pytest
import torch

from skyrl_train.algorithms import (
    AdvantageConfig,
    AdvantageEstimator,
    estimate_advantages,
    gae_advantages,
    get_advantage_estimator,
    group_index_from_uids,
    grpo_advantages,
    list_advantage_estimators,
    maxrl_advantages,
    reinforce_plus_plus_advantages,
    rloo_advantages,
)

CONFIG = AdvantageConfig()


def assert_values(actual: torch.Tensor, expected: list[list[float]], atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def outcome_rewards(scores: list[float], lengths: list[int], width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards on each row's last valid token, and the right-padded response mask."""
    rewards, mask = torch.zeros(len(scores), width), torch.zeros(len(scores), width)
    for row, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        mask[row, :length] = 1.0
        rewards[row, length - 1] = score
    return rewards, mask


def per_row(advantages: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The single advantage each row carries, after checking it is constant on valid tokens and 0 elsewhere."""
    values = []
    for row in range(advantages.shape[0]):
        valid = advantages[row][mask[row].bool()]
        assert torch.all(advantages[row][~mask[row].bool()] == 0)
        assert torch.allclose(valid, valid[0].expand_as(valid))
        values.append(valid[0].item())
    return values


def test_builtin_estimators_are_registered() -> None:
    assert list_advantage_estimators() == ["gae", "grpo", "maxrl", "reinforce++", "rloo"]
    assert get_advantage_estimator("grpo") is grpo_advantages
    assert get_advantage_estimator("reinforce++") is reinforce_plus_plus_advantages


def test_group_index_from_uids_numbers_groups_by_first_appearance() -> None:
    assert group_index_from_uids(["b", "a", "b", "c"]).tolist() == [0, 1, 0, 2]


def test_grpo_normalises_by_group_mean_and_unbiased_std() -> None:
    rewards, mask = outcome_rewards([1.0, 0.0, 1.0, 0.5, 0.5], [2, 3, 1, 4, 2])
    advantages, returns = grpo_advantages(rewards, mask, CONFIG, group_index=torch.tensor([0, 0, 0, 1, 1]))
    # group 0: mean 2/3, unbiased std sqrt(((1/3)² + (2/3)² + (1/3)²) / 2) = sqrt(1/3)
    std = math.sqrt(1 / 3) + 1e-6
    expected = [(1 / 3) / std, (-2 / 3) / std, (1 / 3) / std, 0.0, 0.0]
    assert per_row(advantages, mask) == pytest.approx(expected, rel=1e-5)
    assert torch.equal(advantages, returns)


def test_grpo_zero_std_group_gets_zero_advantage_not_nan() -> None:
    rewards, mask = outcome_rewards([1.0, 1.0, 1.0], [1, 2, 3])
    advantages, _ = grpo_advantages(rewards, mask, CONFIG, group_index=torch.tensor([4, 4, 4]))
    assert torch.all(advantages == 0)


def test_dr_grpo_only_subtracts_the_group_mean() -> None:
    rewards, mask = outcome_rewards([1.0, 0.0, 1.0, 0.5, 0.5], [2, 3, 1, 4, 2])
    config = AdvantageConfig(grpo_norm_by_std=False)
    advantages, _ = grpo_advantages(rewards, mask, config, group_index=torch.tensor([0, 0, 0, 1, 1]))
    assert per_row(advantages, mask) == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("estimator", [grpo_advantages, rloo_advantages, maxrl_advantages])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_group_estimators_give_a_group_of_one_no_advantage(estimator: AdvantageEstimator, norm_by_std: bool) -> None:
    """One sample has no baseline: every group-relative estimator gives it 0 (not its raw reward, not an error)."""
    rewards, mask = outcome_rewards([1.0, 0.0, 0.7], [1, 1, 2])
    config = AdvantageConfig(grpo_norm_by_std=norm_by_std)
    advantages, returns = estimator(rewards, mask, config, group_index=torch.tensor([0, 0, 9]))
    assert per_row(advantages, mask)[2] == 0.0
    assert per_row(advantages, mask)[0] != 0.0
    assert torch.equal(advantages, returns)


@pytest.mark.parametrize("name", ["grpo", "rloo", "maxrl", "reinforce++"])
def test_failed_rows_take_no_part_in_the_statistics(name: str) -> None:
    """A group reduced by failures is the smaller group: same advantages as if the failed rows never existed."""
    rewards, mask = outcome_rewards([1.0, 0.0, 0.0, 1.0, 0.0, 0.5], [2, 3, 1, 2, 2, 1])
    mask[2] = 0  # the failed rows' loss masks are zero, as the generator leaves them
    mask[4] = 0
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    valid = torch.tensor([True, True, False, True, False, True])
    estimator = get_advantage_estimator(name)
    advantages, returns = estimate_advantages(estimator, rewards, mask, CONFIG, group_index=groups, valid=valid)
    alone, alone_returns = estimator(rewards[valid], mask[valid], CONFIG, group_index=groups[valid])
    assert torch.equal(advantages[valid], alone)
    assert torch.equal(returns[valid], alone_returns)
    assert bool((advantages[~valid] == 0).all())
    assert bool((returns[~valid] == 0).all())


def test_a_group_left_with_one_row_by_failures_gets_no_advantage() -> None:
    rewards, mask = outcome_rewards([1.0, 0.0, 0.0, 1.0, 0.0], [1, 1, 1, 1, 1])
    valid = torch.tensor([True, False, False, True, True])
    advantages, _ = estimate_advantages(
        grpo_advantages, rewards, mask, CONFIG, group_index=torch.tensor([0, 0, 0, 1, 1]), valid=valid
    )
    spread = 0.5 / (math.sqrt(0.5) + 1e-6)  # group 1: rewards 1 and 0, mean 0.5, unbiased std sqrt(0.5)
    assert per_row(advantages, mask) == pytest.approx([0.0, 0.0, 0.0, spread, -spread])


def test_every_row_failing_gives_zeros() -> None:
    rewards, mask = outcome_rewards([0.0, 0.0], [1, 2])
    advantages, returns = estimate_advantages(
        grpo_advantages, rewards, mask, CONFIG, group_index=torch.tensor([0, 0]), valid=torch.tensor([False, False])
    )
    assert bool((advantages == 0).all())
    assert bool((returns == 0).all())


def test_outcome_estimators_need_group_index() -> None:
    rewards, mask = outcome_rewards([1.0], [1])
    with pytest.raises(ValueError, match="group_index"):
        grpo_advantages(rewards, mask, CONFIG)


def test_rloo_uses_the_mean_of_the_other_samples() -> None:
    rewards, mask = outcome_rewards([1.0, 0.0, 0.0, 1.0, 3.0, 1.0], [1, 2, 3, 4, 2, 2])
    advantages, _ = rloo_advantages(rewards, mask, CONFIG, group_index=torch.tensor([0, 0, 0, 0, 1, 1]))
    # row 0: 1 − (0 + 0 + 1)/3; row 1: 0 − (1 + 0 + 1)/3; row 4: 3 − 1; row 5: 1 − 3
    assert per_row(advantages, mask) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 2.0, -2.0], abs=1e-6)


def test_maxrl_divides_by_the_group_pass_rate() -> None:
    rewards, mask = outcome_rewards([1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1, 2, 3, 4, 1, 1])
    advantages, _ = maxrl_advantages(rewards, mask, CONFIG, group_index=torch.tensor([0, 0, 0, 0, 1, 1]))
    # group 0: pass rate 1/4 → (1 − 1/4)/(1/4) = 3 and (0 − 1/4)/(1/4) = −1; group 1 never succeeds → 0
    assert per_row(advantages, mask) == pytest.approx([3.0, -1.0, -1.0, -1.0, 0.0, 0.0], rel=1e-5)


def test_reinforce_plus_plus_discounts_then_whitens() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = reinforce_plus_plus_advantages(rewards, mask, AdvantageConfig(gamma=0.5))
    # G_t = r_t + 0.5 G_{t+1}; the reward 5 sits on padding and is ignored
    assert_values(returns, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])
    valid_returns = [0.25, 0.5, 1.0, 1.0, 2.0]
    mean = sum(valid_returns) / 5  # 0.95
    std = math.sqrt(sum((g - mean) ** 2 for g in valid_returns) / 4)  # sqrt(0.45)
    expected = [[(g - mean) / std for g in valid_returns[:3]], [(g - mean) / std for g in valid_returns[3:]] + [0.0]]
    assert_values(advantages, expected, atol=1e-5)


def test_reinforce_plus_plus_skips_observation_tokens() -> None:
    # the middle token is an environment observation: one discount step separates the two turns
    rewards, mask = torch.tensor([[0.0, 9.0, 1.0]]), torch.tensor([[1.0, 0.0, 1.0]])
    _, returns = reinforce_plus_plus_advantages(rewards, mask, AdvantageConfig(gamma=0.5))
    assert_values(returns, [[0.5, 0.0, 1.0]])


GAE_CONFIG = AdvantageConfig(gamma=0.9, lambd=0.8)
GAE_RAW = [0.16816, 0.428, 0.4]  # see test_gae_matches_hand_computed_recursion


def whiten(xs: list[float]) -> list[float]:
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return [(x - mean) / std for x in xs]


def test_gae_matches_hand_computed_recursion() -> None:
    rewards, values, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.4, 0.6]]), torch.ones(1, 3)
    advantages, returns = gae_advantages(rewards, mask, GAE_CONFIG, values=values)
    # t=2: δ = 1 − 0.6 = 0.4;                Â = 0.4
    # t=1: δ = 0.9·0.6 − 0.4 = 0.14;         Â = 0.14 + 0.72·0.4 = 0.428
    # t=0: δ = 0.9·0.4 − 0.5 = −0.14;        Â = −0.14 + 0.72·0.428 = 0.16816
    assert_values(returns, [[0.16816 + 0.5, 0.428 + 0.4, 0.4 + 0.6]], atol=1e-6)
    assert_values(advantages, [whiten(GAE_RAW)], atol=1e-5)


def test_gae_ignores_padding_and_observation_tokens() -> None:
    # same turn tokens as above, with an observation token in the middle and padding at the end holding junk
    rewards = torch.tensor([[0.0, 0.0, 7.0, 1.0, 3.0]])
    values = torch.tensor([[0.5, 0.4, -9.0, 0.6, 8.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0]])
    advantages, returns = gae_advantages(rewards, mask, GAE_CONFIG, values=values)
    expected = whiten(GAE_RAW)
    assert_values(advantages, [[expected[0], expected[1], 0.0, expected[2], 0.0]], atol=1e-5)
    assert_values(returns, [[0.66816, 0.828, 0.0, 1.0, 0.0]], atol=1e-6)


def test_gae_needs_values() -> None:
    with pytest.raises(ValueError, match="critic values"):
        gae_advantages(torch.zeros(1, 2), torch.ones(1, 2), CONFIG)
