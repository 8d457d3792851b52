"""Advantage estimators: token-level rewards (+ critic values) → advantages and returns.

Every estimator has the same signature (``AdvantageEstimator``) and is registered by name; add your own with
``@register_advantage_estimator("name")``.

Shapes and dtypes shared by all estimators:

- ``token_level_rewards``: ``[B, T]`` float. A row's reward sits on the final token of each turn; outcome-only tasks
  put a single reward on the last response token.
- ``response_mask``: ``[B, T]`` 0/1; 1 marks a trained (generated) token. Padding and observation tokens are 0.
- ``group_index``: ``[B]`` int64 prompt-group id (``group_index_from_uids``); rows sampled from one prompt share it.
- ``values``: ``[B, T]`` float critic values (GAE only).
- Returned ``(advantages, returns)``: two ``[B, T]`` float tensors, zero wherever ``response_mask`` is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from skyrl_train.algorithms.groups import group_stats
from skyrl_train.algorithms.reductions import masked_whiten
from skyrl_train.algorithms.registry import Registry


@dataclass(frozen=True)
class AdvantageConfig:
    """Hyperparameters read by the built-in estimators (each reads only its own)."""

    gamma: float = 1.0  # discount per generated token (GAE, REINFORCE++)
    lambd: float = 1.0  # GAE λ: 1 = Monte-Carlo return minus value, 0 = one-step TD error
    grpo_norm_by_std: bool = True  # GRPO divides by the group std; False is Dr.GRPO
    epsilon: float = 1e-6  # keeps GRPO/MaxRL denominators away from zero


class AdvantageEstimator(Protocol):
    """The signature every advantage estimator has; see the module docstring for shapes."""

    def __call__(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        config: AdvantageConfig,
        *,
        group_index: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(advantages, returns)``, both ``[B, T]``."""
        ...


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")
register_advantage_estimator = ADVANTAGE_ESTIMATORS.register


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name`` (raises ``UnknownNameError`` listing the known names)."""
    return ADVANTAGE_ESTIMATORS.get(name)


def list_advantage_estimators() -> list[str]:
    """Names of all registered advantage estimators, sorted."""
    return ADVANTAGE_ESTIMATORS.names()


@register_advantage_estimator("gae")
def gae_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AdvantageConfig,
    *,
    group_index: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al., arXiv 1506.02438).

    ``δ_t = r_t + γ V_{t+1} − V_t``, ``Â_t = δ_t + γλ Â_{t+1}``, return ``R_t = Â_t + V_t``; advantages are then
    whitened over the valid tokens. Masked positions are skipped: the recursion links each valid token to the next
    valid one, so padding and observation tokens (and any reward placed on them) change nothing. ``V`` after the
    last valid token is 0 (the episode ended). ``group_index`` is unused.

    Shapes: ``[B, T]`` float rewards and values, ``[B, T]`` 0/1 mask → two ``[B, T]`` float32.

    Raises:
        ValueError: ``values`` is missing.
    """
    if values is None:
        raise ValueError("the 'gae' advantage estimator needs critic values; configure a critic or use 'grpo'")
    rewards, values, mask = token_level_rewards.float(), values.detach().float(), response_mask.bool()
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + config.gamma * next_value - values[:, t]
        advantage = delta + config.gamma * config.lambd * next_advantage
        # a masked token passes the next valid token's value and advantage through unchanged
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        next_advantage = torch.where(mask[:, t], advantage, next_advantage)
        advantages[:, t] = advantage
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask) * mask, returns


@register_advantage_estimator("grpo")
def grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AdvantageConfig,
    *,
    group_index: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Relative Policy Optimization outcome advantage (DeepSeekMath, arXiv 2402.03300).

    Each row's score is its summed reward ``R_i``; ``Â_i = (R_i − mean_g) / (std_g + ε)`` with the unbiased std of
    its prompt group, broadcast to every valid token. ``grpo_norm_by_std=False`` gives Dr.GRPO's ``R_i − mean_g``
    (Liu et al., arXiv 2503.20783). A group whose rewards are all equal gets advantage 0. A group of one row has no
    baseline: its advantage is its raw reward (mean 0, std 1). Returns equal advantages.

    Shapes: ``[B, T]`` float rewards and 0/1 mask, ``[B]`` int64 ``group_index`` → two ``[B, T]`` float32.
    """
    scores, groups = _outcome_scores(token_level_rewards, group_index, "grpo")
    mean, std, count = group_stats(scores, groups)
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    advantage = scores - mean
    if config.grpo_norm_by_std:
        std = torch.where(single, torch.ones_like(std), std)
        advantage = advantage / (std + config.epsilon)
    return _broadcast(advantage, response_mask)


@register_advantage_estimator("rloo")
def rloo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AdvantageConfig,
    *,
    group_index: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Ahmadian et al., arXiv 2402.14740).

    The baseline of row ``i`` is the mean score of the *other* ``n − 1`` rows of its group:
    ``Â_i = R_i − (Σ_j R_j − R_i) / (n − 1) = n/(n − 1) · (R_i − mean_g)``. Returns equal advantages.

    Shapes: ``[B, T]`` float rewards and 0/1 mask, ``[B]`` int64 ``group_index`` → two ``[B, T]`` float32.

    Raises:
        ValueError: a group has a single row, which leaves nothing to build its baseline from.
    """
    scores, groups = _outcome_scores(token_level_rewards, group_index, "rloo")
    mean, _, count = group_stats(scores, groups)
    if bool((count < 2).any()):
        singles = sorted({int(g) for g in groups[(count < 2).to(groups.device)]})
        raise ValueError(
            f"'rloo' needs at least 2 samples per prompt; groups {singles} have 1. "
            "Sample more responses per prompt or use the 'grpo' estimator"
        )
    return _broadcast(count / (count - 1) * (scores - mean), response_mask)


@register_advantage_estimator("reinforce++")
def reinforce_plus_plus_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AdvantageConfig,
    *,
    group_index: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu, arXiv 2501.03262): discounted return-to-go, whitened over the whole batch.

    ``G_t = r_t + γ G_{t+1}`` over valid tokens (masked positions are skipped, as in GAE); the advantage is
    ``G`` z-scored over all valid tokens of the batch; the returns are ``G``. ``group_index`` is unused.

    Shapes: ``[B, T]`` float rewards and 0/1 mask → two ``[B, T]`` float32.
    """
    rewards, mask = token_level_rewards.float(), response_mask.bool()
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + config.gamma * running, running)
        returns[:, t] = running
    returns = returns * mask
    return masked_whiten(returns, mask) * mask, returns


@register_advantage_estimator("maxrl")
def maxrl_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AdvantageConfig,
    *,
    group_index: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Maximum Likelihood RL (Tajwar et al., arXiv 2602.02710): ``Â_i = (R_i − mean_g) / (mean_g + ε)``.

    With 0/1 rewards ``mean_g`` estimates the prompt's pass rate ``p``; dividing by it turns the gradient of ``p``
    into that of ``log p``, weighting hard prompts up. Meant for rewards in ``[0, 1]``. A group that never succeeds
    gets advantage 0. Returns equal advantages.

    Shapes: ``[B, T]`` float rewards and 0/1 mask, ``[B]`` int64 ``group_index`` → two ``[B, T]`` float32.
    """
    scores, groups = _outcome_scores(token_level_rewards, group_index, "maxrl")
    mean, _, _ = group_stats(scores, groups)
    return _broadcast((scores - mean) / (mean + config.epsilon), response_mask)


def _outcome_scores(
    token_level_rewards: torch.Tensor, group_index: torch.Tensor | None, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed reward ``[B]`` float32 (outcome estimators see one score per response) and its group."""
    if group_index is None:
        raise ValueError(f"the {name!r} advantage estimator needs group_index (the prompt group of each row)")
    return token_level_rewards.float().sum(-1), group_index


def _broadcast(advantage: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Spread a ``[B]`` sequence advantage over the valid tokens: ``([B, T], [B, T])`` advantages and returns."""
    token_advantages = advantage.unsqueeze(-1) * response_mask.float()
    return token_advantages, token_advantages.clone()
