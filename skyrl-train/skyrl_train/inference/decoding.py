"""Decoding pieces of the local engine that avoid copying the KV cache at every step.

Two copies dominate a transformers decoding step of a small model on a CPU besides the matrix products (measured
with the tiny Qwen2 model, 64 sequences × 64 tokens: together about a fifth of the CPU time):

- ``DynamicLayer`` grows the cache by ``torch.cat`` at every step, copying all of it. :class:`PreallocatedLayer`
  keeps room for the whole generation and writes the new keys and values in place.
- With grouped-query attention and an attention mask (a left-padded batch always has one), transformers' ``sdpa``
  attention repeats the key/value heads (``repeat_kv``, a copy of the cache per layer and step) because some
  devices' kernels need it. :func:`sdpa_attention_gqa` hands the grouped heads to
  ``scaled_dot_product_attention(..., enable_gqa=True)`` instead; the outputs are the same.

Both are exact: logits and samples equal those of the default transformers path (checked by the tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

GQA_SDPA = "skyrl_sdpa_gqa"
"""Name under which :func:`sdpa_attention_gqa` is registered with transformers' attention interfaces."""


def sdpa_attention_gqa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``sdpa`` attention function of transformers, without repeating grouped key/value heads under a mask.

    ``query`` is ``[B, H, q, D]``, ``key``/``value`` ``[B, H_kv, k, D]``; returns ``([B, q, H, D], None)``. Calls that
    transformers would not route through a plain masked ``sdpa`` (no mask, no grouping, a position bias or a paged
    cache) are delegated to transformers' own function unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = kwargs.get("position_bias") is None and kwargs.get("cache") is None
    if attention_mask is None or key.shape[1] == query.shape[1] or not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # With a mask transformers never sets is_causal (the mask carries causality).
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def use_gqa_attention(model: PreTrainedModel) -> bool:
    """Switch ``model`` from ``sdpa`` to :func:`sdpa_attention_gqa` when it uses grouped-query attention.

    Returns whether it switched (models on another attention implementation, or without grouped heads, are left
    as they are). The switch is global to the model object: every later forward pass uses it.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    sdpa = getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation")
    if not sdpa or heads is None or kv_heads == heads:
        return False
    AttentionInterface.register(GQA_SDPA, sdpa_attention_gqa)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)  # the same masks as sdpa
    model.set_attn_implementation(GQA_SDPA)
    return True


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes new keys/values into preallocated room instead of concatenating.

    ``keys``/``values`` are views ``[B, H_kv, length, D]`` of buffers with ``capacity`` positions; when a write would
    overflow, the buffers double (so a wrong capacity costs copies, never correctness).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.capacity = capacity
        self.length = 0
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[B, H_kv, n, D]`` states; return all keys and values so far."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        keys, values = self._room(self._key_buffer, key_states, end), self._room(self._value_buffer, value_states, end)
        keys[:, :, self.length : end] = key_states
        values[:, :, self.length : end] = value_states
        self.length = end
        return self._expose(keys, values)

    def _room(self, buffer: torch.Tensor | None, states: torch.Tensor, end: int) -> torch.Tensor:
        """``buffer``, or a larger copy of it, with at least ``end`` positions."""
        if buffer is not None and buffer.shape[-2] >= end:
            return buffer
        size = max(end, self.capacity) if buffer is None else max(end, 2 * buffer.shape[-2])
        grown = states.new_empty(*states.shape[:-2], size, states.shape[-1])
        if buffer is not None:
            grown[:, :, : self.length] = buffer[:, :, : self.length]
        return grown

    def _expose(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Adopt the buffers; ``keys``/``values`` become views of their first ``length`` positions."""
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        keys, values = key_buffer[:, :, : self.length], value_buffer[:, :, : self.length]
        self.keys, self.values = keys, values
        return keys, values

    def get_seq_length(self) -> int:
        """Positions cached so far."""
        return self.length

    def reset(self) -> None:
        """Drop the cached states and their buffers."""
        self.length = 0
        self._key_buffer = self._value_buffer = None
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        """Not supported: the local engine never crops its cache."""
        raise NotImplementedError("PreallocatedLayer does not support crop")

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Not supported: the local engine never repeats rows of its cache."""
        raise NotImplementedError("PreallocatedLayer does not support batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows at ``indices``."""
        if self._key_buffer is not None and self._value_buffer is not None:
            self._expose(self._key_buffer[indices], self._value_buffer[indices])


def preallocated_cache(model: PreTrainedModel, capacity: int) -> DynamicCache:
    """The cache ``DynamicCache(config=model.config)`` would be, its full-attention layers preallocated.

    ``capacity`` is the number of positions to make room for (prompt width plus new tokens). Layers of other kinds
    (sliding windows, …) stay as transformers builds them.
    """
    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
