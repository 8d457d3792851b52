"""Where a role computes: one device setting for every role, and what each role used of it.

``trainer.device`` (``auto``, ``cpu`` or ``cuda``) is the one key. :func:`resolve_device` turns ``auto`` into the GPU
when this process sees one; an FSDP rank or an engine actor resolves the setting again inside its own Ray actor,
where ``cuda`` means the GPU Ray gave that actor (``CUDA_VISIBLE_DEVICES`` holds only it, so it is ``cuda:0``
there). :func:`require_device` fails at start-up, naming the key, when a run asks for a GPU the process cannot see.

Memory: :class:`PeakMemory` records the peak device memory of the calls a role makes (a role's backend resets
the device's peak counter before each call and reads it after), so roles that share a GPU in one process each get
their own figure. On a CPU there is no device counter and nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Literal, get_args

import torch

DeviceName = Literal["auto", "cpu", "cuda"]
DEVICE_NAMES: tuple[str, ...] = get_args(DeviceName)
DEVICE_KEY = "trainer.device"

__all__ = [
    "DEVICE_KEY",
    "DEVICE_NAMES",
    "DeviceName",
    "PeakMemory",
    "describe",
    "device_metrics",
    "require_device",
    "resolve_device",
]


def resolve_device(name: str, *, gpus_reserved: bool = False) -> str:
    """``"cpu"`` or ``"cuda"`` for a ``trainer.device`` value (``cuda:N`` is kept as given).

    ``auto`` is the GPU when this process sees one, or when ``gpus_reserved`` (the role's Ray actors ask for GPUs,
    so they see one even where this driver process does not).

    Raises:
        ValueError: ``name`` is not a device this project runs on.
    """
    if name == "auto":
        return "cuda" if gpus_reserved or torch.cuda.is_available() else "cpu"
    if name == "cpu" or name == "cuda" or name.startswith("cuda:"):
        return name
    raise ValueError(f"{DEVICE_KEY} must be one of {', '.join(DEVICE_NAMES)} (or cuda:N), got {name!r}")


def require_device(device: str, key: str = DEVICE_KEY) -> torch.device:
    """``device`` as a torch device, after checking this process can compute on it.

    Raises:
        RuntimeError: a CUDA device was asked for and this process sees none (or fewer than its index); the message
            names ``key`` and what to change.
    """
    target = torch.device(device)
    if target.type != "cuda":
        return target
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{key}={device} but this process sees no GPU (torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'no'}; CUDA_VISIBLE_DEVICES decides what a process sees): set {key}=cpu, "
            "or install a CUDA build of torch on a machine with a GPU"
        )
    if target.index is not None and target.index >= torch.cuda.device_count():
        raise RuntimeError(
            f"{key}={device} but this process sees {torch.cuda.device_count()} GPU(s): pick an index below that"
        )
    return target


def describe(device: torch.device) -> str:
    """What ``device`` is, for the run's log: ``"cpu"`` or ``"cuda:0 (NVIDIA H200, 139.8 GiB)"``."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return f"cuda:{index} ({props.name}, {props.total_memory / 2**30:.1f} GiB)"


class PeakMemory:
    """The highest device memory (bytes allocated by torch) seen during a role's calls since the last :meth:`take`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0

    @property
    def tracks(self) -> bool:
        """Whether the device has a peak counter (CUDA); on a CPU nothing is recorded."""
        return self.device.type == "cuda"

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Around one call: reset the device's counter, and fold its peak into :attr:`peak` afterwards."""
        if not self.tracks:
            yield
            return
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            self.peak = max(self.peak, int(torch.cuda.max_memory_allocated(self.device)))

    def take(self) -> int:
        """The peak since the last call, in bytes, and start a new window."""
        peak, self.peak = self.peak, 0
        return peak


def device_metrics(device: str, roles: Mapping[str, object]) -> dict[str, float]:
    """``system/device_is_cuda`` and, per role that measures it, ``system/peak_memory_gib/{role}`` since last asked.

    ``roles`` maps a role name (policy, ref, critic) to its backend; a backend measures its peak when it has a
    ``peak_memory_bytes()`` method (the in-process and FSDP backends) and reports a figure above 0 (on a GPU).
    """
    metrics = {"system/device_is_cuda": float(device.startswith("cuda"))}
    for role, backend in roles.items():
        measure = getattr(backend, "peak_memory_bytes", None)
        peak = int(measure()) if callable(measure) else 0
        if peak > 0:
            metrics[f"system/peak_memory_gib/{role}"] = peak / 2**30
    return metrics
