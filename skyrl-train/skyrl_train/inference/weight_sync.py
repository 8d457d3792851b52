"""Moving policy weights from a training backend into an inference engine.

Two pieces:

- Serialisation of named tensors (Hugging Face parameter names → tensors) to safetensors bytes or to a file,
  by default under ``/dev/shm`` (RAM-backed, so writing and reading it costs memory bandwidth, not disk I/O).
  Engines whose model lives in another process (vLLM's engine core, a remote server on the same host) receive
  weights this way, because tensors do not survive their RPC arguments.
- :func:`sync_weights`: pause an engine, load the weights, resume it, and report how long it took.

Tensors are always written as CPU tensors; tensors that share storage (tied embeddings in a ``state_dict``) are
copied apart first, since safetensors refuses aliased storage.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from skyrl_train.inference.base import InferenceEngine

NamedTensors = Iterable[tuple[str, torch.Tensor]]
"""``(name, tensor)`` pairs in the policy's Hugging Face parameter naming."""

SHM_DIR = Path("/dev/shm")


@runtime_checkable
class HasWeights(Protocol):
    """Anything exposing its weights the way a ``TrainingBackend`` does."""

    def get_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The parameters in Hugging Face naming."""
        ...


def to_cpu_dict(weights: NamedTensors) -> dict[str, torch.Tensor]:
    """Materialise ``weights`` as contiguous, detached CPU tensors with no two sharing storage."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in weights:
        cpu = tensor.detach().to("cpu").contiguous()
        ptr = cpu.untyped_storage().data_ptr()
        if ptr in seen:  # an alias (e.g. a tied lm_head): safetensors needs its own storage
            cpu = cpu.clone()
        seen.add(cpu.untyped_storage().data_ptr())
        out[name] = cpu
    return out


def serialize_weights(weights: NamedTensors) -> bytes:
    """Encode ``weights`` as safetensors bytes (for transports that only carry bytes)."""
    from safetensors.torch import save

    return bytes(save(to_cpu_dict(weights)))


def deserialize_weights(data: bytes) -> list[tuple[str, torch.Tensor]]:
    """Decode safetensors bytes written by :func:`serialize_weights` into CPU tensors (order not kept)."""
    from safetensors.torch import load

    return list(load(data).items())


def save_weights(weights: NamedTensors, path: str | Path) -> Path:
    """Write ``weights`` to the safetensors file ``path`` (written whole, then renamed into place); return it.

    The rename makes the file appear atomically, so a reader polling for it never sees half a file.
    """
    from safetensors.torch import save_file

    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    save_file(to_cpu_dict(weights), str(partial))
    os.replace(partial, target)
    return target


def load_weights(path: str | Path) -> list[tuple[str, torch.Tensor]]:
    """Read a safetensors file into CPU tensors (order not kept)."""
    from safetensors.torch import load_file

    return list(load_file(str(path)).items())


def default_transfer_dir() -> Path:
    """``/dev/shm`` where it exists (Linux), else the system temporary directory."""
    return SHM_DIR if SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK) else Path(tempfile.gettempdir())


def transfer_path(directory: str | Path | None = None) -> Path:
    """A fresh, unused file path for one weight transfer under ``directory`` (default :func:`default_transfer_dir`)."""
    root = Path(directory) if directory is not None else default_transfer_dir()
    return root / f"skyrl-weights-{os.getpid()}-{uuid.uuid4().hex[:12]}.safetensors"


@contextmanager
def weights_file(weights: NamedTensors, directory: str | Path | None = None) -> Iterator[Path]:
    """Write ``weights`` to a fresh file under ``directory`` (default :func:`default_transfer_dir`).

    Yields the path and deletes the file on exit: the caller owns it only inside the ``with`` block, so a
    receiver must have finished loading before the block ends.
    """
    path = save_weights(weights, transfer_path(directory))
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


async def sync_weights(backend_weights: HasWeights | NamedTensors, engine: InferenceEngine) -> float:
    """Pause ``engine``, load ``backend_weights`` into it, resume it; return the wall time in seconds.

    ``backend_weights`` is a training backend (anything with ``get_weights()``) or the ``(name, tensor)`` pairs
    themselves. Generation calls already running finish on the old weights; calls made while the sync runs
    wait and then use the new ones. The engine is resumed even when loading fails.
    """
    weights = backend_weights.get_weights() if isinstance(backend_weights, HasWeights) else backend_weights
    start = time.perf_counter()
    await engine.pause()
    try:
        await engine.update_weights(weights)
    finally:
        await engine.resume()
    return time.perf_counter() - start
