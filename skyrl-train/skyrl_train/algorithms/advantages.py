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

Failed trajectories. A row that failed (env error, engine error, timeout) carries no reward signal: its 0 reward
must not pull its group's baseline down. :func:`estimate_advantages` runs an estimator on the surviving rows only
and gives failed rows advantage and return 0, so every estimator sees a group reduced by failures as a smaller
group. The group-relative estimators (``grpo``, ``rloo``, ``maxrl``) give a group of fewer than two rows
advantage 0: one sample has nothing to be compared with (``zero_variance_rows`` calls such a group zero-variance,
for the same reason).
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
    (Liu et al., arXiv 2503.20783). A group whose rewards are all equal gets advantage 0, and so does a group of one
    row, which has no baseline (see "Failed trajectories" in the module docstring). Returns equal advantages.

    Shapes: ``[B, T]`` float rewards and 0/1 mask, ``[B]`` int64 ``group_index`` → two ``[B, T]`` float32.
    """
    scores, groups = _outcome_scores(token_level_rewards, group_index, "grpo")
    mean, std, count = group_stats(scores, groups)
    advantage = scores - mean  # exactly 0 for a group of one
    if config.grpo_norm_by_std:
        advantage = advantage / (std + config.epsilon)
    return _broadcast(torch.where(count < 2, torch.zeros_like(advantage), advantage), response_mask)


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
    ``Â_i = R_i − (Σ_j R_j − R_i) / (n − 1) = n/(n − 1) · (R_i − mean_g)``. A group of one row leaves nothing to
    build its baseline from: advantage 0 (see "Failed trajectories" in the module docstring). Returns equal
    advantages.

    Shapes: ``[B, T]`` float rewards and 0/1 mask, ``[B]`` int64 ``group_index`` → two ``[B, T]`` float32.
    """
    scores, groups = _outcome_scores(token_level_rewards, group_index, "rloo")
    mean, _, count = group_stats(scores, groups)
    advantage = count / (count - 1).clamp(min=1) * (scores - mean)  # exactly 0 for a group of one
    return _broadcast(advantage, response_mask)


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
    gets advantage 0, as does a group of one row. Returns equal advantages.

    Shapes: ``[B, T]`` float rewards and 0/1 mask, ``[B]`` int64 ``group_index`` → two ``[B, T]`` float32.
    """
    scores, groups = _outcome_scores(token_level_rewards, group_index, "maxrl")
    mean, _, _ = group_stats(scores, groups)
    return _broadcast((scores - mean) / (mean + config.epsilon), response_mask)


def estimate_advantages(
    estimator: AdvantageEstimator,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AdvantageConfig,
    *,
    group_index: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``estimator`` over the ``valid`` rows only (``[B]`` bool, default all); the other rows get 0 and 0.

    How the loop calls an estimator: failed trajectories (``valid`` False) then never enter a group's statistics or
    a batch whitening (see "Failed trajectories" in the module docstring). Shapes as the estimators'.
    """
    if valid is None or bool(valid.all()):
        return estimator(token_level_rewards, response_mask, config, group_index=group_index, values=values)
    rows = valid.to(token_level_rewards.device).nonzero().squeeze(-1)
    advantages = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    returns = torch.zeros_like(advantages)
    if rows.numel():
        live_advantages, live_returns = estimator(
            token_level_rewards[rows],
            response_mask[rows],
            config,
            group_index=None if group_index is None else group_index[rows.to(group_index.device)],
            values=None if values is None else values[rows.to(values.device)],
        )
        advantages[rows], returns[rows] = live_advantages.float(), live_returns.float()
    return advantages, returns


def broadcast_from_last_steps(
    token_values: torch.Tensor, response_mask: torch.Tensor, trajectory_end: torch.Tensor
) -> torch.Tensor:
    """Step-wise rows: each row takes its trajectory's last row's value, spread over its own trained tokens.

    The last row's value is its mean over its trained tokens (outcome estimators give every token of a row the
    same value). A last row with no trained token gives its trajectory 0.

    Shapes: ``[B, T]`` float values and 0/1 mask, ``[B]`` int64 ``trajectory_end`` (the row ending each row's
    trajectory, ``Experience.trajectory_end``) → ``[B, T]`` float32.
    """
    mask = response_mask.float()
    per_row = (token_values.float() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_row[trajectory_end.to(per_row.device)].unsqueeze(-1) * mask


def fold_into_last_steps(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, trajectory_end: torch.Tensor
) -> torch.Tensor:
    """Step-wise rows: every earlier row's rewards moved onto its trajectory's last row, at its last trained token.

    The last row's sum is then the trajectory's reward (per-step rewards and every row's KL penalty included), which
    is what an outcome estimator scores; the earlier rows are left with none.

    Shapes: ``[B, T]`` float rewards and 0/1 mask, ``[B]`` int64 ``trajectory_end`` → ``[B, T]`` float32.
    """
    rewards = token_level_rewards.float()
    end = trajectory_end.to(rewards.device)
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    earlier = rows != end
    folded = rewards.clone()
    folded[earlier] = 0.0
    positions = torch.arange(rewards.shape[1], device=rewards.device).expand_as(rewards)
    last_token = torch.where(response_mask.bool(), positions, -1).max(-1).values.clamp(min=0)
    moved = torch.zeros_like(rewards[:, 0]).index_add(0, end[earlier], rewards[earlier].sum(-1))
    folded[rows, last_token] += moved
    return folded


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
