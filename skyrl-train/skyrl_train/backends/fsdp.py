"""One rank of an FSDP2 worker group: the in-process backend with its model sharded across a process group.

A worker is :class:`~skyrl_train.backends.torch_backend.TorchBackend` (or the critic) whose model goes through
``fully_shard`` once per decoder layer and once at the root, so parameters, gradients and AdamW moments are split
across the ranks of the default ``torch.distributed`` process group (gloo on CPU, NCCL on GPU). Everything else is
the in-process code: micro-batching, losses, metrics, clipping, the scheduler, and the optimizer's offload (each
sharded moment's local shard goes to a page-locked host buffer reused from one offload to the next). The group's driver
(:class:`skyrl_train.backends.ray_group.FSDPBackend`) gives every rank an equal share of a batch's rows.

Gradients. The loss function scales each micro-batch loss by token weights computed over the whole mini-batch, so
the mini-batch gradient is the *sum* of the ranks' gradients. FSDP2 averages gradients over ranks when it
reduce-scatters them; each rank therefore multiplies its loss by the world size (gloo has no pre-multiplied sum to
do it inside the collective). The gradient norm is the global one (``clip_grad_norm_`` over DTensors).

Every method here is collective: all ranks must call it, with batches of the same number of rows (the driver pads
a short share with fully masked rows), so every rank runs the same sequence of collectives.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from skyrl_train.backends.base import LossFn, LossMetrics, ModelOutput, TrainingBatch, concat_batches
from skyrl_train.backends.config import BackendConfig
from skyrl_train.backends.critic import CriticBackend
from skyrl_train.backends.lora import unwrap
from skyrl_train.backends.packing import even_out
from skyrl_train.backends.torch_backend import TorchBackend
from skyrl_train.tensor_broadcast import TensorSpec, specs_of

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

__all__ = ["FSDPCriticWorker", "FSDPWorker", "check_worker_config", "shard_layers"]

CHECKPOINT_DIR = "dcp"  # the sharded model + optimizer state under a backend checkpoint directory


def check_worker_config(config: BackendConfig) -> None:
    """Reject what a worker group cannot do yet, naming the key to change.

    Raises:
        ValueError: LoRA.
    """
    if config.lora.enabled:
        raise ValueError("FSDP workers train full weights: set model.lora_rank=0 (LoRA runs on trainer.backend=torch)")


def shard_layers(model: nn.Module, policy: MixedPrecisionPolicy | None = None) -> nn.Module:
    """``fully_shard`` every decoder layer (a module whose class name ends in ``DecoderLayer``), then the root.

    One FSDP unit per layer keeps one layer's full parameters alive at a time in forward and backward; the root unit
    holds the rest (embeddings, final norm, head, tied weights). ``policy`` is the mixed-precision policy of every
    unit (:meth:`skyrl_train.backends.precision.PrecisionPolicy.fsdp`); None computes in the parameters' dtype.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = policy if policy is not None else MixedPrecisionPolicy()
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


class FSDPWorker(TorchBackend):
    """A policy (or reference) rank: :class:`TorchBackend` with its model sharded (see the module docstring)."""

    def _distribute(self, model: nn.Module) -> nn.Module:
        check_worker_config(self.config)
        if not dist.is_initialized():
            raise RuntimeError("an FSDP worker needs torch.distributed initialised first (init_process_group)")
        return shard_layers(model, self.precision.fsdp())

    def _compute_context(self) -> AbstractContextManager[object]:
        """Nothing: the sharding casts parameters to the compute dtype as it gathers them."""
        return nullcontext()

    def _plan(self, batch: TrainingBatch, rows_per_micro_batch: int) -> tuple[TrainingBatch, list[slice]]:
        """This rank's micro-batches, as many as the rank with the most (collective).

        A token budget cuts the ranks' shares into different numbers of micro-batches, but each micro-batch is a
        sequence of all-gathers and reduce-scatters that every rank must join: a rank with fewer splits its widest
        ones, and if its rows run out, runs fully masked copies of a row (no loss, no metric weight).
        """
        slices = self._micro_slices(batch, rows_per_micro_batch)
        count = torch.tensor([len(slices)], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        slices, missing = even_out(slices, int(count.item()))
        if missing == 0:
            return batch, slices
        rows = len(batch)
        padding = batch.select(torch.zeros(missing, dtype=torch.long))
        padding.response_mask = torch.zeros_like(padding.response_mask)
        padded = concat_batches(batch, padding)
        return padded, slices + [slice(rows + k, rows + k + 1) for k in range(missing)]

    def peak_memory_bytes(self) -> int:
        """The highest peak of any rank (collective: every rank must call it)."""
        peak = torch.tensor([super().peak_memory_bytes()], dtype=torch.int64, device=self.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # gloo reduces CPU tensors, NCCL GPU ones: the model's device
        return int(peak.item())

    def forward_backward(
        self, batch: TrainingBatch, loss_fn: LossFn, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, float]:
        """This rank's share of the batch; ``loss`` is this rank's share of the batch loss (unscaled)."""
        world = dist.get_world_size()

        def scaled(output: ModelOutput, micro: TrainingBatch) -> tuple[torch.Tensor, LossMetrics]:
            loss, metrics = loss_fn(output, micro)
            return loss * world, metrics

        stats = super().forward_backward(batch, scaled, temperature=temperature, with_entropy=with_entropy)
        stats["loss"] /= world
        return stats

    def get_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`gathered_weights`, as the protocol's iterator (collective)."""
        return iter(self.gathered_weights())

    def gathered_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Full ``(Hugging Face name, tensor)`` pairs on the CPU on rank 0, tied weights once; ``[]`` elsewhere.

        Collective: every rank gathers each tensor; only rank 0 keeps them.
        """
        keep = dist.get_rank() == 0
        return [(name, full.detach().to("cpu", copy=True)) for name, full in self.full_weights() if keep]

    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each parameter gathered whole, one at a time, in :meth:`weight_specs` order (tied weights once).

        Collective: every rank must consume the iterator to its end, since each tensor is one all-gather. A tensor
        lives on the model's device until the consumer drops it.
        """
        for name, tensor in self._named_parameters():
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            yield name, full.detach()

    def weight_specs(self) -> list[TensorSpec]:
        """Name, full shape and dtype of what :meth:`full_weights` yields (no communication)."""
        return specs_of(self._named_parameters())

    def _named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        seen: set[int] = set()
        named: list[tuple[str, torch.Tensor]] = []
        for name, tensor in unwrap(self.model).state_dict(keep_vars=True).items():
            if id(tensor) not in seen:  # a tied weight appears under two names: send it once
                seen.add(id(tensor))
                named.append((name, tensor))
        return named

    def save(self, path: Path) -> None:
        """Sharded model and optimizer state (``torch.distributed.checkpoint``) plus rank 0's scheduler and step.

        ``path`` must be a directory every rank sees (the driver creates it and makes it final).
        """
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        dcp_save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(Path(path) / CHECKPOINT_DIR))
        if dist.get_rank() == 0:
            torch.save(self.scheduler.state_dict(), Path(path) / "scheduler.pt")
            state = {
                "global_step": self.global_step,
                "config": asdict(self.config),
                "world_size": dist.get_world_size(),
            }
            (Path(path) / "backend.json").write_text(json.dumps(state, indent=2))
        dist.barrier()

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote (any world size: the checkpoint is resharded on load)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        path = Path(path)
        if not (path / "backend.json").is_file() or not (path / CHECKPOINT_DIR).is_dir():
            raise FileNotFoundError(f"{path} is not an FSDP backend checkpoint (no backend.json and {CHECKPOINT_DIR}/)")
        self._materialize_optimizer_state()
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        dcp_load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path / CHECKPOINT_DIR))
        # dcp_load fills the state dicts it is given in place
        set_state_dict(self.model, self.optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        self.global_step = int(json.loads((path / "backend.json").read_text())["global_step"])

    def _materialize_optimizer_state(self) -> None:
        """Give a fresh AdamW its (zero) moments, so a checkpoint's moments have somewhere to load into.

        AdamW creates its state on its first step; loaded into a state dict without entries, the checkpoint's
        moments would be silently dropped and the resumed run would restart Adam from scratch. A step at lr 0 on
        zero gradients creates the entries and leaves every weight as it is (the loaded values replace them).
        """
        if self.optimizer.state:
            return
        rates = [group["lr"] for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate

    def export_hf(self, path: Path, tokenizer_path: str | Path | None = None) -> None:
        """Rank 0 writes the Hugging Face directory from the gathered weights; the other ranks only gather."""
        if dist.get_rank() == 0:
            super().export_hf(path, tokenizer_path)
        else:
            self.gathered_weights()
        dist.barrier()


class FSDPCriticWorker(FSDPWorker, CriticBackend):
    """A critic rank: :class:`CriticBackend` (its model and values) with the sharding of :class:`FSDPWorker`."""
