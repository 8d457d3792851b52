"""Log-probabilities and entropy of response tokens without a ``[positions, vocabulary]`` float32 tensor.

A causal LM's head turns ``K`` hidden states into ``K × V`` logits; with a 151,936-token vocabulary and 16k
response positions that is 9.7 GB in float32, held for the backward pass (log-softmax keeps its output). Here the
head is applied ``chunk_size`` positions at a time: each chunk's logits are upcast to float32, reduced to the
chunk's ``[chunk]`` log-probs (and entropies), and dropped. When gradients are needed each chunk is checkpointed,
so backward recomputes its logits instead of storing them: the price is one more head matmul per chunk.

:func:`chunked_head` applies this inside a Hugging Face model call: for the duration of the call the model's
output head computes these statistics instead of logits, so the model's own forward (and FSDP2's hooks on the
root, which gather the head's weight) run unchanged. Models whose logits are transformed after the head
(soft-capping, scaling) or whose head is adapted (LoRA on ``lm_head``) keep the full-logit path:
:func:`supports_chunked_head` says which.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["chunked_head", "supports_chunked_head", "token_stats"]

# Config attributes of models whose logits are changed after the head (Gemma's soft-capping, Cohere's scale).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def token_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 4096,
) -> torch.Tensor:
    """``log softmax(h W^T + b)/T [target]`` (and the entropy) at every position, ``chunk_size`` positions at a time.

    Args:
        hidden: ``[K, H]`` hidden states (any float dtype; the matmul runs in it, or under the caller's autocast).
        weight: ``[V, H]`` head weight.
        bias: ``[V]`` head bias, or None.
        targets: ``[K]`` int64 token ids.
        temperature: logits are divided by it before the softmax.
        with_entropy: also compute the entropy of each position's distribution.
        chunk_size: positions per chunk; ``<= 0`` computes all positions at once and keeps their logits for
            backward (the plain computation).

    Returns:
        ``[K, 1]`` float32 log-probs, or ``[K, 2]`` (log-probs, entropies in nats) with ``with_entropy``.
    """
    size = chunk_size if chunk_size > 0 else max(hidden.shape[0], 1)
    # One chunk of everything is the plain computation: its logits are kept for backward, not recomputed.
    recompute = chunk_size > 0 and torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    parts = []
    for h, t in zip(torch.split(hidden, size), torch.split(targets, size), strict=True):
        if recompute:
            out = checkpoint(_chunk_stats, h, weight, bias, t, temperature, with_entropy, use_reentrant=False)
            parts.append(cast(torch.Tensor, out))
        else:
            parts.append(_chunk_stats(h, weight, bias, t, temperature, with_entropy))
    if not parts:
        return hidden.new_zeros(0, 2 if with_entropy else 1, dtype=torch.float32)
    return torch.cat(parts)


def _chunk_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias).float()  # [c, V]
    if temperature != 1.0:  # x / 1.0 == x exactly: skip a [c, V] copy and its backward
        logits = logits / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normaliser
    if not with_entropy:
        return log_probs.unsqueeze(-1)
    entropy = normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return torch.stack([log_probs, entropy], dim=-1)


def supports_chunked_head(model: nn.Module) -> bool:
    """Whether ``model``'s logits are exactly its output head's (a plain ``nn.Linear``) output."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if type(head) is not nn.Linear:  # None, LoRA-adapted or another head class
        return False
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1.0, 1, 0, 0.0):
            return False
    return True


@contextmanager
def chunked_head(
    model: nn.Module,
    rows: torch.Tensor,
    cols: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    chunk_size: int,
) -> Iterator[None]:
    """While inside, ``model(...).logits`` is :func:`token_stats` of the kept positions ``[rows, cols]``.

    The head's ``forward`` is replaced on the instance for the duration (parameter names, hooks and FSDP2's
    gathering of the head's weight stay as they are). ``rows``/``cols`` index the kept hidden states
    (``[R, n, H]``, what ``logits_to_keep`` selects), ``targets`` are the ``[K]`` tokens they predict.
    """
    head = cast(nn.Linear, cast(Any, model).get_output_embeddings())

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        selected = hidden[rows, cols]  # [K, H]
        return token_stats(
            selected,
            head.weight,
            head.bias,
            targets,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_size=chunk_size,
        )

    head.forward = forward  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        del head.forward  # the class's forward again
