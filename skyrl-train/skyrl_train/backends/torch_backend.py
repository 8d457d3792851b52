"""The in-process torch backend: one Hugging Face model and its AdamW optimizer on one device.

It implements :class:`~skyrl_train.backends.base.TrainingBackend` for tests, CPU runs and single-GPU runs; the
Ray/FSDP2 backend implements the same protocol across processes.

Micro-batching: a batch is cut into micro-batches of ``micro_*_batch_size`` rows, or by a token budget
(``max_tokens_per_microbatch``); each is laid out padded or packed (:mod:`skyrl_train.backends.packing`). In
``forward_backward`` each micro-batch's loss is back-propagated right after its forward pass (so one micro-batch's
activations are alive at a time) and the gradients add up in ``.grad``: the loss function scales its losses for
accumulation, so nothing here divides by the number of micro-batches. Nothing is read back to the host between
micro-batches (a read waits for the GPU to finish what is queued): layouts are computed on the host before the loop,
and losses, token counts and metrics are read together after it (:mod:`skyrl_train.backends.metrics`).

Extensions of the protocol (all keyword arguments with defaults, so callers of the protocol are unaffected):
``forward(..., with_entropy=False)``, :meth:`TorchBackend.export_hf`, and ``global_step``.

Checkpoint layout written by :meth:`TorchBackend.save` (written to a hidden sibling directory, then renamed into
place, so ``path`` never holds a half-written checkpoint)::

    model.safetensors   module state in the backend's own naming (with LoRA: PEFT names, base + adapters)
    optimizer.pt        AdamW state
    scheduler.pt        lr scheduler state
    rng.pt              torch CPU (and CUDA) generator states
    backend.json        global step and the config it was written with
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

import torch
from safetensors.torch import load_model, save_file, save_model
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from skyrl_train.algorithms.entropy import entropy_from_logits
from skyrl_train.backends.base import LossFn, LossMetrics, ModelOutput, TrainingBatch
from skyrl_train.backends.config import BackendConfig, OptimizerConfig
from skyrl_train.backends.lora import apply_lora, merged_weights, unwrap
from skyrl_train.backends.metrics import combine_metrics
from skyrl_train.backends.packing import (
    ModelInputs,
    model_inputs,
    require_packed_sequence_support,
    row_costs,
    split_by_rows,
    split_by_tokens,
)
from skyrl_train.backends.precision import DTYPES, PrecisionPolicy
from skyrl_train.backends.token_stats import chunked_head, supports_chunked_head
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.devices import PeakMemory, require_device

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from transformers import PreTrainedModel

B = TypeVar("B", bound="TorchBackend")
P = ParamSpec("P")
T = TypeVar("T")
Movable = TypeVar("Movable", TrainingBatch, ModelInputs)


def _on_compute_thread(method: Callable[Concatenate[B, P], T]) -> Callable[Concatenate[B, P], T]:
    """Run ``method`` on the backend's compute thread when it has one (see :class:`TorchBackend`)."""

    @functools.wraps(method)
    def run(self: B, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self.compute is None:
            return method(self, *args, **kwargs)
        return self.compute.call(method, self, *args, **kwargs)

    return run


class TorchBackend:
    """A causal LM policy trained in this process; see the module docstring for layout and checkpoints.

    Building it seeds torch's global generator with ``config.seed`` (adapter init and dropout draw from it), loads
    the model onto ``config.device``, and creates the optimizer and scheduler. The backend owns the model; tensors
    it returns are detached. With ``compute`` (owned by the caller) the methods that compute (``forward``,
    ``forward_backward``, ``optim_step``, ``save``, ``load``, ``export_hf``) run on that thread, the caller waiting
    for them; without it they run on the calling thread.
    """

    def __init__(self, config: BackendConfig, compute: ComputeThread | None = None) -> None:
        self.config = config
        self.compute = compute
        self.device = require_device(config.device)
        self.precision = PrecisionPolicy.of(config.dtype, config.compute_dtype, self.device)
        self.memory = PeakMemory(self.device)  # peak device memory of this role's calls (CUDA only)
        if config.remove_padding:
            require_packed_sequence_support()
        torch.manual_seed(config.seed)
        model = self._load_model()
        if config.gradient_checkpointing:
            # Non-reentrant checkpointing works with frozen inputs (LoRA) without forcing input gradients.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if config.lora.enabled:
            model = apply_lora(model, config.lora, extra_trainable=self._extra_trainable_modules())
        self.model: nn.Module = self._distribute(model.to(self.device))
        self.optimizer = torch.optim.AdamW(
            self.trainable_parameters(),
            lr=config.optimizer.lr,
            betas=config.optimizer.betas,
            weight_decay=config.optimizer.weight_decay,
            eps=config.optimizer.eps,
        )
        self.scheduler = make_scheduler(self.optimizer, config.optimizer)
        self.global_step = 0  # optimizer steps taken (skipped non-finite steps included)
        self._host_buffers: HostBuffers = {}  # pinned host copies of the AdamW moments, reused by every offload

    # --- model-specific hooks (the critic overrides these) ---

    def _load_model(self) -> Any:
        """The Hugging Face model, in ``config.dtype``, on the CPU."""
        from transformers import AutoModelForCausalLM

        check_model_path(self.config.model_path)
        return AutoModelForCausalLM.from_pretrained(self.config.model_path, **self._load_kwargs())

    def _load_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dtype": DTYPES[self.config.dtype]}
        if self.config.attn_implementation is not None:
            kwargs["attn_implementation"] = self.config.attn_implementation
        return kwargs

    def _distribute(self, model: nn.Module) -> nn.Module:
        """The model as this backend trains it: unchanged here; an FSDP2 worker shards it (``backends.fsdp``)."""
        return model

    def _extra_trainable_modules(self) -> Sequence[str]:
        """Submodules trained in full even with LoRA (none for a policy)."""
        return ()

    def _micro_output(self, inputs: ModelInputs, temperature: float, with_entropy: bool) -> ModelOutput:
        """Log-probs ``[b, T]`` (and entropy ``[b, T]``) of one micro-batch laid out on the device.

        With a plain output head the vocabulary logits exist a chunk of positions at a time
        (:mod:`~skyrl_train.backends.token_stats`); otherwise the ``[K, V]`` logits are computed whole.
        """
        keep, rows, cols = inputs.logits_to_keep()
        targets = inputs.targets()
        with self._compute_context():
            if self._chunked:
                chunk = self.config.logprob_chunk_size
                with chunked_head(
                    unwrap(self.model),
                    rows,
                    cols,
                    targets,
                    temperature=temperature,
                    with_entropy=with_entropy,
                    chunk_size=chunk,
                ):
                    stats = self.model(**inputs.model_kwargs(), logits_to_keep=keep).logits  # [K, 1 or 2]
                entropy = inputs.scatter(stats[:, 1]) if with_entropy else None
                return ModelOutput(log_probs=inputs.scatter(stats[:, 0]), entropy=entropy)
            logits = self.model(**inputs.model_kwargs(), logits_to_keep=keep).logits[rows, cols]  # [K, V]
        logits = logits.float()
        if temperature != 1.0:  # x / 1.0 == x exactly: skip a [K, V] copy and its backward
            logits = logits / temperature
        log_probs = inputs.scatter(token_log_probs(logits, targets))
        entropy = inputs.scatter(entropy_from_logits(logits)) if with_entropy else None
        return ModelOutput(log_probs=log_probs, entropy=entropy)

    @functools.cached_property
    def _chunked(self) -> bool:
        """Whether log-probs come from the chunked head (``logprob_chunk_size`` > 0 and a plain head)."""
        return self.config.logprob_chunk_size > 0 and supports_chunked_head(unwrap(self.model))

    def _compute_context(self) -> AbstractContextManager[object]:
        """Forward passes run under the precision policy's autocast (an FSDP2 rank casts through its sharding)."""
        return self.precision.autocast(self.device)

    def _layouts(self, batch: TrainingBatch, slices: list[slice]) -> list[ModelInputs]:
        """Each micro-batch's layout, computed where ``batch`` is and then moved to the model's device.

        Laying out reads row lengths into Python: on the host (where the trainer keeps its batches) that waits for
        nothing, so the micro-batch loop that follows reads nothing back.
        """
        packed = self.config.remove_padding
        micro_batches = [batch.select(rows) for rows in slices]
        layouts = [model_inputs(m.input_ids, m.attention_mask, m.response_length, packed=packed) for m in micro_batches]
        return [self._to_device(layout) for layout in layouts]

    # --- the TrainingBackend protocol ---

    @_on_compute_thread
    @torch.no_grad()
    def forward(self, batch: TrainingBatch, *, temperature: float = 1.0, with_entropy: bool = False) -> ModelOutput:
        """Log-probabilities ``[B, T]`` of the response tokens under ``softmax(logits / temperature)``, no gradient.

        Runs in eval mode, ``micro_forward_batch_size`` rows (or the token budget) at a time. Returns tensors on
        the device of ``batch.input_ids``; response positions that are padding (or follow padding) hold 0.
        """
        _check_call(batch, temperature)
        self.model.eval()
        cut, slices = self._plan(batch, self.config.micro_forward_batch_size)
        with self.memory.measure():
            outputs = [self._micro_output(inputs, temperature, with_entropy) for inputs in self._layouts(cut, slices)]
            return _concat_outputs(outputs, batch.input_ids.device, rows=len(batch))

    @_on_compute_thread
    def forward_backward(
        self, batch: TrainingBatch, loss_fn: LossFn, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, float]:
        """Add the gradients of ``loss_fn`` over the batch's micro-batches to the parameters' ``.grad``.

        Returns floats, read after the last micro-batch: the loss function's metrics combined as ``LossFn`` says
        (``*_loss`` shares summed, the rest weighted by ``response_mask`` tokens), and ``loss``: the sum of the
        micro-batch losses (pre-scaled, so the sum is the batch loss). The last micro-batch may be short:
        pre-scaled losses do not depend on how the rows are cut (a batch of step-wise rows has any number of rows).
        """
        _check_call(batch, temperature)
        self.model.train()
        batch, slices = self._plan(batch, self.config.micro_train_batch_size)
        # Counted where the caller keeps the batch (the host, for the trainer), read with the metrics at the end.
        counts = [batch.response_mask[rows].sum() for rows in slices]
        weighted: list[tuple[torch.Tensor | float, LossMetrics]] = []
        losses: list[torch.Tensor] = []
        with self.memory.measure():
            layouts = self._layouts(batch, slices)
            on_device = self._to_device(batch)
            for rows, inputs, count in zip(slices, layouts, counts, strict=True):
                micro_batch = on_device.select(rows)
                loss, metrics = loss_fn(self._micro_output(inputs, temperature, with_entropy), micro_batch)
                torch.autograd.backward(loss)
                losses.append(loss.detach())
                weighted.append((count, metrics))
            return combine_metrics(weighted, totals={"loss": torch.stack(losses).sum()})

    @_on_compute_thread
    def optim_step(self) -> dict[str, float]:
        """Clip the gradient norm, step AdamW and the scheduler, zero the gradients.

        A non-finite gradient norm skips the AdamW update (weights and moments untouched) and reports
        ``skipped = 1``; the scheduler still advances, so the schedule follows the trainer's step count.

        Returns:
            ``grad_norm`` (before clipping), ``lr`` (the rate this step used) and ``skipped`` (0 or 1).
        """
        with self.memory.measure():
            return self._optim_step()

    def _optim_step(self) -> dict[str, float]:
        max_norm = self.config.optimizer.max_grad_norm
        clip_to = max_norm if max_norm is not None and max_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), clip_to)
        # Over sharded (DTensor) gradients the norm is a DTensor too; its full value is the global norm.
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        lr = float(self.scheduler.get_last_lr()[0])
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        return {"grad_norm": grad_norm, "lr": lr, "skipped": float(skipped)}

    @_on_compute_thread
    def offload_optimizer(self) -> None:
        """Move the AdamW moments to host memory until :meth:`reload_optimizer` (a model on CPU: nothing to do).

        For a colocated run: the engines generate in the memory the moments held during training.
        """
        if self.device.type != "cpu":
            move_optimizer_state(self.optimizer, torch.device("cpu"), self._host_buffers)

    @_on_compute_thread
    def reload_optimizer(self) -> None:
        """Move the moments back to the model's device (before the next optimizer step)."""
        if self.device.type != "cpu":
            move_optimizer_state(self.optimizer, self.device)

    def get_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(Hugging Face name, tensor)`` pairs of the model, LoRA merged, tied weights once.

        Tensors are detached and on the backend's device. Unadapted ones are views of the live parameters: valid
        until the next :meth:`optim_step`; copy them to keep them.
        """
        return merged_weights(self.model)

    @_on_compute_thread
    def save(self, path: Path) -> None:
        """Write model, optimizer, scheduler, RNG states and step under ``path``; replaces it atomically."""
        with _atomic_directory(Path(path)) as tmp:
            save_model(self.model, str(tmp / "model.safetensors"))
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(_rng_state(), tmp / "rng.pt")
            state = {"global_step": self.global_step, "config": asdict(self.config)}
            (tmp / "backend.json").write_text(json.dumps(state, indent=2))

    @_on_compute_thread
    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote; the backend must be built with the same model and LoRA config."""
        path = Path(path)
        if not (path / "backend.json").is_file():
            raise FileNotFoundError(f"{path} is not a backend checkpoint (no backend.json); was it written by save()?")
        missing, unexpected = load_model(self.model, str(path / "model.safetensors"), strict=False)
        if missing or unexpected:
            raise ValueError(
                f"checkpoint {path} does not match this model (missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}): build the backend with the config it was saved with"
            )
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True))
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        _set_rng_state(torch.load(path / "rng.pt", weights_only=True))
        self.global_step = int(json.loads((path / "backend.json").read_text())["global_step"])

    # --- beyond the protocol ---

    @_on_compute_thread
    def export_hf(self, path: Path, tokenizer_path: str | Path | None = None) -> None:
        """Write a Hugging Face model directory (LoRA merged) that transformers and vLLM load; atomic.

        Args:
            path: the directory to create or replace.
            tokenizer_path: where to read the tokenizer from; defaults to ``config.model_path``.
        """
        from transformers import AutoTokenizer

        hf_model = cast("PreTrainedModel", unwrap(self.model))
        config = copy.deepcopy(hf_model.config)
        config.architectures = [_architecture(hf_model)]
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or self.config.model_path))
        weights = {name: t.detach().to("cpu").contiguous() for name, t in self.get_weights()}
        with _atomic_directory(Path(path)) as tmp:
            config.save_pretrained(tmp)
            generation_config = getattr(hf_model, "generation_config", None)
            if generation_config is not None:
                generation_config.save_pretrained(tmp)
            save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            tokenizer.save_pretrained(tmp)

    def has_active_dropout(self) -> bool:
        """Whether a training-mode forward can differ from :meth:`forward`: dropout (or noise) with a positive rate.

        Looks at dropout modules (LoRA's included) and at the model config's rates: dropout applied functionally
        without a module (``attention_dropout``, ``*_pdrop``) and training-mode router noise of mixture-of-experts
        models (``router_jitter_noise``). The trainer skips the separate old-log-prob pass only when this is False.
        """
        dropouts = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
        if any(isinstance(m, dropouts) and m.p > 0 for m in self.model.modules()):
            return True
        config = getattr(unwrap(self.model), "config", None)
        rates = config.to_dict() if config is not None else {}
        return any(_is_noise_rate(name) and _is_number(value) and value > 0 for name, value in rates.items())

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters the optimizer updates (all of them, or the adapters and extra modules with LoRA)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def peak_memory_bytes(self) -> int:
        """Peak device memory of this backend's calls since the last time it was asked (0 on a CPU)."""
        return self.memory.take()

    def _to_device(self, tensors: Movable) -> Movable:
        """A batch or layout on the model's device; from pinned host memory when going to a GPU (asynchronously)."""
        if self.device.type == "cuda" and tensors.input_ids.device.type == "cpu":
            return tensors.pin().to(self.device, non_blocking=True)
        return tensors.to(self.device)

    def _plan(self, batch: TrainingBatch, rows_per_micro_batch: int) -> tuple[TrainingBatch, list[slice]]:
        """The batch to cut and its micro-batches (an FSDP rank may append fully masked rows; see ``backends.fsdp``)."""
        return batch, self._micro_slices(batch, rows_per_micro_batch)

    def _micro_slices(self, batch: TrainingBatch, rows_per_micro_batch: int) -> list[slice]:
        budget = self.config.max_tokens_per_microbatch
        if budget > 0:
            packed = self.config.remove_padding
            return split_by_tokens(row_costs(batch.attention_mask, packed=packed), budget, packed=packed)
        return split_by_rows(len(batch), rows_per_micro_batch)


def _architecture(model: nn.Module) -> str:
    """The Hugging Face class name of ``model``, also when FSDP2 has swapped in its ``FSDP<name>`` subclass."""
    classes = type(model).__mro__
    return next((c.__name__ for c in classes if c.__module__.startswith("transformers.")), type(model).__name__)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[target]`` at every position: ``[K, V]`` float logits, ``[K]`` int64 → ``[K]``."""
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def make_scheduler(optimizer: torch.optim.Optimizer, config: OptimizerConfig) -> LRScheduler:
    """The Hugging Face schedule ``config.scheduler`` (a ``LambdaLR``) over ``optimizer``.

    ``constant``: ``lr``. ``constant_with_warmup``: ``lr · s / warmup`` for step ``s < warmup``, then ``lr``.
    ``linear``/``cosine``: the same warm-up, then a linear or half-cosine decay to 0 at ``total_steps``.
    """
    from transformers import get_scheduler

    return cast(
        LRScheduler,
        get_scheduler(
            config.scheduler,
            optimizer,
            num_warmup_steps=config.num_warmup_steps,
            num_training_steps=config.total_steps,
        ),
    )


def check_model_path(model_path: str) -> None:
    """Fail early, naming the path, when a local-looking model path is not a model directory."""
    path = Path(model_path).expanduser()
    # A hub id is "name" or "org/name"; anything else is a local path.
    looks_local = path.is_absolute() or model_path.startswith((".", "~")) or model_path.count("/") > 1 or path.exists()
    if looks_local and not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no Hugging Face model at {model_path} (expected {path / 'config.json'}); for tests and CPU runs build "
            "the tiny model there with skyrl_train.models.tiny.build_tiny_model(path)"
        )


def _is_noise_rate(config_key: str) -> bool:
    return "dropout" in config_key or config_key.endswith("pdrop") or "jitter" in config_key


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_call(batch: TrainingBatch, temperature: float) -> None:
    """Reject a temperature or a batch layout the backend would otherwise mis-read silently."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    rows, length = batch.input_ids.shape
    if rows == 0:
        raise ValueError("the batch is empty")
    if batch.attention_mask.shape != batch.input_ids.shape:
        raise ValueError(f"attention_mask {tuple(batch.attention_mask.shape)} != input_ids {(rows, length)}")
    if batch.response_mask.shape[0] != rows or not 0 < batch.response_length <= length:
        raise ValueError(
            f"response_mask {tuple(batch.response_mask.shape)} must be [{rows}, T] with 0 < T <= {length}: "
            "responses are the last T positions of input_ids"
        )
    for name, tensor in batch.tensors.items():
        if tensor.shape[0] != rows:
            raise ValueError(f"batch.tensors[{name!r}] has {tensor.shape[0]} rows, the batch {rows}")


def _concat_outputs(outputs: list[ModelOutput], device: torch.device, rows: int | None = None) -> ModelOutput:
    """Stack micro-batch outputs along rows, on ``device``; only the first ``rows`` when given (the rest: padding)."""

    def cat(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
        if any(p is None for p in parts):
            return None
        return torch.cat([cast(torch.Tensor, p) for p in parts])[:rows].to(device)

    log_probs = cat([o.log_probs for o in outputs])
    assert log_probs is not None
    return ModelOutput(
        log_probs=log_probs,
        entropy=cat([o.entropy for o in outputs]),
        values=cat([o.values for o in outputs]),
    )


HostBuffers = dict[tuple[int, str], torch.Tensor]


def move_optimizer_state(
    optimizer: torch.optim.Optimizer, device: torch.device, host_buffers: HostBuffers | None = None
) -> None:
    """Move every per-parameter state tensor of ``optimizer`` to ``device``, in place, except scalar ones.

    Scalars (AdamW's ``step``) stay where the optimizer keeps them: on the host unless it is capturable or fused,
    and it refuses a ``step`` on the GPU otherwise. With ``host_buffers``, GPU tensors (the local shards of sharded
    ones: an FSDP2 rank offloads the same way) go to the host into page-locked buffers kept there for the next
    offload (a copy from the GPU into pageable memory runs at a tenth of the bus's speed, and allocating pinned
    memory anew each time costs as much again); the way back copies from them asynchronously.
    """
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = _moved(value, device, host_buffers, (id(state), key))
    if device.type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()  # the host copies must be complete before their GPU memory is reused
        torch.cuda.empty_cache()


def _moved(
    value: torch.Tensor, device: torch.device, host_buffers: HostBuffers | None, slot: tuple[int, str]
) -> torch.Tensor:
    if host_buffers is None or device.type != "cpu" or value.device.type != "cuda":
        return value.to(device, non_blocking=device.type == "cpu" or value.is_pinned())
    return _to_host(value, host_buffers, slot)


def _to_host(value: torch.Tensor, host_buffers: HostBuffers, slot: tuple[int, str]) -> torch.Tensor:
    """``value`` copied asynchronously into ``host_buffers[slot]``, a host buffer reused while shape and dtype match.

    The buffer is made on first use, page-locked when ``value`` is on a GPU. A sharded moment (a DTensor, on an
    FSDP2 rank) copies its local shard and comes back a DTensor over the same mesh and placements, as the optimizer
    expects it on reload.
    """
    sharded = _as_dtensor(value)
    local = value if sharded is None else sharded.to_local()
    buffer = host_buffers.get(slot)
    if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype:
        buffer = host_buffers[slot] = torch.empty(local.shape, dtype=local.dtype, pin_memory=local.is_cuda)
    buffer.copy_(local, non_blocking=True)
    if sharded is None:
        return buffer
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        buffer, sharded.device_mesh, sharded.placements, run_check=False, shape=sharded.shape, stride=sharded.stride()
    )


def _as_dtensor(value: torch.Tensor) -> DTensor | None:
    """``value`` as a DTensor when it is one (imported only then: a plain tensor needs no torch.distributed)."""
    if type(value) is torch.Tensor:
        return None
    from torch.distributed.tensor import DTensor

    return value if isinstance(value, DTensor) else None


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def _atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``path`` by rename, on error it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
