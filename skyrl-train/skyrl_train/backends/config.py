"""Configuration of the in-process torch backend: one small dataclass per concern.

Names and defaults follow the trainer's policy config (``optimizer_config``, ``micro_*_batch_size_per_gpu``,
``max_tokens_per_microbatch``, ``remove_microbatch_padding``, ``gradient_checkpointing``, ``model.lora``), without the
``_per_gpu`` suffix: this backend is one process on one device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

SchedulerName = Literal["constant", "constant_with_warmup", "cosine", "linear"]
SCHEDULERS: tuple[str, ...] = get_args(SchedulerName)
DTypeName = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = get_args(DTypeName)
ComputeDTypeName = Literal["auto", "float32", "bfloat16"]
COMPUTE_DTYPES: tuple[str, ...] = get_args(ComputeDTypeName)


@dataclass
class OptimizerConfig:
    """AdamW with gradient clipping and a learning-rate schedule (Hugging Face ``get_scheduler`` semantics)."""

    lr: float = 1e-6  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.999)  # Adam β1, β2
    weight_decay: float = 1e-2  # decoupled (AdamW) weight decay, applied to every trainable parameter
    eps: float = 1e-8  # Adam denominator epsilon
    max_grad_norm: float | None = 1.0  # clip the global L2 gradient norm to this; None or <= 0: no clipping
    scheduler: SchedulerName = "constant_with_warmup"  # how the lr moves with the optimizer step
    num_warmup_steps: int = 0  # linear warm-up from 0 to ``lr`` over this many steps (not for "constant")
    total_steps: int | None = None  # optimizer steps of the whole run; "cosine" and "linear" decay to 0 over it

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.scheduler!r}; available: {', '.join(SCHEDULERS)}")
        if self.num_warmup_steps < 0:
            raise ValueError(f"num_warmup_steps must be >= 0, got {self.num_warmup_steps}")
        if self.scheduler in ("cosine", "linear") and (self.total_steps is None or self.total_steps <= 0):
            raise ValueError(f"scheduler {self.scheduler!r} decays over the run: set total_steps to a positive int")
        self.betas = (float(self.betas[0]), float(self.betas[1]))


@dataclass
class LoraConfig:
    """Low-rank adapters on the linear layers (PEFT); ``rank = 0`` trains the full model."""

    rank: int = 0  # adapter rank r; 0 turns LoRA off
    alpha: int = 16  # the update is scaled by alpha / rank
    dropout: float = 0.0  # dropout on the adapter input (training mode only)
    target_modules: str | list[str] = "all-linear"  # module names, or every linear layer but the output head
    exclude_modules: list[str] | None = None  # module names never adapted

    @property
    def enabled(self) -> bool:
        """Whether adapters are applied."""
        return self.rank > 0


@dataclass
class BackendConfig:
    """One model on one device, trained in micro-batches."""

    model_path: str  # a local Hugging Face directory (config.json + safetensors) or a hub id
    device: str = "cpu"  # torch device of the model: "cpu", "cuda" (this process's GPU) or "cuda:N"
    dtype: DTypeName = "float32"  # dtype of the master weights and the optimizer state (backends.precision)
    compute_dtype: ComputeDTypeName = "auto"  # matmul dtype; auto: bfloat16 on a GPU, ``dtype`` on a CPU
    logprob_chunk_size: int = 4096  # response positions whose vocabulary logits exist at once; <= 0: all of them
    attn_implementation: str | None = None  # "sdpa", "eager", "flash_attention_2"; None: transformers' default
    micro_train_batch_size: int = 1  # rows per micro-batch in forward_backward (the last one may be smaller)
    micro_forward_batch_size: int = 1  # rows per micro-batch in forward (the last one may be smaller)
    max_tokens_per_microbatch: int = -1  # > 0: cut micro-batches by token budget instead of row count
    remove_padding: bool = True  # pack each micro-batch's real tokens into one row (no compute on padding)
    gradient_checkpointing: bool = True  # recompute activations in backward (Hugging Face checkpointing)
    seed: int = 42  # seeds torch when the backend is built (adapter/head init, dropout)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; available: {', '.join(DTYPES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"unknown compute_dtype {self.compute_dtype!r}; available: {', '.join(COMPUTE_DTYPES)}")
        for name in ("micro_train_batch_size", "micro_forward_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive number of rows, got {getattr(self, name)}")
        if self.max_tokens_per_microbatch == 0 or self.max_tokens_per_microbatch < -1:
            raise ValueError(
                f"max_tokens_per_microbatch must be -1 (off) or positive, got {self.max_tokens_per_microbatch}"
            )
        if self.lora.rank < 0:
            raise ValueError(f"lora.rank must be >= 0 (0 = off), got {self.lora.rank}")
