"""A served model's weights in memory: new values copied in, and the whole model lent to host memory and back.

:func:`copy_weights` loads ``(name, tensor)`` pairs into a model in place. :class:`HostOffload` moves a model's
parameters and buffers to host memory while a colocated trainer uses the device, and back afterwards, through host
buffers allocated at the first move and reused by every later one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

__all__ = ["HostOffload", "copy_weights"]


@torch.no_grad()
def copy_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy ``(name, tensor)`` pairs (state-dict names, any device/dtype) into ``model``'s parameters and buffers.

    Raises ``KeyError`` for a name the model does not have and ``ValueError`` for a shape mismatch; pairs before the
    bad one are already loaded then.
    """
    # keep_vars=True yields the live Parameters, under every name (tied weights appear under both names).
    targets = model.state_dict(keep_vars=True)
    for name, tensor in weights:
        target = targets.get(name)
        if target is None:
            raise KeyError(f"the model has no parameter {name!r} (expected Hugging Face names)")
        if target.shape != tensor.shape:
            raise ValueError(f"{name}: the model has shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
        target.copy_(tensor.to(device=target.device, dtype=target.dtype))


class HostOffload:
    """Moves a module's parameters and buffers to host memory and back, through host buffers it keeps.

    :meth:`to_host` copies each tensor into a host buffer of its own and makes that buffer the tensor's data, so
    the device memory is freed; :meth:`to_device` copies the data back into fresh device memory. The buffers are
    allocated at the first :meth:`to_host` and reused by every later one (one per parameter or buffer name,
    allocated anew only if its shape or dtype changed). For tensors on a CUDA device they are page-locked: a copy
    from the GPU into pageable memory runs at a fraction of the bus's speed, and allocating pinned memory anew at
    each offload would cost as much again. The copies are asynchronous on the current stream; :meth:`to_host`
    synchronizes before it returns, so the device memory can be handed over at once.

    The buffers belong to this object and hold host memory the size of the module's tensors until it is dropped.
    Tensors held elsewhere than the module's parameters and buffers are not moved (as with ``Module.to``).
    """

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}  # host copies by parameter/buffer name, reused across offloads

    @torch.no_grad()
    def to_host(self, module: nn.Module) -> None:
        """Move ``module``'s tensors into the host buffers; returns once the copies are complete."""
        devices: set[torch.device] = set()  # the CUDA devices copied from
        for name, tensor in _tensors(module):
            pin = tensor.device.type == "cuda"
            if pin:
                devices.add(tensor.device)
            buffer = self.buffers.get(name)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                buffer = self.buffers[name] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
            buffer.copy_(tensor, non_blocking=pin)
            tensor.data = buffer
        for device in devices:
            torch.cuda.synchronize(device)  # the host copies must be complete before their device memory is reused
        if devices:
            torch.cuda.empty_cache()

    @torch.no_grad()
    def to_device(self, module: nn.Module, device: torch.device) -> None:
        """Copy ``module``'s tensors to ``device`` (always a copy: the host buffers stay this object's own)."""
        for _, tensor in _tensors(module):
            tensor.data = tensor.data.to(device, non_blocking=tensor.data.is_pinned(), copy=True)


def _tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of ``module`` once (a tied weight under its first name)."""
    yield from module.named_parameters()
    yield from module.named_buffers()
