"""``off_policy.max_token_staleness``: tokens sampled by a too-old policy leave the policy loss, with the trainer's
``tensors["token_staleness"]`` computed from each token's policy version."""

from __future__ import annotations

import pytest
import torch

from skyrl_train.algorithms.off_policy import OffPolicyCorrectionConfig
from skyrl_train.algorithms.policy_losses import PolicyLossConfig
from skyrl_train.backends.base import ModelOutput, TrainingBatch
from skyrl_train.config import ConfigError, load_config, validate
from skyrl_train.experience import POLICY_VERSIONS
from skyrl_train.objective import TOKEN_STALENESS, Objective, make_loss_fn
from skyrl_train.preparation import add_token_staleness


def _batch(versions: list[list[float]]) -> TrainingBatch:
    rows, width = len(versions), len(versions[0])
    mask = torch.tensor([[1.0 if v >= 0 else 0.0 for v in row] for row in versions])
    generator = torch.Generator().manual_seed(0)
    return TrainingBatch(
        input_ids=torch.zeros(rows, width + 2, dtype=torch.long),
        attention_mask=torch.ones(rows, width + 2, dtype=torch.long),
        response_mask=mask,
        tensors={
            POLICY_VERSIONS: torch.tensor(versions),
            "old_log_probs": -torch.rand(rows, width, generator=generator),
            "advantages": torch.randn(rows, width, generator=generator),
            "token_weights": mask / mask.sum(),
        },
    )


def _gradient(batch: TrainingBatch, limit: int | None) -> tuple[torch.Tensor, dict[str, float]]:
    correction = OffPolicyCorrectionConfig(max_token_staleness=limit)
    objective = Objective("regular", PolicyLossConfig(off_policy_correction=correction))
    log_probs = batch.tensors["old_log_probs"].clone().requires_grad_(True)
    loss, metrics = make_loss_fn(objective)(ModelOutput(log_probs=log_probs), batch)
    loss.backward()
    assert log_probs.grad is not None
    return log_probs.grad, metrics


def test_the_trainer_measures_each_tokens_staleness() -> None:
    batch = _batch([[3, 3, 1, -1], [2, 2, 2, 2]])  # -1: an observation token, no version
    metrics = add_token_staleness(batch, version=3)
    assert batch.tensors[TOKEN_STALENESS].tolist() == [[0, 0, 2, 0], [1, 1, 1, 1]]
    assert metrics == {"async/token_staleness": pytest.approx(6 / 7), "async/token_staleness_max": 2.0}


def test_tokens_staler_than_the_limit_get_no_gradient_and_keep_the_normaliser() -> None:
    batch = _batch([[3, 3, 1, 1], [2, 2, 2, 2]])
    add_token_staleness(batch, version=3)
    full, _ = _gradient(batch, None)
    kept, metrics = _gradient(batch, 1)
    stale = batch.tensors[TOKEN_STALENESS] > 1
    assert bool((kept[stale] == 0).all())
    assert bool((full[stale] != 0).all())
    # The fresh tokens' gradients are untouched: the normaliser did not shrink with the dropped tokens.
    torch.testing.assert_close(kept[~stale], full[~stale])
    assert metrics["policy/off_policy/stale_token_frac"] == pytest.approx(2 / 8)


def test_without_versions_the_limit_changes_nothing() -> None:
    batch = _batch([[0, 0], [0, 0]])  # no token_staleness: the trainer found no policy versions
    full, _ = _gradient(batch, None)
    limited, metrics = _gradient(batch, 0)
    torch.testing.assert_close(limited, full)
    assert "policy/off_policy/stale_token_frac" not in metrics


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["off_policy.max_token_staleness=1"], r"only trainer\.async_mode=fully_async records versions"),
        (
            ["trainer.async_mode=fully_async", "off_policy.max_token_staleness=-1"],
            r"off_policy\.max_token_staleness must be >= 0",
        ),
    ],
)
def test_bad_limits_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(load_config(None, overrides))
