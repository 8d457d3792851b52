from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from skyrl_train.inference.base import SamplingParams
from skyrl_train.inference.factory import create_engine
from skyrl_train.inference.local import LocalEngine
from skyrl_train.inference.remote import RemoteEngine
from skyrl_train.inference.weight_sync import (
    deserialize_weights,
    load_weights,
    save_weights,
    serialize_weights,
    sync_weights,
    weights_file,
)


def tied_weights() -> list[tuple[str, torch.Tensor]]:
    shared = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    return [("embed.weight", shared), ("lm_head.weight", shared), ("norm.weight", torch.ones(3))]


def test_bytes_round_trip_keeps_aliased_tensors() -> None:
    restored = dict(deserialize_weights(serialize_weights(tied_weights())))
    assert restored.keys() == {"embed.weight", "lm_head.weight", "norm.weight"}
    for name, expected in tied_weights():
        torch.testing.assert_close(restored[name], expected)


def test_file_round_trip_and_cleanup(tmp_path: Path) -> None:
    path = save_weights(tied_weights(), tmp_path / "w.safetensors")
    assert dict(load_weights(path)).keys() == {"embed.weight", "lm_head.weight", "norm.weight"}
    assert not list(tmp_path.glob("*.partial"))
    with weights_file(tied_weights(), tmp_path) as shm_path:
        assert shm_path.exists()
    assert not shm_path.exists()


class Backend:
    """Stands in for a TrainingBackend: only get_weights matters to the sync."""

    def __init__(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.weights = weights

    def get_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.weights)


def test_sync_weights_loads_pauses_and_resumes(tiny_model_dir: Path, prompts: list[list[int]]) -> None:
    engine = LocalEngine.from_pretrained(tiny_model_dir)
    norm = engine.model.model.norm.weight

    async def scenario() -> float:
        try:
            seconds = await sync_weights(Backend([("model.norm.weight", torch.full_like(norm, 0.5))]), engine)
            assert len(await engine.generate(prompts[:1], SamplingParams(max_tokens=2))) == 1  # resumed
            return seconds
        finally:
            await engine.close()

    seconds = asyncio.run(scenario())
    assert 0 < seconds < 60
    torch.testing.assert_close(norm, torch.full_like(norm, 0.5))


def test_create_engine(tiny_model_dir: Path) -> None:
    local = create_engine("local", tiny_model_dir, max_batch_size=8)
    assert isinstance(local, LocalEngine)
    assert local.config.max_batch_size == 8
    asyncio.run(local.close())
    remote = create_engine("remote", "served-name", base_url="http://127.0.0.1:1", max_concurrency=3)
    assert isinstance(remote, RemoteEngine)
    assert remote.config.model == "served-name"
    with pytest.raises(TypeError, match="unknown option"):
        create_engine("local", tiny_model_dir, batch_size=8)
    with pytest.raises(TypeError, match="unknown option"):
        create_engine("vllm", tiny_model_dir, gpu_memory=0.5)
    with pytest.raises(ValueError, match="base_url"):
        create_engine("remote", "m")
    with pytest.raises(ValueError, match="model_path"):
        create_engine("vllm")
    with pytest.raises(ValueError, match="unknown engine kind"):
        create_engine("sglang", tiny_model_dir)  # type: ignore[arg-type]


def test_importing_the_engines_imports_neither_vllm_nor_http_clients() -> None:
    code = (
        "import sys\n"
        "import skyrl_train, skyrl_train.inference.factory, skyrl_train.inference.local\n"
        "import skyrl_train.inference.remote, skyrl_train.inference.vllm_engine, skyrl_train.inference.weight_sync\n"
        "import skyrl_train.inference.vllm_worker_ext\n"
        "print(sorted(m for m in ('vllm', 'aiohttp', 'httpx') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"


def test_cuda_ipc_refuses_cpu_tensors() -> None:
    from skyrl_train.inference.vllm_worker_ext import pack_cuda_ipc

    with pytest.raises(ValueError, match="CUDA"):
        pack_cuda_ipc(tied_weights())
