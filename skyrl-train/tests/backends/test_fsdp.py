"""The FSDP2 worker group on a local Ray cluster (gloo on CPU) against the in-process backend on the same batches.

Two ranks must give what one process gives, to fp32 rounding: log-probs, the loss and its metrics, the gradient
norm, and the weights after the optimizer step; a sharded checkpoint must restore the state exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_train.algorithms import PolicyLossConfig
from skyrl_train.backends.base import TrainingBatch
from skyrl_train.backends.config import BackendConfig, LoraConfig, OptimizerConfig
from skyrl_train.backends.packing import even_out, row_costs, split_by_tokens
from skyrl_train.backends.torch_backend import TorchBackend
from skyrl_train.objective import Objective, make_loss_fn

from .conftest import build_rl_batch

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig, split_rows  # noqa: E402

pytestmark = pytest.mark.ray

OBJECTIVE = Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig(loss_reduction="sequence_mean"))
ATOL = 1e-5
# Adam divides by the root of the second moment: a gradient entry near zero turns a 1e-9 rounding difference into a
# visible share of a step. Weights match to 1 % of one step (lr 1e-2).
WEIGHT_ATOL = 1e-4


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _config(model_dir: Path, **overrides: object) -> BackendConfig:
    fields: dict[str, object] = {
        "gradient_checkpointing": False,
        "micro_train_batch_size": 2,
        "micro_forward_batch_size": 2,
        "optimizer": OptimizerConfig(lr=1e-2, max_grad_norm=1e-3, scheduler="constant"),
    }
    return BackendConfig(str(model_dir), **{**fields, **overrides})  # type: ignore[arg-type]


def _rl_batch(rows: int, seed: int) -> TrainingBatch:
    return build_rl_batch(rows, seed, OBJECTIVE)


def _weights(backend: TorchBackend | FSDPBackend) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu().clone() for name, tensor in backend.get_weights()}


def _assert_close(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], atol: float = WEIGHT_ATOL
) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, atol=atol, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_rows_split_into_near_equal_contiguous_shares() -> None:
    assert split_rows(5, 2) == [slice(0, 3), slice(3, 5)]
    assert split_rows(1, 2) == [slice(0, 1), slice(1, 1)]
    assert split_rows(6, 3) == [slice(0, 2), slice(2, 4), slice(4, 6)]


@pytest.mark.parametrize(
    ("rows", "micro_rows", "budget"),
    [
        (8, 2, -1),
        (5, 1, -1),  # rank 1's share is padded with a masked row
        (8, 1, 17),  # a token budget cuts the two shares into different numbers of micro-batches: evened out
        (5, 1, 9),  # ... and a rank whose rows run out runs a fully masked row
    ],
)
def test_two_ranks_train_as_one_process_does(
    cluster: None, small_model_dir: Path, rows: int, micro_rows: int, budget: int
) -> None:
    config = _config(small_model_dir, micro_train_batch_size=micro_rows, max_tokens_per_microbatch=budget)
    if budget > 0:  # the case is only worth its name if the shares really cut differently
        shares = [_rl_batch(rows, seed=0).select(s) for s in split_rows(rows, 2)]
        counts = {len(split_by_tokens(row_costs(s.attention_mask, packed=True), budget, packed=True)) for s in shares}
        assert len(counts) == 2, counts
    local = TorchBackend(config)
    group = FSDPBackend(config, WorkerGroupConfig(num_workers=2))
    try:
        _assert_close(_weights(group), _weights(local))
        loss_fn = make_loss_fn(OBJECTIVE)
        for step in range(2):
            batch = _rl_batch(rows, seed=step)
            torch.testing.assert_close(
                group.forward(batch).log_probs, local.forward(batch).log_probs, atol=ATOL, rtol=0
            )
            expected = local.forward_backward(batch, loss_fn)
            actual = group.forward_backward(batch, loss_fn)
            assert actual.keys() == expected.keys()
            # A micro-batch's extreme ratio is weighted by its tokens: it depends on the cut, which a token budget
            # makes differ between one process and two ranks. Everything else does not.
            layout_bound = {"policy/ratio_min", "policy/ratio_max"} if budget > 0 else set()
            for key, value in expected.items():
                if key not in layout_bound:
                    assert actual[key] == pytest.approx(value, abs=ATOL), key
            expected_step, actual_step = local.optim_step(), group.optim_step()
            assert actual_step["grad_norm"] == pytest.approx(expected_step["grad_norm"], rel=1e-5)
            assert expected_step["grad_norm"] > 1e-3  # clipping ran, over the global norm
            _assert_close(_weights(group), _weights(local))
        assert group.global_step == 2
    finally:
        group.close()


def test_a_sharded_checkpoint_restores_weights_optimizer_and_step(
    cluster: None, small_model_dir: Path, tmp_path: Path
) -> None:
    config = _config(small_model_dir)
    loss_fn = make_loss_fn(OBJECTIVE)
    group = FSDPBackend(config, WorkerGroupConfig(num_workers=2))
    try:
        group.forward_backward(_rl_batch(4, seed=0), loss_fn)
        group.optim_step()
        group.save(tmp_path / "ckpt")
        saved = _weights(group)
        group.forward_backward(_rl_batch(4, seed=1), loss_fn)
        group.optim_step()
        after_saved_step = _weights(group)
    finally:
        group.close()
    fresh = FSDPBackend(config, WorkerGroupConfig(num_workers=2))  # new processes: a fresh AdamW with no moments
    try:
        fresh.load(tmp_path / "ckpt")
        _assert_close(_weights(fresh), saved)
        assert fresh.global_step == 1
        fresh.forward_backward(_rl_batch(4, seed=1), loss_fn)
        fresh.optim_step()  # the same step again, from the restored optimizer moments: the same weights
        _assert_close(_weights(fresh), after_saved_step, atol=0.0)
        fresh.export_hf(tmp_path / "hf")
    finally:
        fresh.close()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    _assert_close({k: v for k, v in exported.state_dict().items() if k in after_saved_step}, after_saved_step)
    assert exported.config.architectures == ["Qwen2ForCausalLM"]


def test_what_workers_cannot_do_yet_is_refused_with_the_key(small_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"model\.lora_rank=0"):
        FSDPBackend(_config(small_model_dir, lora=LoraConfig(rank=4)), WorkerGroupConfig())


def test_even_out_matches_micro_batch_counts() -> None:
    assert even_out([slice(0, 4)], 3) == ([slice(0, 1), slice(1, 2), slice(2, 4)], 0)
    assert even_out([slice(0, 1), slice(1, 4)], 2) == ([slice(0, 1), slice(1, 4)], 0)
    assert even_out([slice(0, 1), slice(1, 2)], 4) == ([slice(0, 1), slice(1, 2)], 2)  # two masked rows to run
    assert even_out([], 1) == ([], 1)
