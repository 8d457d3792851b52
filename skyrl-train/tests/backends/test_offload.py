"""The optimizer offload's host buffers: made once per moment, reused by every later offload, sharded ones too.

On a GPU the buffers are page-locked; these tests run the same copies from CPU tensors, where they are plain.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from skyrl_train.backends.torch_backend import HostBuffers, _to_host


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group in this process, as an FSDP2 rank has."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_moment_is_copied_into_the_same_buffer_each_time() -> None:
    buffers: HostBuffers = {}
    first = _to_host(torch.arange(6.0), buffers, (0, "exp_avg"))
    second = _to_host(torch.arange(6.0) * 2, buffers, (0, "exp_avg"))
    assert second is first is buffers[(0, "exp_avg")]
    assert torch.equal(second, torch.arange(6.0) * 2)
    resized = _to_host(torch.ones(2, dtype=torch.bfloat16), buffers, (0, "exp_avg"))
    assert resized is not first
    assert resized.dtype == torch.bfloat16


def test_a_sharded_moment_stays_a_dtensor_over_a_reused_buffer(one_rank: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    moment = distribute_tensor(torch.arange(12.0).view(4, 3), init_device_mesh("cpu", (1,)), [Shard(0)])
    buffers: HostBuffers = {}
    first = _to_host(moment, buffers, (0, "exp_avg_sq"))
    second = _to_host(moment * 2, buffers, (0, "exp_avg_sq"))
    for copy in (first, second):
        assert isinstance(copy, DTensor)
        assert (copy.device_mesh, copy.placements, copy.shape) == (moment.device_mesh, moment.placements, moment.shape)
        assert copy.to_local().data_ptr() == buffers[(0, "exp_avg_sq")].data_ptr()
    assert torch.equal(second.full_tensor(), 2 * moment.full_tensor())
