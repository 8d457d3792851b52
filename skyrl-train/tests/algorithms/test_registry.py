from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from skyrl_train.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageConfig,
    DuplicateNameError,
    PolicyLossConfig,
    Registry,
    UnknownNameError,
    get_advantage_estimator,
    get_policy_loss,
    list_advantage_estimators,
    list_policy_losses,
    masked_mean,
    reduce_loss,
    register_advantage_estimator,
    register_policy_loss,
)


@pytest.fixture
def cleanup() -> Iterator[list[tuple[Registry[Any], str]]]:
    registered: list[tuple[Registry[Any], str]] = []
    yield registered
    for registry, name in registered:
        registry.unregister(name)


def test_custom_policy_loss_via_decorator(cleanup: list[tuple[Registry[Any], str]]) -> None:
    @register_policy_loss("reinforce")
    def reinforce_loss(
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        config: PolicyLossConfig,
        rollout_log_probs: torch.Tensor | None = None,
        *,
        token_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        token_loss = -advantages * log_probs
        loss = reduce_loss(token_loss, loss_mask, config.loss_reduction, token_weights=token_weights)
        return loss, {"advantage_mean": masked_mean(advantages, loss_mask).item()}

    cleanup.append((POLICY_LOSSES, "reinforce"))
    assert "reinforce" in list_policy_losses()
    loss_fn = get_policy_loss("reinforce")
    log_probs = torch.log(torch.tensor([[0.5, 0.25]]))
    loss, metrics = loss_fn(log_probs, log_probs, torch.tensor([[1.0, 2.0]]), torch.ones(1, 2), PolicyLossConfig())
    assert loss.item() == pytest.approx((math.log(2) + 2 * math.log(4)) / 2)
    assert metrics == {"advantage_mean": 1.5}


def test_custom_advantage_estimator_via_decorator(cleanup: list[tuple[Registry[Any], str]]) -> None:
    @register_advantage_estimator("raw_reward")
    def raw_reward(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        config: AdvantageConfig,
        *,
        group_index: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        advantages = token_level_rewards.sum(-1, keepdim=True) * response_mask
        return advantages, advantages

    cleanup.append((ADVANTAGE_ESTIMATORS, "raw_reward"))
    assert "raw_reward" in list_advantage_estimators()
    advantages, _ = get_advantage_estimator("raw_reward")(
        torch.tensor([[0.0, 3.0]]), torch.tensor([[1.0, 1.0]]), AdvantageConfig()
    )
    assert advantages.tolist() == [[3.0, 3.0]]


def test_duplicate_registration_raises() -> None:
    with pytest.raises(DuplicateNameError, match="'grpo' is already registered"):
        register_advantage_estimator("grpo")(get_advantage_estimator("rloo"))
    assert get_advantage_estimator("grpo").__name__ == "grpo_advantages"


def test_unknown_name_lists_available_and_suggests_the_closest() -> None:
    with pytest.raises(
        UnknownNameError, match=r"unknown policy loss 'regulr'; available: cispo, .*Did you mean 'regular'"
    ):
        get_policy_loss("regulr")
    with pytest.raises(UnknownNameError, match="Did you mean 'reinforce\\+\\+'"):
        get_advantage_estimator("reinforce_pp")
    with pytest.raises(UnknownNameError) as info:
        get_advantage_estimator("zzz")
    assert "Did you mean" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_registry_is_a_plain_name_to_function_map() -> None:
    registry: Registry[Any] = Registry("widget")
    registry.register("a")(len)
    assert registry.names() == ["a"]
    assert registry.get("a") is len
    assert "a" in registry
    registry.unregister("a")
    assert "a" not in registry
    with pytest.raises(UnknownNameError, match="unknown widget 'a'"):
        registry.unregister("a")
