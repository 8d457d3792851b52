"""Methods mixed into vLLM's worker so that a running engine can load new policy weights.

vLLM builds its worker class with this class as an extra base when the engine is created with
``worker_extension_cls="skyrl_train.inference.vllm_worker_ext.WeightUpdateExtension"`` (also the server flag
``--worker-extension-cls``). Its methods then run *inside the worker process*, reached through
``collective_rpc(method_name, args=...)`` on ``LLM``, ``AsyncLLM`` or the server's dev endpoint
``POST /collective_rpc``. This module must stay importable by that dotted path and must not import vLLM at
module level (the worker imports it while vLLM is still initialising).

Every entry point ends in :meth:`WeightUpdateExtension.skyrl_load_weights`, which

1. calls the worker's ``reload_weights(weights_iterator=...)``: unlike ``model.load_weights``, it re-runs the
   post-load processing, which the CPU backend needs because it repacks linear layers at load time and leaves an
   empty ``weight`` parameter behind;
2. re-processes a tied ``lm_head``: with ``tie_word_embeddings`` the reload updates the embedding but leaves the
   CPU backend's repacked copy of the output projection stale, so outputs would silently keep the old weights.
   On CUDA that processing is a no-op.

Transports (how the tensors reach the worker):

- ``skyrl_load_weights(pairs)``: the tensors themselves; only valid when the worker runs in the caller's
  process (vLLM's in-process engine with the single-process executor).
- ``skyrl_load_weights_from_file(path)``: a safetensors file, usually under ``/dev/shm``; works across
  processes on one host, and through the HTTP dev endpoint (which only carries strings).
- ``skyrl_load_weights_from_bytes(data)``: safetensors bytes; crosses process boundaries but is the slowest.
- ``skyrl_load_weights_from_cuda_ipc(payload)``: CUDA IPC handles of tensors that stay on the trainer's GPU
  (colocated trainer and engine on one device); the payload is pickled, see :func:`pack_cuda_ipc`. This path
  needs a CUDA device and is not exercised on CPU-only machines.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast

import torch

from skyrl_train.inference.weight_sync import deserialize_weights, load_weights

EXTENSION_CLASS = "skyrl_train.inference.vllm_worker_ext.WeightUpdateExtension"
"""The dotted path to pass as vLLM's ``worker_extension_cls``."""


class _Worker(Protocol):
    """The parts of vLLM's worker this extension uses."""

    model_runner: Any
    vllm_config: Any

    def reload_weights(self, *args: Any, **kwargs: Any) -> None: ...


class WeightUpdateExtension:
    """Weight-loading methods for vLLM's worker; each returns the seconds spent loading."""

    def skyrl_load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load ``(name, tensor)`` pairs in Hugging Face naming into the running model, in place."""
        worker = cast(_Worker, self)
        start = time.perf_counter()
        worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        _refresh_tied_lm_head(worker)
        return time.perf_counter() - start

    def skyrl_load_weights_from_file(self, path: str) -> float:
        """Load a safetensors file written by ``weight_sync.save_weights``; the caller deletes it afterwards."""
        return self.skyrl_load_weights(load_weights(path))

    def skyrl_load_weights_from_bytes(self, data: bytes) -> float:
        """Load safetensors bytes written by ``weight_sync.serialize_weights``."""
        return self.skyrl_load_weights(deserialize_weights(data))

    def skyrl_load_weights_from_cuda_ipc(self, payload: bytes) -> float:
        """Load tensors shared from another process on the same GPU through CUDA IPC (see :func:`pack_cuda_ipc`).

        The sender must keep its tensors alive until this call returns.
        """
        device = torch.cuda.current_device()
        entries: list[tuple[str, Callable[..., torch.Tensor], tuple[Any, ...]]] = pickle.loads(payload)
        weights = [(name, rebuild(*_on_device(args, device))) for name, rebuild, args in entries]
        return self.skyrl_load_weights(weights)


def pack_cuda_ipc(weights: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """Pickle CUDA IPC handles for ``weights`` for :meth:`skyrl_load_weights_from_cuda_ipc`.

    Only handles travel, not data: the receiver maps the sender's memory, so the tensors must be contiguous
    CUDA tensors that the caller keeps referenced until the receiver has loaded them. The payload is trusted
    input (it is unpickled), exchanged between processes of one training job.
    """
    from torch.multiprocessing.reductions import reduce_tensor

    entries = []
    for name, tensor in weights:
        if not tensor.is_cuda or not tensor.is_contiguous():
            raise ValueError(f"CUDA IPC needs contiguous CUDA tensors; {name!r} is on {tensor.device}")
        rebuild, args = reduce_tensor(tensor.detach())  # type: ignore[no-untyped-call]
        entries.append((name, rebuild, args))
    return pickle.dumps(entries)


def _on_device(args: tuple[Any, ...], device: int) -> tuple[Any, ...]:
    # torch's rebuild_cuda_tensor carries the sender's device index at position 6. The sender and receiver may
    # number the same GPU differently (CUDA_VISIBLE_DEVICES), so the receiver's own index is used.
    if len(args) > 6 and isinstance(args[6], int):
        return (*args[:6], device, *args[7:])
    return args


def _refresh_tied_lm_head(worker: _Worker) -> None:
    """Re-run the output projection's post-load processing when it shares the embedding's weight."""
    hf_config = worker.vllm_config.model_config.hf_text_config
    if not getattr(hf_config, "tie_word_embeddings", False):
        return
    model = worker.model_runner.get_model()
    lm_head = getattr(model, "lm_head", None)
    method = getattr(lm_head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(lm_head)
