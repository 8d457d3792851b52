"""The gradient-only training backend protocol.

The trainer loop speaks to a backend in four verbs: ``forward`` (log-probabilities, no gradient),
``forward_backward`` (accumulate gradients of a loss), ``optim_step`` (apply them) and ``get_weights`` (for the
weight sync), plus ``save``/``load``. Where the model lives (one process, FSDP2 over Ray workers) is the
backend's business, so the loop reads like the algorithm and runs on a CPU in tests.

Batch layout (:class:`TrainingBatch`): each row is ``prompt + response``; prompts are left-padded and responses
right-padded to a common length, so the response of every row occupies the last ``T = response_mask.shape[1]``
positions of ``input_ids``. Per-token tensors (``[B, T]``) are aligned with those response positions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

# Defined beside the losses that produce it (algorithms/ imports nothing from backends/); re-exported with LossFn.
from skyrl_train.algorithms.reductions import LossMetrics as LossMetrics


@dataclass
class TrainingBatch:
    """Tensors of one (mini-)batch; the backend splits it into micro-batches along dim 0."""

    input_ids: torch.Tensor  # [B, L] int64: left-padded prompt + right-padded response
    attention_mask: torch.Tensor  # [B, L] int64: 1 on real tokens
    response_mask: torch.Tensor  # [B, T] float32: 1 on tokens the loss sees (model-generated, not padding)
    # Named per-token inputs of the loss, each [B, T]: e.g. "old_log_probs", "advantages", "ref_log_probs",
    # "rollout_log_probs", "token_weights", "values", "returns".
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_length(self) -> int:
        """``T``: the number of response positions at the end of every row."""
        return int(self.response_mask.shape[1])

    def select(self, index: torch.Tensor | slice) -> TrainingBatch:
        """The rows at ``index`` (a slice or a 1-D index tensor), every tensor sliced alike."""
        return TrainingBatch(
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            response_mask=self.response_mask[index],
            tensors={name: t[index] for name, t in self.tensors.items()},
        )

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> TrainingBatch:
        """The same batch on ``device`` (``non_blocking``: an asynchronous copy from pinned host memory)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin(self) -> TrainingBatch:
        """The same batch in page-locked host memory, so a copy to a GPU runs asynchronously and at full speed."""
        return self._map(lambda t: t.pin_memory())

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TrainingBatch:
        moved = {f.name: fn(getattr(self, f.name)) for f in fields(self) if f.name != "tensors"}
        return TrainingBatch(**moved, tensors={name: fn(t) for name, t in self.tensors.items()})


@dataclass
class ModelOutput:
    """What the model computed for a micro-batch, aligned with its response positions."""

    log_probs: torch.Tensor  # [b, T] log-probability of each response token (temperature applied)
    entropy: torch.Tensor | None = None  # [b, T] entropy of the token distribution, when requested
    values: torch.Tensor | None = None  # [b, T] critic values, for value models


def concat_batches(first: TrainingBatch, second: TrainingBatch) -> TrainingBatch:
    """The rows of ``first`` then those of ``second`` (same length, same named tensors)."""
    return TrainingBatch(
        input_ids=torch.cat([first.input_ids, second.input_ids]),
        attention_mask=torch.cat([first.attention_mask, second.attention_mask]),
        response_mask=torch.cat([first.response_mask, second.response_mask]),
        tensors={name: torch.cat([t, second.tensors[name]]) for name, t in first.tensors.items()},
    )


LossFn = Callable[[ModelOutput, TrainingBatch], tuple[torch.Tensor, LossMetrics]]
"""``loss_fn(model_output, micro_batch) -> (loss, metrics)``.

The loss must already be scaled for accumulation (e.g. through ``token_weights`` computed over the whole
mini-batch), so the backend simply sums the gradients of the micro-batch losses. Metrics whose name ends in
``_loss`` are such shares too (e.g. ``policy/pg_loss``, the policy-loss part of ``loss``): the backend sums them
over micro-batches, as it sums ``loss``. Every other metric is a mean over the micro-batch's tokens; the backend
averages it over micro-batches weighted by their ``response_mask`` tokens.

Metrics should be detached 0-dim tensors (``LossMetrics``; floats are accepted): the backend reads them back to
the host together after the last micro-batch, so a loss that reads a device value itself (``.item()``,
``float(t)``, ``if t:``) makes the host wait for the GPU once per micro-batch. ``forward_backward`` returns floats.
"""


@runtime_checkable
class TrainingBackend(Protocol):
    """A model with an optimizer that computes gradients and nothing else."""

    def forward(self, batch: TrainingBatch, *, temperature: float = 1.0) -> ModelOutput:
        """Log-probabilities (and entropy if the backend computes it) without gradients."""
        ...

    def forward_backward(
        self, batch: TrainingBatch, loss_fn: LossFn, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, float]:
        """Accumulate the gradients of ``loss_fn`` over the batch's micro-batches; return averaged metrics."""
        ...

    def optim_step(self) -> dict[str, float]:
        """Clip, step the optimizer and scheduler, zero the gradients; return ``grad_norm`` and ``lr``."""
        ...

    def get_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's parameters in Hugging Face naming (LoRA merged), for the weight sync."""
        ...

    def save(self, path: Path) -> None:
        """Write model, optimizer and scheduler state under ``path``."""
        ...

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote."""
        ...


@runtime_checkable
class OffloadingBackend(Protocol):
    """A backend that can lend its optimizer's device memory to colocated engines while they generate."""

    def offload_optimizer(self) -> None:
        """Move the optimizer state to host memory (nothing when it lives there already)."""
        ...

    def reload_optimizer(self) -> None:
        """Move it back to the model's device, before the next optimizer step."""
        ...
