"""The precision policy every training path shares: what is kept in which dtype, and where it is computed.

=======================  =====================================================================================
master weights           ``model.dtype`` (float32 by default): the parameters the optimizer updates
AdamW moments            the parameters' dtype (float32 by default)
gradients                the parameters' dtype; FSDP2 reduce-scatters them in float32
forward and backward     ``model.compute_dtype``: ``auto`` is bfloat16 on a GPU and the parameters' dtype on a
                         CPU (CPU bf16 matmuls are slower than fp32 ones here, and fp32 keeps tests exact)
log-probs, entropy       float32, from the compute-dtype hidden states, a chunk of positions at a time
=======================  =====================================================================================

How each path applies it: the in-process backend keeps the master weights in its model and runs forward and
backward under ``torch.autocast`` (matmuls in the compute dtype; norms and softmaxes stay float32). An FSDP2 rank
hands :meth:`PrecisionPolicy.fsdp` to ``fully_shard``: parameters are all-gathered in the compute dtype, gradients
reduced in float32 into float32 shards, so both paths train float32 masters with bfloat16 matmuls.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from skyrl_train.backends.config import COMPUTE_DTYPES

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = ["DTYPES", "PrecisionPolicy"]


@dataclass(frozen=True)
class PrecisionPolicy:
    """Dtypes of one model's training: master weights (``param``), matmuls (``compute``), reductions (``reduce``)."""

    param: torch.dtype
    compute: torch.dtype
    reduce: torch.dtype = torch.float32

    @classmethod
    def of(cls, param_dtype: str, compute_dtype: str, device: torch.device) -> PrecisionPolicy:
        """The policy for a model kept in ``param_dtype`` on ``device``; ``compute_dtype="auto"`` as the table says.

        Raises:
            ValueError: an unknown dtype name.
        """
        if param_dtype not in DTYPES:
            raise ValueError(f"unknown parameter dtype {param_dtype!r}; available: {', '.join(DTYPES)}")
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"unknown compute dtype {compute_dtype!r}; available: {', '.join(COMPUTE_DTYPES)}")
        param = DTYPES[param_dtype]
        if compute_dtype == "auto":
            compute = torch.bfloat16 if device.type == "cuda" else param
        else:
            compute = DTYPES[compute_dtype]
        return cls(param=param, compute=compute)

    @property
    def mixed(self) -> bool:
        """Whether matmuls run in another dtype than the weights are kept in."""
        return self.compute != self.param

    def autocast(self, device: torch.device) -> AbstractContextManager[object]:
        """The in-process path's context for forward passes: autocast to the compute dtype, or nothing."""
        if not self.mixed:
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.compute)

    def fsdp(self) -> MixedPrecisionPolicy:
        """The sharded path's policy: gather parameters in the compute dtype, reduce gradients in ``reduce``."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not self.mixed:
            return MixedPrecisionPolicy()  # compute in the parameters' own dtype
        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=self.reduce)
