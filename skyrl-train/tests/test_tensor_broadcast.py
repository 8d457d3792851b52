"""Bucketed broadcast of named tensors over a gloo group of its own (members are threads of this process)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
import torch

from skyrl_train.tensor_broadcast import (
    ALIGN,
    BucketPlan,
    GroupAddress,
    TensorSpec,
    join,
    plan_buckets,
    specs_of,
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tensors() -> list[tuple[str, torch.Tensor]]:
    """Mixed dtypes and odd sizes, so offsets need alignment; a scalar, an empty tensor, a non-contiguous one."""
    generator = torch.Generator().manual_seed(0)
    return [
        ("embed", torch.randn(7, 5, generator=generator)),
        ("norm.bf16", torch.randn(3, generator=generator).to(torch.bfloat16)),
        ("step", torch.tensor(12, dtype=torch.int64)),
        ("mask", torch.tensor([True, False, True])),
        ("empty", torch.zeros(0, 4)),
        ("transposed", torch.randn(4, 6, generator=generator).t()),
        ("head.fp16", torch.randn(9, generator=generator).to(torch.float16)),
    ]


def _run_group(world: int, work: Any) -> list[Any]:
    """Run ``work(member)`` for every rank of a fresh group, each rank in its own thread; the results by rank."""
    address = GroupAddress("127.0.0.1", _free_port(), world, timeout_s=30)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            results[rank] = work(join(address, rank))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def test_buckets_hold_consecutive_tensors_up_to_the_limit_and_a_big_one_alone() -> None:
    specs = [TensorSpec(f"t{i}", (n,), torch.float32) for i, n in enumerate([10, 10, 100, 5, 5])]  # 40/40/400/20/20 B
    plan = plan_buckets(specs, bucket_bytes=100)
    assert [[spec.name for spec in bucket] for bucket in plan.buckets] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert plan.specs == specs
    assert plan.nbytes == 520
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(specs, bucket_bytes=0)


def test_every_tensor_starts_aligned_in_its_bucket() -> None:
    bucket = specs_of(_tensors())
    offsets, size = BucketPlan.layout(bucket)
    assert all(offset % ALIGN == 0 for offset in offsets)
    assert offsets == sorted(offsets)
    assert size == offsets[-1] + bucket[-1].nbytes


@pytest.mark.parametrize("bucket_bytes", [1, 64, 2**20])  # one tensor per bucket, a few per bucket, one bucket
def test_every_receiver_gets_the_tensors_exactly(bucket_bytes: int) -> None:
    tensors = _tensors()
    plan = plan_buckets(specs_of(tensors), bucket_bytes)

    def work(member: Any) -> Any:
        return member.send(plan, iter(tensors)) if member.rank == 0 else member.receive(plan)

    sent, *received = _run_group(3, work)
    assert sent == sum(BucketPlan.layout(bucket)[1] for bucket in plan.buckets)
    for got in received:
        assert [name for name, _ in got] == [name for name, _ in tensors]
        for (_, actual), (name, expected) in zip(got, tensors, strict=True):
            assert actual.dtype == expected.dtype, name
            assert torch.equal(actual, expected), name


def test_a_tensor_that_differs_from_the_plan_is_refused_before_its_bucket_goes_out() -> None:
    tensors = _tensors()
    plan = plan_buckets(specs_of(tensors), 2**20)
    wrong = [(name, t.double() if name == "embed" else t) for name, t in tensors]
    address = GroupAddress("127.0.0.1", _free_port(), 2, timeout_s=5)
    receiver: dict[str, Any] = {}

    def receive() -> None:
        member = join(address, 1)
        receiver["joined"] = True
        with pytest.raises(RuntimeError):  # the sender never sends: the receive times out
            member.receive(plan)

    thread = threading.Thread(target=receive)
    thread.start()
    sender = join(address, 0)
    with pytest.raises(ValueError, match="does not match the plan"):
        sender.send(plan, iter(wrong))
    thread.join(timeout=30)
    assert receiver == {"joined": True}


def test_a_group_needs_a_receiver_and_ranks_inside_it() -> None:
    with pytest.raises(ValueError, match="at least one receiver"):
        GroupAddress("127.0.0.1", 1, 1)
    with pytest.raises(ValueError, match="outside a group"):
        join(GroupAddress("127.0.0.1", 1, 2), 2)
