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

Failures. A member that dies in the middle of a collective is not noticed by the others (gloo's send to it waits
for the transport's timeout; NCCL never notices). So no member waits blindly: each polls its collective, and gives
up with :class:`BroadcastAborted` when

- whoever watches the members (the driver, which learns of a dead Ray actor at once) calls :func:`abort` with the
  group's address: it leaves a mark in the group's store that every member checks while it waits, or
- rank 0 has waited :meth:`SendTimeout.seconds` for a bucket (a fixed allowance plus the bytes at a floor rate;
  the other ranks wait ``GroupAddress.timeout_s``: they also wait while rank 0 gathers the next bucket).

A member that gave up lets the group go: a collective cannot be cancelled under gloo, and dropping a group waits
for its running collective, so a background thread holds the group until the transport's own timeout (twice the
wait) ends it. Form a new group, at a new address, to send again.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore  # torch.distributed's own, by their typed home

__all__ = [
    "BroadcastAborted",
    "BroadcastGroup",
    "BucketPlan",
    "GroupAddress",
    "SendTimeout",
    "TensorSpec",
    "abort",
    "join",
    "plan_buckets",
    "specs_of",
]

DEFAULT_BUCKET_BYTES = 256 * 2**20
ALIGN = 16  # every tensor starts at a multiple of this in its bucket: viewing bytes as a dtype needs alignment
DistBackend = Literal["gloo", "nccl"]
STORE_PREFIX = "skyrl-broadcast"  # the group's keys in its store, beside the process group's own
ABORT_KEY = "abort"  # set by abort(): every member stops waiting
ABORT_CONNECT_S = 5.0  # for abort() to reach the store (it is gone with rank 0: the group is over then anyway)
POLL_S = (0.0005, 0.05)  # a waiting member checks its collective first this often, backing off to this


class BroadcastAborted(RuntimeError):
    """A member stopped waiting for a collective: :func:`abort` was called, or rank 0 ran out of time.

    The group is unusable afterwards: form a new one (a new address) and send again.
    """


@dataclass(frozen=True)
class SendTimeout:
    """How long rank 0 waits for one bucket's collective before it gives up on the group."""

    base_s: float = 30.0  # for every receiver to reach the collective (they wait for the sender, not it for them)
    min_bytes_per_s: float = 25e6  # a floor far below any link the group runs on (loopback, Ethernet, NVLink)

    def seconds(self, nbytes: int) -> float:
        """The wait for a bucket of ``nbytes`` bytes."""
        return self.base_s + nbytes / self.min_bytes_per_s


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
    timeout_s: float = 600.0  # joining, and each receiver's wait for a bucket
    send_timeout: SendTimeout = SendTimeout()  # rank 0's wait for a bucket

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

    def __init__(self, group: Any, rank: int, device: torch.device, store: TCPStore, address: GroupAddress) -> None:
        # group: a ProcessGroupGloo or ProcessGroupNCCL (their stubs share no usable base type)
        self.group, self.rank, self.world_size, self.device = group, rank, address.world_size, device
        self.address = address
        self._store = store  # rank 0 hosts the store: it must live as long as the group
        self._signals = PrefixStore(STORE_PREFIX, store)
        self._abandoned = False  # gave up on a collective: the group belongs to a background thread now

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
        if self._abandoned:
            raise BroadcastAborted("this member gave up on the group earlier: form a new one")
        if buffer.numel() == 0:
            return  # an empty bucket (zero-sized tensors only): nothing to move
        wait_s = self._patience(buffer.numel())
        options = dist.BroadcastOptions()
        options.rootRank = 0
        # The transport's own limit comes after ours: it only ends a collective this member has stopped waiting for.
        options.timeout = datetime.timedelta(seconds=2 * wait_s)
        self._wait(self.group.broadcast([buffer], options), wait_s)

    def _patience(self, nbytes: int) -> float:
        """Seconds this member waits for a bucket of ``nbytes`` (see the module docstring)."""
        return self.address.send_timeout.seconds(nbytes) if self.rank == 0 else self.address.timeout_s

    def _wait(self, work: Any, wait_s: float) -> None:
        """Return once ``work`` is done (raising its error); raise :class:`BroadcastAborted` on an abort or timeout."""
        start = time.monotonic()
        pause = POLL_S[0]
        while not work.is_completed():
            if self._abort_requested():
                self._abandon(work)
                raise BroadcastAborted(f"rank {self.rank}: the group at {self.address} was aborted")
            if time.monotonic() - start > wait_s:
                self._abandon(work)
                raise BroadcastAborted(f"rank {self.rank}: a bucket took over {wait_s:.0f} s: a member is gone?")
            time.sleep(pause)
            pause = min(2 * pause, POLL_S[1])
        work.wait()

    def _abort_requested(self) -> bool:
        try:
            return bool(self._signals.check([ABORT_KEY]))
        except RuntimeError:  # the store went with rank 0: nothing more will be sent
            return True

    def _abandon(self, work: Any) -> None:
        """Hand the group to a thread that drops it once ``work`` ends (dropping it now would wait for that)."""
        self._abandoned = True
        self.group.abort()  # NCCL: ends the collective now; gloo: ends with the transport's timeout
        threading.Thread(target=_release, args=(self.group, work), name="broadcast-release", daemon=True).start()

    def close(self) -> None:
        """Leave the group (its connections close; a member that is still waiting fails)."""
        if self._abandoned:
            return  # the release thread drops it
        shutdown = getattr(self.group, "shutdown", None)
        if callable(shutdown):
            shutdown()


def _release(group: Any, work: Any) -> None:
    """Hold ``group`` until its abandoned collective ``work`` ends, then drop it (in this thread)."""
    with contextlib.suppress(RuntimeError):  # the failure was reported when the member gave up (BroadcastAborted)
        work.wait()
    del group


def abort(address: GroupAddress) -> bool:
    """Make every member of the group at ``address`` stop waiting (:class:`BroadcastAborted`); whether it got there.

    For whoever notices a member die first. Returns False when the group's store is gone (rank 0 died: the others
    then give up on their own).
    """
    try:
        store = TCPStore(
            address.host,
            address.port,
            None,
            is_master=False,
            timeout=datetime.timedelta(seconds=ABORT_CONNECT_S),
            wait_for_workers=False,
        )
        PrefixStore(STORE_PREFIX, store).set(ABORT_KEY, "1")
    except RuntimeError:
        return False
    return True


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
    prefixed = PrefixStore(STORE_PREFIX, store)
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
    return BroadcastGroup(group, rank, device, store, address)


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
