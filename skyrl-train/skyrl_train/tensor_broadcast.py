"""Broadcasting named tensors from one process to several, in buckets, over a process group of their own.

The policy's weights reach the inference engines this way when the trainer's ranks and the engines live in
different processes (:mod:`skyrl_train.inference.broadcast_sync` drives it). The pieces here know nothing of
models, engines or Ray:

- :func:`plan_buckets` cuts a list of :class:`TensorSpec` (name, shape, dtype) into buckets of about
  ``bucket_bytes``; sender and receivers hold the same :class:`BucketPlan`, so only raw bytes cross the wire.
- :func:`join` makes a :class:`BroadcastGroup`: a gloo (CPU tensors) or NCCL (CUDA tensors) process group over a
  ``TCPStore`` hosted by rank 0. It is *not* the default ``torch.distributed`` group, so an FSDP rank that already
  belongs to its training group can also be rank 0 here.
- :meth:`BroadcastGroup.send` (rank 0) packs each bucket into one flat byte buffer and broadcasts it;
  :meth:`BroadcastGroup.receive` (every other rank) gets the buffers and cuts them back into tensors.

A bucket is one collective and one buffer: big enough that per-call latency does not dominate, small enough that
the sender never holds more than one bucket beyond the tensors themselves.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore  # torch.distributed's own, by their typed home

__all__ = ["BroadcastGroup", "BucketPlan", "GroupAddress", "TensorSpec", "join", "plan_buckets", "specs_of"]

DEFAULT_BUCKET_BYTES = 256 * 2**20
ALIGN = 16  # every tensor starts at a multiple of this in its bucket: viewing bytes as a dtype needs alignment
DistBackend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class TensorSpec:
    """What a receiver needs to rebuild one tensor from bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """The tensor's size in bytes."""
        return _numel(self.shape) * _itemsize(self.dtype)


@dataclass(frozen=True)
class BucketPlan:
    """The tensors in the order they are sent, cut into buckets (each one broadcast)."""

    buckets: tuple[tuple[TensorSpec, ...], ...]

    @staticmethod
    def layout(bucket: Sequence[TensorSpec]) -> tuple[list[int], int]:
        """Each tensor's byte offset in the bucket's buffer, and the buffer's size."""
        offsets, end = [], 0
        for spec in bucket:
            start = -(-end // ALIGN) * ALIGN
            offsets.append(start)
            end = start + spec.nbytes
        return offsets, end

    @property
    def specs(self) -> list[TensorSpec]:
        """Every tensor, in the order sent."""
        return [spec for bucket in self.buckets for spec in bucket]

    @property
    def nbytes(self) -> int:
        """The tensors' bytes (without the buckets' alignment padding)."""
        return sum(spec.nbytes for spec in self.specs)


@dataclass(frozen=True)
class GroupAddress:
    """Where rank 0 hosts the group's store, how many ranks join, and over which backend."""

    host: str
    port: int
    world_size: int
    backend: DistBackend = "gloo"
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"a broadcast group needs a sender and at least one receiver, got {self.world_size}")


def specs_of(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    """The :class:`TensorSpec` of each ``(name, tensor)`` pair (a DTensor gives its global shape)."""
    return [TensorSpec(name, tuple(tensor.shape), tensor.dtype) for name, tensor in tensors]


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> BucketPlan:
    """Consecutive runs of ``specs`` of at most ``bucket_bytes`` each (a bigger tensor gets a bucket of its own)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[tuple[TensorSpec, ...]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and size + spec.nbytes > bucket_bytes:
            buckets.append(tuple(current))
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
    if current:
        buckets.append(tuple(current))
    return BucketPlan(tuple(buckets))


class BroadcastGroup:
    """One member of a broadcast group (rank 0 sends, the others receive). Made by :func:`join`."""

    def __init__(self, group: Any, rank: int, world_size: int, device: torch.device, store: object) -> None:
        # group: a ProcessGroupGloo or ProcessGroupNCCL (their stubs share no usable base type)
        self.group, self.rank, self.world_size, self.device = group, rank, world_size, device
        self._store = store  # rank 0 hosts the store: it must live as long as the group

    def send(self, plan: BucketPlan, tensors: Iterator[tuple[str, torch.Tensor]]) -> int:
        """Broadcast ``tensors`` (rank 0), which must come in ``plan``'s order; return the bytes sent.

        ``tensors`` is consumed bucket by bucket, so a generator that gathers each tensor on demand keeps only one
        bucket's worth alive.

        Raises:
            ValueError: a tensor's name, shape or dtype differs from the plan (nothing half-sent: the check runs
                before the bucket goes out, though earlier buckets have gone).
        """
        if self.rank != 0:
            raise RuntimeError("only rank 0 sends")
        sent = 0
        for bucket in plan.buckets:
            offsets, size = plan.layout(bucket)
            buffer = torch.zeros(size, dtype=torch.uint8, device=self.device)
            for spec, offset in zip(bucket, offsets, strict=True):
                name, tensor = next(tensors)
                _check(spec, name, tensor)
                flat = tensor.detach().reshape(-1).view(torch.uint8)  # reshape copies only if not contiguous
                buffer[offset : offset + spec.nbytes].copy_(flat)
            self._broadcast(buffer)
            sent += buffer.numel()
        return sent

    def receive(self, plan: BucketPlan) -> list[tuple[str, torch.Tensor]]:
        """The tensors rank 0 sends under ``plan``, on this member's device (views into one buffer per bucket)."""
        if self.rank == 0:
            raise RuntimeError("rank 0 sends; it does not receive")
        out: list[tuple[str, torch.Tensor]] = []
        for bucket in plan.buckets:
            offsets, size = plan.layout(bucket)
            buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            self._broadcast(buffer)
            for spec, offset in zip(bucket, offsets, strict=True):
                raw = buffer[offset : offset + spec.nbytes]
                out.append((spec.name, raw.view(spec.dtype).reshape(spec.shape)))
        return out

    def _broadcast(self, buffer: torch.Tensor) -> None:
        if buffer.numel() == 0:
            return  # an empty bucket (zero-sized tensors only): nothing to move
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([buffer], options).wait()

    def close(self) -> None:
        """Leave the group (its connections close; a member that is still waiting fails)."""
        shutdown = getattr(self.group, "shutdown", None)
        if callable(shutdown):
            shutdown()


def join(address: GroupAddress, rank: int) -> BroadcastGroup:
    """Join the group at ``address`` as ``rank``: blocks until all ``world_size`` members have joined.

    Rank 0 hosts the ``TCPStore`` (``address.host`` must be its own address and ``address.port`` free there). Use a
    fresh address (a new port) to form the group again after a member died.
    """
    if not 0 <= rank < address.world_size:
        raise ValueError(f"rank {rank} outside a group of {address.world_size}")
    timeout = datetime.timedelta(seconds=address.timeout_s)
    store = TCPStore(
        address.host, address.port, address.world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
    )
    prefixed = PrefixStore("skyrl-broadcast", store)
    if address.backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("a NCCL broadcast group needs a CUDA device in every member: use gloo on CPU")
        device = torch.device("cuda", torch.cuda.current_device())
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group: Any = dist.ProcessGroupNCCL(prefixed, rank, address.world_size, options)
    else:
        device = torch.device("cpu")
        group = dist.ProcessGroupGloo(prefixed, rank, address.world_size, timeout)
    return BroadcastGroup(group, rank, address.world_size, device, store)


def _check(spec: TensorSpec, name: str, tensor: torch.Tensor) -> None:
    if name != spec.name or tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
        raise ValueError(
            f"tensor {name} {tuple(tensor.shape)} {tensor.dtype} does not match the plan's "
            f"{spec.name} {spec.shape} {spec.dtype}: sender and receivers must use the same plan"
        )


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
