"""The algorithm core of skyrl-train: pure tensor functions, no Ray, no I/O, no config tree.

- ``advantages``: GAE, GRPO (and Dr.GRPO), RLOO, REINFORCE++, MaxRL; registry ``get_advantage_estimator``.
- ``policy_losses``: PPO clip (clip-higher), dual clip, GSPO, CISPO, SAPO, Clip-Cov, KL-Cov, cross-entropy;
  registry ``get_policy_loss``.
- ``reductions``: the one place a per-token loss becomes a scalar (``loss_weights``, ``reduce_loss``).
- ``off_policy``: truncated importance sampling and sequence masks against the engine's logprobs.
- ``kl``, ``entropy``, ``value_loss``: KL estimators and controllers, the entropy bonus, the critic loss and
  its explained variance.
- ``filtering``: DAPO dynamic sampling and overlong filtering.

See docs/train/algorithms.md for the formulas and defaults.
"""

from skyrl_train.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    AdvantageEstimator,
    broadcast_from_last_steps,
    estimate_advantages,
    fold_into_last_steps,
    gae_advantages,
    get_advantage_estimator,
    grpo_advantages,
    list_advantage_estimators,
    maxrl_advantages,
    register_advantage_estimator,
    reinforce_plus_plus_advantages,
    rloo_advantages,
)
from skyrl_train.algorithms.entropy import entropy_bonus, entropy_from_logits
from skyrl_train.algorithms.filtering import (
    DynamicSamplingResult,
    DynamicSamplingType,
    apply_overlong_filtering,
    filter_groups,
    mask_zero_variance_groups,
    replace_groups,
    truncated_rows,
    zero_reward_on_non_stop,
    zero_variance_rows,
)
from skyrl_train.algorithms.groups import group_index_from_uids, group_stats
from skyrl_train.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    approx_kl,
    kl_loss,
    make_kl_controller,
)
from skyrl_train.algorithms.off_policy import OffPolicyCorrectionConfig, apply_off_policy_correction
from skyrl_train.algorithms.policy_losses import (
    POLICY_LOSSES,
    CISPOConfig,
    ClipCovConfig,
    KLCovConfig,
    PolicyLoss,
    PolicyLossConfig,
    SAPOConfig,
    cispo_loss,
    clip_cov_loss,
    cross_entropy_loss,
    dual_clip_loss,
    get_policy_loss,
    gspo_loss,
    kl_cov_loss,
    list_policy_losses,
    ppo_clip_loss,
    register_policy_loss,
    sapo_loss,
)
from skyrl_train.algorithms.reductions import (
    LOSS_REDUCTIONS,
    LossMetrics,
    LossReduction,
    loss_weights,
    masked_mean,
    masked_whiten,
    reduce_loss,
)
from skyrl_train.algorithms.registry import DuplicateNameError, Registry, UnknownNameError
from skyrl_train.algorithms.value_loss import explained_variance, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "LOSS_REDUCTIONS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageConfig",
    "AdvantageEstimator",
    "CISPOConfig",
    "ClipCovConfig",
    "DuplicateNameError",
    "DynamicSamplingResult",
    "DynamicSamplingType",
    "FixedKLController",
    "KLController",
    "KLCovConfig",
    "LossMetrics",
    "LossReduction",
    "OffPolicyCorrectionConfig",
    "PolicyLoss",
    "PolicyLossConfig",
    "Registry",
    "SAPOConfig",
    "UnknownNameError",
    "apply_kl_penalty",
    "apply_off_policy_correction",
    "apply_overlong_filtering",
    "approx_kl",
    "broadcast_from_last_steps",
    "cispo_loss",
    "clip_cov_loss",
    "cross_entropy_loss",
    "dual_clip_loss",
    "entropy_bonus",
    "entropy_from_logits",
    "estimate_advantages",
    "explained_variance",
    "filter_groups",
    "fold_into_last_steps",
    "gae_advantages",
    "get_advantage_estimator",
    "get_policy_loss",
    "group_index_from_uids",
    "group_stats",
    "grpo_advantages",
    "gspo_loss",
    "kl_cov_loss",
    "kl_loss",
    "list_advantage_estimators",
    "list_policy_losses",
    "loss_weights",
    "make_kl_controller",
    "mask_zero_variance_groups",
    "masked_mean",
    "masked_whiten",
    "maxrl_advantages",
    "ppo_clip_loss",
    "reduce_loss",
    "register_advantage_estimator",
    "register_policy_loss",
    "reinforce_plus_plus_advantages",
    "replace_groups",
    "rloo_advantages",
    "sapo_loss",
    "truncated_rows",
    "value_loss",
    "zero_reward_on_non_stop",
    "zero_variance_rows",
]
