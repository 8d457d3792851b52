"""Token entropy of the policy and the entropy bonus."""

from __future__ import annotations

from typing import cast

import torch
from torch.utils.checkpoint import checkpoint

from skyrl_train.algorithms.reductions import LossReduction, reduce_loss


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """``H = logsumexp(z) − Σ_v softmax(z)_v z_v`` over the last dimension, in float32."""
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy of the categorical distribution at every position, ``chunk_size`` positions at a time.

    A float32 softmax over a large vocabulary for every token of a batch costs ``B·T·V`` floats; chunking bounds
    the temporary to ``chunk_size·V``. When gradients are needed each chunk is checkpointed, so its softmax is
    recomputed in the backward pass instead of being stored.

    Args:
        logits: ``[..., V]`` float (any float dtype; computed in float32).
        chunk_size: positions per chunk.

    Returns:
        ``[...]`` float32 entropy in nats.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    chunks = []
    for chunk in torch.split(flat, chunk_size):
        if needs_grad:
            chunks.append(cast(torch.Tensor, checkpoint(_entropy, chunk, use_reentrant=False)))
        else:
            chunks.append(_entropy(chunk))
    entropy = torch.cat(chunks) if chunks else flat.new_zeros(0, dtype=torch.float32)
    return entropy.reshape(logits.shape[:-1])


def entropy_bonus(
    entropy: torch.Tensor,
    loss_mask: torch.Tensor,
    entropy_coef: float = 0.01,
    reduction: LossReduction = "token_mean",
    *,
    token_weights: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """The entropy term to ADD to the loss: ``−coef · H̄``, so minimising the loss raises entropy.

    The exploration bonus of PPO's combined objective (Schulman et al., arXiv 1707.06347, eq. 9).

    Args:
        entropy: ``[B, T]`` float per-token entropy (``entropy_from_logits``), carrying the graph.
        loss_mask: ``[B, T]`` 0/1.
        entropy_coef: the bonus weight.
        reduction: how ``H̄`` averages tokens; ``token_weights`` (from ``loss_weights``) override it.
        token_weights: ``[B, T]`` float precomputed reduction weights.
        max_seq_len: for ``seq_mean_token_sum_norm``.

    Returns:
        0-dim tensor.
    """
    mean_entropy = reduce_loss(entropy, loss_mask, reduction, token_weights=token_weights, max_seq_len=max_seq_len)
    return -entropy_coef * mean_entropy
