"""trainer.device: one key places every role; bad requests fail at start-up naming it. And the precision policy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from skyrl_train.backends.config import BackendConfig, OptimizerConfig
from skyrl_train.backends.precision import PrecisionPolicy
from skyrl_train.backends.torch_backend import TorchBackend
from skyrl_train.config import ConfigError, load_config, resolve, validate
from skyrl_train.devices import PeakMemory, device_metrics, require_device, resolve_device
from skyrl_train.wiring import components_of


@pytest.fixture(scope="module")
def model_dir(small_model_dir: Path) -> Path:
    """The backend tests' small model (``conftest.SMALL``)."""
    return small_model_dir


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process 'sees' a GPU: only resolution and wiring are exercised, nothing is moved to it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def _config(*overrides: str) -> Any:
    return resolve(load_config(None, ["model.path=m", *overrides]))


# --- resolution -------------------------------------------------------------------------------------------


def test_auto_is_the_gpu_when_there_is_one(a_gpu: None) -> None:
    assert resolve_device("auto") == "cuda"
    assert _config().trainer.device == "cuda"


def test_auto_is_the_cpu_without_one(no_gpu: None) -> None:
    assert resolve_device("auto") == "cpu"
    assert resolve_device("auto", gpus_reserved=True) == "cuda"  # Ray gives the actors GPUs this driver lacks
    assert _config().trainer.device == "cpu"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"trainer\.device must be one of"):
        resolve_device("tpu")


def test_fsdp_ranks_ask_ray_for_a_gpu_each_on_cuda(no_gpu: None) -> None:
    t = _config("trainer.backend=fsdp", "trainer.device=cuda").trainer
    assert (t.device, t.num_gpus_per_worker) == ("cuda", 1.0)
    t = _config("trainer.backend=fsdp", "trainer.num_gpus_per_worker=0.5").trainer  # auto follows the reservation
    assert (t.device, t.num_gpus_per_worker) == ("cuda", 0.5)
    t = _config("trainer.backend=fsdp").trainer
    assert (t.device, t.num_gpus_per_worker) == ("cpu", 0.0)


def test_every_role_gets_the_device(a_gpu: None) -> None:
    config = _config("algorithm.use_kl_loss=true", "model.critic_path=m", "inference.engine=local")
    parts = components_of(config, total_steps=1)
    assert parts.ref is not None
    assert parts.critic is not None
    assert {parts.policy.device, parts.ref.device, parts.critic.device} == {"cuda"}
    assert parts.engine.options["device"] == "cuda"
    # engine actors compute where Ray put them: on GPUs only when they ask for some
    actors = components_of(_config("inference.num_engines=2"), total_steps=1).engine
    assert actors.options["device"] == "cpu"
    actors = components_of(_config("inference.num_engines=2", "inference.num_gpus_per_engine=1"), total_steps=1)
    assert actors.engine.options["device"] == "cuda"


def test_cpu_is_honoured_on_a_gpu_machine(a_gpu: None) -> None:
    parts = components_of(_config("trainer.device=cpu"), total_steps=1)
    assert parts.policy.device == "cpu"
    assert parts.engine.options["device"] == "cpu"


# --- start-up errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.device=cuda"], "trainer.device=cuda but this process sees no GPU"),
        (["trainer.backend=fsdp", "trainer.device=cuda", "trainer.num_gpus_per_worker=0"], "num_gpus_per_worker=0"),
        (["trainer.backend=fsdp", "trainer.device=cpu", "trainer.num_gpus_per_worker=1"], "reserves GPUs"),
    ],
)
def test_gpu_requests_that_cannot_be_met_fail_validation(no_gpu: None, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(load_config(None, ["model.path=m", *overrides]))


def test_a_backend_on_a_gpu_it_cannot_see_names_the_key(no_gpu: None, model_dir: Path) -> None:
    with pytest.raises(RuntimeError, match=r"trainer.device=cuda but this process sees no GPU.*trainer.device=cpu"):
        TorchBackend(BackendConfig(model_path=str(model_dir), device="cuda"))
    with pytest.raises(RuntimeError, match=r"trainer\.device"):
        require_device("cuda:0")


# --- memory and metrics ---------------------------------------------------------------------------------------


class _Measured:
    def __init__(self, peak: int) -> None:
        self.peak = peak

    def peak_memory_bytes(self) -> int:
        return self.peak


def test_device_metrics_report_each_roles_peak() -> None:
    metrics = device_metrics("cuda", {"policy": _Measured(3 * 2**30), "ref": _Measured(2**29), "critic": object()})
    assert metrics == {
        "system/device_is_cuda": 1.0,
        "system/peak_memory_gib/policy": 3.0,
        "system/peak_memory_gib/ref": 0.5,
    }
    assert device_metrics("cpu", {"policy": _Measured(0)}) == {"system/device_is_cuda": 0.0}


def test_peak_memory_records_nothing_on_a_cpu(model_dir: Path, make_batch: Any) -> None:
    backend = TorchBackend(BackendConfig(model_path=str(model_dir)))
    backend.forward(make_batch([3], [4]))
    assert not backend.memory.tracks
    assert backend.peak_memory_bytes() == 0
    assert not PeakMemory(torch.device("cpu")).tracks


# --- the precision policy -------------------------------------------------------------------------------------


def test_policy_table() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert PrecisionPolicy.of("float32", "auto", cpu) == PrecisionPolicy(torch.float32, torch.float32)
    on_gpu = PrecisionPolicy.of("float32", "auto", cuda)
    assert (on_gpu.param, on_gpu.compute, on_gpu.reduce) == (torch.float32, torch.bfloat16, torch.float32)
    assert on_gpu.mixed
    assert not PrecisionPolicy.of("bfloat16", "auto", cuda).mixed
    fsdp = on_gpu.fsdp()
    assert (fsdp.param_dtype, fsdp.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert PrecisionPolicy.of("float32", "bfloat16", cpu).compute == torch.bfloat16
    with pytest.raises(ValueError, match="unknown compute dtype"):
        PrecisionPolicy.of("float32", "float8", cpu)


def _matmul_dtypes(model: torch.nn.Module) -> tuple[list[torch.dtype], list[Any]]:
    """Output dtypes of the decoder's linear layers in the next forward (hooks returned for removal).

    The output head is left out: during a backend call it returns float32 log-probs (its matmul runs inside).
    """
    seen: list[torch.dtype] = []
    head = model.get_output_embeddings()  # type: ignore[operator]
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m is not head
    ]
    return seen, hooks


def _check_training_dtypes(backend: TorchBackend, batch: Any, loss: Any, compute: torch.dtype) -> None:
    seen, hooks = _matmul_dtypes(backend.model)
    out = backend.forward(batch)
    assert out.log_probs.dtype == torch.float32
    assert seen
    assert set(seen) == {compute}, set(seen)
    for hook in hooks:
        hook.remove()
    backend.forward_backward(batch, loss)
    for name, param in backend.model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        assert local.dtype == torch.float32, name  # master weights
        assert param.grad is not None, name
        assert param.grad.dtype == torch.float32, name
    backend.optim_step()
    moments = [t for state in backend.optimizer.state.values() for t in state.values() if t.dim() > 0]
    assert moments
    assert {(t.to_local() if hasattr(t, "to_local") else t).dtype for t in moments} == {torch.float32}


@pytest.mark.parametrize(("compute_dtype", "expected"), [("auto", torch.float32), ("bfloat16", torch.bfloat16)])
def test_in_process_path_follows_the_policy(
    model_dir: Path, make_batch: Any, sft_loss: Any, compute_dtype: str, expected: torch.dtype
) -> None:
    config = BackendConfig(model_path=str(model_dir), compute_dtype=compute_dtype, micro_train_batch_size=2)  # type: ignore[arg-type]
    _check_training_dtypes(TorchBackend(config), make_batch([3, 4], [5, 3]), sft_loss, expected)


def test_sharded_path_follows_the_same_policy(model_dir: Path, make_batch: Any, sft_loss: Any, tmp_path: Path) -> None:
    """One FSDP2 rank in this process (gloo): parameters gathered in bf16, float32 shards, gradients and moments."""
    from skyrl_train.backends.fsdp import FSDPWorker

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        config = BackendConfig(
            model_path=str(model_dir),
            compute_dtype="bfloat16",
            micro_train_batch_size=2,
            optimizer=OptimizerConfig(lr=1e-3),
        )
        worker = FSDPWorker(config)
        assert worker.precision.fsdp().param_dtype == torch.bfloat16
        _check_training_dtypes(worker, make_batch([3, 4], [5, 3]), sft_loss, torch.bfloat16)
    finally:
        dist.destroy_process_group()
