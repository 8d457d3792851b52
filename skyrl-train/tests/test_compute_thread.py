"""The shared compute thread, and the components that run their torch work on it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import torch

from skyrl_train.backends import BackendConfig, TorchBackend, TrainingBatch
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.inference.base import SamplingParams
from skyrl_train.inference.factory import create_engine
from skyrl_train.inference.local import LocalEngine


@pytest.fixture
def compute() -> ComputeThread:
    thread = ComputeThread("test-compute")
    yield thread  # type: ignore[misc]
    thread.close()


def test_calls_run_in_order_on_one_other_thread(compute: ComputeThread) -> None:
    idents = [compute.call(threading.get_ident) for _ in range(3)]
    assert len(set(idents)) == 1
    assert idents[0] != threading.get_ident()
    assert not compute.is_current
    assert compute.call(lambda: compute.is_current)
    assert compute.call(lambda: compute.call(threading.get_ident)) == idents[0]  # nested calls run inline
    assert asyncio.run(compute.acall(threading.get_ident)) == idents[0]


def test_errors_reach_the_caller_and_close_ends_the_thread(compute: ComputeThread) -> None:
    with pytest.raises(ZeroDivisionError):
        compute.call(lambda: 1 / 0)
    assert compute.call(int, "7") == 7  # the thread survived the error
    compute.close()
    compute.close()
    with pytest.raises(RuntimeError):
        compute.call(int, "7")


def _batch() -> TrainingBatch:
    input_ids = torch.tensor([[0, 5, 6, 7, 8], [3, 4, 6, 9, 2]])
    attention_mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    return TrainingBatch(input_ids, attention_mask, torch.ones(2, 2))


def test_backend_computes_on_its_compute_thread(tiny_model_dir: Path, compute: ComputeThread) -> None:
    config = BackendConfig(str(tiny_model_dir), micro_train_batch_size=2, micro_forward_batch_size=2, seed=0)
    alone, shared = TorchBackend(config), TorchBackend(config, compute)
    seen: list[int] = []
    shared.model.register_forward_hook(lambda *_: seen.append(threading.get_ident()))
    torch.testing.assert_close(shared.forward(_batch()).log_probs, alone.forward(_batch()).log_probs, rtol=0, atol=0)

    def loss_fn(output, batch):  # type: ignore[no-untyped-def]
        return -output.log_probs.sum(), {}

    assert shared.forward_backward(_batch(), loss_fn) == alone.forward_backward(_batch(), loss_fn)
    assert shared.optim_step() == alone.optim_step()
    worker = compute.call(threading.get_ident)
    assert seen == [worker, worker]


def test_local_engine_generates_on_a_shared_thread_and_leaves_it_open(
    tiny_model_dir: Path, compute: ComputeThread
) -> None:
    engine = create_engine("local", tiny_model_dir, compute=compute)
    assert isinstance(engine, LocalEngine)
    seen: list[int] = []
    engine.model.register_forward_hook(lambda *_: seen.append(threading.get_ident()))

    async def generate_then_close() -> None:
        await engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, seed=0))
        await engine.close()

    asyncio.run(generate_then_close())
    assert seen
    assert set(seen) == {compute.call(threading.get_ident)}  # still open after the engine closed


def test_compute_is_for_the_local_engine_only(tiny_model_dir: Path, compute: ComputeThread) -> None:
    with pytest.raises(ValueError, match="local engine"):
        create_engine("remote", base_url="http://127.0.0.1:1", compute=compute)
