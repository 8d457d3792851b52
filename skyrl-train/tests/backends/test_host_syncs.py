"""``forward_backward`` reads nothing back to the host between micro-batches.

On a GPU each read of a device value (``.item()``, ``float(t)``, ``if t:`` …) waits for every kernel queued before
it, so a read inside the micro-batch loop leaves the GPU idle while the host queues the next micro-batch. These
tests count such reads on a CPU, where they are cheap but still visible, with the real policy and value losses.

A read counts when the code that made it (its innermost caller outside torch) is this project's. The model's own
reads are transformers' (its attention-mask construction checks masks on the host) and are not counted.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import skyrl_train
from skyrl_train.algorithms import OffPolicyCorrectionConfig, PolicyLossConfig
from skyrl_train.backends import ModelOutput, TrainingBatch
from skyrl_train.backends.config import BackendConfig
from skyrl_train.backends.critic import CriticBackend
from skyrl_train.backends.torch_backend import TorchBackend
from skyrl_train.objective import Objective, make_loss_fn, make_value_loss_fn

from .conftest import build_rl_batch

HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__")
TORCH_DIR = str(Path(torch.__file__).parent)
PROJECT_DIR = str(Path(skyrl_train.__file__).parent)
ROWS, MICRO_ROWS = 8, 2  # four micro-batches

CORRECTION = OffPolicyCorrectionConfig(tis_ratio_type="token", sequence_mask_metric="geometric", geo_mask_high=1.5)
OBJECTIVES = {
    "ppo": Objective("regular", PolicyLossConfig()),
    "kl-entropy-tis": Objective(
        "regular", PolicyLossConfig(off_policy_correction=CORRECTION), use_kl_loss=True, entropy_coef=0.01
    ),
    "dual-clip": Objective("dual_clip", PolicyLossConfig()),
    "gspo": Objective("gspo", PolicyLossConfig(loss_reduction="sequence_mean")),
    "sapo": Objective("sapo", PolicyLossConfig()),
    "cross-entropy": Objective("cross_entropy", PolicyLossConfig()),
}


class HostReads:
    """Records this project's reads of tensor values into Python while ``active``, as ``"read at file:line"``."""

    def __init__(self) -> None:
        self.active = False
        self.sites: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))

    def _counted(self, name: str, read: Callable[..., Any]) -> Callable[..., Any]:
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.active:
                callers = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith(TORCH_DIR)]
                if callers and callers[-1].filename.startswith(PROJECT_DIR):
                    self.sites.append(f"{name} at {callers[-1].filename}:{callers[-1].lineno}")
            return read(tensor, *args, **kwargs)

        return counted

    def watch_loop(self, monkeypatch: pytest.MonkeyPatch, micro_batches: int) -> None:
        """Be active from the first micro-batch's backward to the start of the last one's: the loop's steady state.

        Before the first backward (layouts, the first loss) and after the last one (the one read of the combined
        metrics) a read costs one wait per call, not one per micro-batch.
        """
        backward = torch.autograd.backward
        done = 0

        def watched_backward(*args: Any, **kwargs: Any) -> None:
            nonlocal done
            self.active = False
            backward(*args, **kwargs)
            done += 1
            self.active = done < micro_batches

        monkeypatch.setattr(torch.autograd, "backward", watched_backward)


def _run_watched(monkeypatch: pytest.MonkeyPatch, run: Callable[[], dict[str, float]]) -> tuple[list[str], Any]:
    reads = HostReads()
    reads.install(monkeypatch)
    reads.watch_loop(monkeypatch, ROWS // MICRO_ROWS)
    stats = run()
    monkeypatch.undo()
    return reads.sites, stats


def _config(model_dir: Path, **overrides: Any) -> BackendConfig:
    return BackendConfig(str(model_dir), micro_train_batch_size=MICRO_ROWS, gradient_checkpointing=False, **overrides)


def _rl_batch(objective: Objective) -> TrainingBatch:
    batch = build_rl_batch(ROWS, 0, objective)
    shape = batch.response_mask.shape
    generator = torch.Generator().manual_seed(1)
    batch.tensors["ref_log_probs"] = -2.0 + 0.1 * torch.randn(shape, generator=generator)
    batch.tensors["rollout_log_probs"] = batch.tensors["old_log_probs"] + 0.05 * torch.randn(shape, generator=generator)
    return batch


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_no_host_read_between_micro_batches(
    small_model_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str, packed: bool
) -> None:
    objective = OBJECTIVES[name]
    backend = TorchBackend(_config(small_model_dir, remove_padding=packed))
    batch = _rl_batch(objective)
    loss_fn = make_loss_fn(objective)
    sites, stats = _run_watched(
        monkeypatch, lambda: backend.forward_backward(batch, loss_fn, with_entropy=objective.needs_entropy)
    )
    assert sites == []
    assert "policy/pg_loss" in stats
    assert all(type(value) is float for value in stats.values()), stats


def test_no_host_read_between_critic_micro_batches(small_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    critic = CriticBackend(_config(small_model_dir))
    batch = build_rl_batch(ROWS, 0, OBJECTIVES["ppo"])
    batch.tensors["values"] = torch.zeros_like(batch.response_mask)
    batch.tensors["returns"] = torch.ones_like(batch.response_mask)
    sites, stats = _run_watched(monkeypatch, lambda: critic.forward_backward(batch, make_value_loss_fn(0.2)))
    assert sites == []
    assert set(stats) == {"critic/vf_clip_frac", "critic/values_mean", "loss"}
    assert all(type(value) is float for value in stats.values()), stats


def test_tensor_metrics_combine_as_float_ones(small_model_dir: Path) -> None:
    """The same metrics, given as 0-dim tensors or as floats, combine to the same floats."""
    objective = OBJECTIVES["kl-entropy-tis"]
    batch = _rl_batch(objective)
    loss_fn = make_loss_fn(objective)

    def as_floats(output: ModelOutput, micro: TrainingBatch) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = loss_fn(output, micro)
        return loss, {name: float(value) for name, value in metrics.items()}

    tensors = TorchBackend(_config(small_model_dir)).forward_backward(batch, loss_fn, with_entropy=True)
    floats = TorchBackend(_config(small_model_dir)).forward_backward(batch, as_floats, with_entropy=True)
    assert tensors == floats
