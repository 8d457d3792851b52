"""An FSDP2 worker group on Ray: one :class:`~skyrl_train.backends.base.TrainingBackend` over N actor processes.

:class:`FSDPBackend` starts ``num_workers`` Ray actors, each one rank of a ``torch.distributed`` group running an
FSDP2 worker (:mod:`skyrl_train.backends.fsdp`). The trainer calls it like the in-process backend; each call is
sent to every rank at once::

    forward / forward_backward   rows split into N equal contiguous shares (a short share is padded with fully
                                 masked copies of a row), results gathered back in row order
    optim_step                   every rank steps its shards; the global gradient norm is the same on each
    get_weights                  gathered full tensors, from rank 0
    broadcast_weights            gathered tensor by tensor; rank 0 broadcasts them to the engines
                                 (skyrl_train.inference.broadcast_sync)
    save / load                  a sharded torch.distributed.checkpoint plus rank 0's scheduler and step

Metrics combine as one process would, through the in-process backend's rule
(:func:`skyrl_train.backends.metrics.combine_metrics`): each rank returns floats (read once, after its last
micro-batch); the driver sums losses and ``*_loss`` shares over ranks and averages the other metrics weighted by
each rank's trained tokens (see ``backends.base.LossFn``).

Ray must be initialised by the caller (``ray.init()`` starts a local cluster, ``ray.init(address=...)`` joins one;
``skyrl_train.ray_cluster.ensure_ray`` does it for a run); the group asks for ``num_cpus_per_worker`` CPUs and
``num_gpus_per_worker`` GPUs per actor.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import ray
import torch

from skyrl_train.backends.base import LossFn, ModelOutput, TrainingBatch
from skyrl_train.backends.config import BackendConfig
from skyrl_train.backends.fsdp import check_worker_config
from skyrl_train.backends.metrics import combine_metrics
from skyrl_train.devices import require_device
from skyrl_train.tensor_broadcast import BroadcastGroup, BucketPlan, GroupAddress, TensorSpec

__all__ = ["FSDPBackend", "WorkerGroupConfig", "split_rows"]

Role = Literal["policy", "critic"]


@dataclass(frozen=True)
class WorkerGroupConfig:
    """How many ranks, with which resources, talking over which ``torch.distributed`` backend."""

    num_workers: int = 2
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0
    dist_backend: Literal["gloo", "nccl"] = "gloo"  # gloo on CPU, nccl on GPU

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.dist_backend == "nccl" and self.num_gpus_per_worker <= 0:
            raise ValueError("dist_backend='nccl' needs GPUs: set num_gpus_per_worker (or use gloo on CPU)")


def split_rows(num_rows: int, num_shares: int) -> list[slice]:
    """``num_shares`` contiguous slices of ``range(num_rows)``, sizes differing by at most one (some may be empty)."""
    base, extra = divmod(num_rows, num_shares)
    slices, start = [], 0
    for share in range(num_shares):
        size = base + (share < extra)
        slices.append(slice(start, start + size))
        start += size
    return slices


def _padded_share(batch: TrainingBatch, rows: slice, size: int) -> TrainingBatch:
    """The rows ``rows`` of ``batch`` padded to ``size`` rows with fully masked copies of a row (no loss, no metric)."""
    index = list(range(rows.start, rows.stop))
    pad = size - len(index)
    share = batch.select(torch.tensor(index + [index[0] if index else 0] * pad, dtype=torch.long))
    if pad:
        share.response_mask = share.response_mask.clone()
        share.response_mask[len(index) :] = 0
    return share


class _Worker:
    """The Ray actor: one rank. Builds its worker once the process group is up, then runs what the driver sends."""

    def __init__(self, role: Role, config: BackendConfig) -> None:
        self.role, self.config = role, config
        self.backend: Any = None
        self.broadcast: BroadcastGroup | None = None  # rank 0: the group that sends weights to the engines
        self.broadcast_at: GroupAddress | None = None  # and where it was formed (which sync it belongs to)

    def address(self) -> tuple[str, int]:
        """This actor's node address and a free port, for rank 0 to host the rendezvous."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return str(ray.util.get_node_ip_address()), int(port)  # type: ignore[no-untyped-call]

    def start(self, rank: int, world_size: int, master: tuple[str, int], dist_backend: str) -> None:
        import torch.distributed as dist

        from skyrl_train.backends.fsdp import FSDPCriticWorker, FSDPWorker

        torch.set_num_threads(max(int(os.environ.get("OMP_NUM_THREADS", "1")), 1))
        device = require_device(self.config.device)  # fails here, naming trainer.device, on a rank without a GPU
        if device.type == "cuda":  # NCCL binds each rank to the current device: the GPU Ray gave this actor
            torch.cuda.set_device(device.index or 0)
        dist.init_process_group(
            dist_backend, init_method=f"tcp://{master[0]}:{master[1]}", rank=rank, world_size=world_size
        )
        worker_class = FSDPCriticWorker if self.role == "critic" else FSDPWorker
        self.backend = worker_class(self.config)

    def node_id(self) -> str:
        """The Ray node this rank runs on."""
        return str(ray.get_runtime_context().get_node_id())

    def attribute(self, name: str) -> Any:
        return getattr(self.backend, name)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.backend, method)(*args, **kwargs)

    def forward_backward(self, batch: TrainingBatch, loss_fn: LossFn, kwargs: dict[str, Any]) -> tuple[float, Any]:
        """Stats, and this share's trained tokens (the weight of its metrics; counted on the host, as Ray sent it)."""
        return float(batch.response_mask.sum()), self.backend.forward_backward(batch, loss_fn, **kwargs)

    def join_broadcast(self, address: GroupAddress) -> None:
        """Rank 0: host and join (as its rank 0) a new weight-broadcast group, leaving any earlier one."""
        from skyrl_train.tensor_broadcast import join

        if self.broadcast is not None:
            self.broadcast.close()
            self.broadcast, self.broadcast_at = None, None
        self.broadcast = join(address, 0)
        self.broadcast_at = address

    def in_broadcast_group(self, address: GroupAddress) -> bool:
        """Rank 0: whether its current broadcast group is the one formed at ``address``."""
        return self.broadcast is not None and self.broadcast_at == address

    def broadcast_weights(self, plan: BucketPlan, address: GroupAddress) -> int:
        """Every rank gathers each weight (collective); rank 0 broadcasts them under ``plan``. Bytes sent (rank 0).

        ``address`` names the group the caller formed: rank 0 refuses to send into another one (it joined a newer
        group since), whose members would be waiting for other tensors. A failed send (a receiver died) still
        gathers the remaining tensors, so the other ranks' all-gathers are matched and the training group stays
        usable; the error is raised afterwards.
        """
        tensors = self.backend.full_weights()
        try:
            if dist_rank() != 0:
                return 0
            if self.broadcast is None or not self.in_broadcast_group(address):
                raise RuntimeError(f"rank 0 is not in the broadcast group at {address}: form it again (join_broadcast)")
            return self.broadcast.send(plan, tensors)
        finally:
            for _ in tensors:
                pass

    def stop(self) -> None:
        import torch.distributed as dist

        if self.broadcast is not None:
            self.broadcast.close()
        if dist.is_initialized():
            dist.destroy_process_group()


class FSDPBackend:
    """A :class:`~skyrl_train.backends.base.TrainingBackend` whose model lives sharded in Ray actors.

    ``role`` ``"policy"`` (also for a reference model) or ``"critic"``. See the module docstring for how each call
    is spread over the ranks. Call :meth:`close` to stop the actors.
    """

    def __init__(
        self,
        config: BackendConfig,
        group: WorkerGroupConfig,
        role: Role = "policy",
        *,
        actor_options: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        check_worker_config(config)
        if not ray.is_initialized():
            raise RuntimeError("FSDPBackend needs Ray: call ray.init() (or ray.init(address=...)) first")
        self.config, self.group, self.role = config, group, role
        # Actor handles are typed Any: Ray's stubs do not know the remote methods of a class wrapped at run time.
        actor: Any = ray.remote(num_cpus=group.num_cpus_per_worker, num_gpus=group.num_gpus_per_worker)(_Worker)
        options = list(actor_options) if actor_options is not None else [{}] * group.num_workers
        if len(options) != group.num_workers:
            raise ValueError(f"{len(options)} actor_options for {group.num_workers} workers: give one per worker")
        self.workers: list[Any] = [actor.options(**opts).remote(role, config) for opts in options]
        master = ray.get(self.workers[0].address.remote())
        ray.get(
            [
                worker.start.remote(rank, group.num_workers, master, group.dist_backend)
                for rank, worker in enumerate(self.workers)
            ]
        )

    # --- the TrainingBackend protocol ---

    def forward(self, batch: TrainingBatch, *, temperature: float = 1.0, with_entropy: bool = False) -> ModelOutput:
        """Log-probs (or a critic's values) ``[B, T]`` of the batch, computed share by share on the ranks."""
        slices = split_rows(len(batch), len(self.workers))
        size = max(s.stop - s.start for s in slices)
        outputs: list[ModelOutput] = ray.get(
            [
                worker.call.remote(
                    "forward", _padded_share(batch, rows, size), temperature=temperature, with_entropy=with_entropy
                )
                for worker, rows in zip(self.workers, slices, strict=True)
            ]
        )
        kept = [_rows_of(output, rows.stop - rows.start) for output, rows in zip(outputs, slices, strict=True)]
        return _concat(kept)

    def forward_backward(
        self, batch: TrainingBatch, loss_fn: LossFn, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, float]:
        """Gradients of ``loss_fn`` over the whole batch, summed across ranks; metrics as one process reports them."""
        slices = split_rows(len(batch), len(self.workers))
        size = max(s.stop - s.start for s in slices)
        kwargs = {"temperature": temperature, "with_entropy": with_entropy}
        results: list[tuple[float, dict[str, float]]] = ray.get(
            [
                worker.forward_backward.remote(_padded_share(batch, rows, size), loss_fn, kwargs)
                for worker, rows in zip(self.workers, slices, strict=True)
            ]
        )
        loss = sum(stats.pop("loss") for _, stats in results)
        return {**combine_metrics(results), "loss": loss}

    def optim_step(self) -> dict[str, float]:
        """Step every rank's shards; the ranks agree on the global gradient norm, so rank 0's stats stand for all."""
        stats: list[dict[str, float]] = ray.get([worker.call.remote("optim_step") for worker in self.workers])
        return stats[0]

    def get_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full ``(Hugging Face name, tensor)`` pairs on the CPU, gathered from the shards."""
        gathered: list[list[tuple[str, torch.Tensor]]] = ray.get(
            [worker.call.remote("gathered_weights") for worker in self.workers]
        )
        return iter(gathered[0])

    def save(self, path: Path) -> None:
        """Write a sharded checkpoint under ``path`` (replaced atomically: written beside it, then renamed)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.mkdir(parents=True)
        try:
            ray.get([worker.call.remote("save", tmp) for worker in self.workers])
            if path.exists():
                shutil.rmtree(path)
            tmp.rename(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote into every rank."""
        ray.get([worker.call.remote("load", Path(path)) for worker in self.workers])

    # --- beyond the protocol ---

    def offload_optimizer(self) -> None:
        """Every rank moves its shard of the optimizer state to host memory (GPU ranks; nothing on CPU)."""
        ray.get([worker.call.remote("offload_optimizer") for worker in self.workers])

    def reload_optimizer(self) -> None:
        """Every rank moves its shard back to its device."""
        ray.get([worker.call.remote("reload_optimizer") for worker in self.workers])

    def weight_specs(self) -> list[TensorSpec]:
        """What :meth:`broadcast_weights` sends: each weight's name, full shape and dtype."""
        return list(ray.get(self.workers[0].call.remote("weight_specs")))

    def broadcast_address(self, world_size: int, backend: Literal["gloo", "nccl"] = "gloo") -> GroupAddress:
        """A fresh address on rank 0's node for a weight-broadcast group of ``world_size`` members."""
        host, port = ray.get(self.workers[0].address.remote())
        return GroupAddress(host, port, world_size, backend)

    async def join_broadcast(self, address: GroupAddress) -> None:
        """Rank 0 joins the group at ``address`` as its sender (returns once every member has joined)."""
        await self.workers[0].join_broadcast.remote(address)

    async def in_broadcast_group(self, address: GroupAddress) -> bool:
        """Whether rank 0 is still in the group formed at ``address`` (not in a newer one)."""
        return bool(await self.workers[0].in_broadcast_group.remote(address))

    async def broadcast_weights(self, plan: BucketPlan, address: GroupAddress) -> int:
        """Send the weights under ``plan`` to the group formed at ``address`` (every rank gathers); the bytes sent."""
        sent = await asyncio.gather(*(worker.broadcast_weights.remote(plan, address) for worker in self.workers))
        return int(sent[0])

    @property
    def num_workers(self) -> int:
        """Ranks of the group (0 once closed)."""
        return len(self.workers)

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (rank 0's count; the ranks step together)."""
        return int(ray.get(self.workers[0].attribute.remote("global_step")))

    def export_hf(self, path: Path, tokenizer_path: str | Path | None = None) -> None:
        """A Hugging Face model directory from the gathered weights (written by rank 0)."""
        ray.get([worker.call.remote("export_hf", Path(path), tokenizer_path) for worker in self.workers])

    def peak_memory_bytes(self) -> int:
        """The highest peak device memory of any rank since the last call (0 on CPUs)."""
        return int(ray.get([worker.call.remote("peak_memory_bytes") for worker in self.workers])[0])

    def has_active_dropout(self) -> bool:
        """Whether a training forward can differ from :meth:`forward` (the trainer's old-log-prob shortcut)."""
        return bool(ray.get(self.workers[0].call.remote("has_active_dropout")))

    def close(self) -> None:
        """Leave the process group and stop the actors (idempotent)."""
        workers, self.workers = self.workers, []
        if workers:
            ray.get([worker.stop.remote() for worker in workers])
            for worker in workers:
                ray.kill(worker)


def dist_rank() -> int:
    """This process's rank in the training group."""
    import torch.distributed as dist

    return dist.get_rank()


def _rows_of(output: ModelOutput, rows: int) -> ModelOutput:
    """The first ``rows`` rows of a share's output (the rest were padding)."""
    return ModelOutput(
        log_probs=output.log_probs[:rows],
        entropy=None if output.entropy is None else output.entropy[:rows],
        values=None if output.values is None else output.values[:rows],
    )


def _concat(outputs: Sequence[ModelOutput]) -> ModelOutput:
    def cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
        return None if any(t is None for t in tensors) else torch.cat([t for t in tensors if t is not None])

    log_probs = cat([o.log_probs for o in outputs])
    assert log_probs is not None
    return ModelOutput(
        log_probs=log_probs, entropy=cat([o.entropy for o in outputs]), values=cat([o.values for o in outputs])
    )
