"""Collation: token-id lists from a generator (or a dataset) → a padded :class:`TrainingBatch`.

Layout (the one :mod:`skyrl_train.backends.base` documents): every row is ``prompt + response``; prompts are
left-padded to the longest prompt ``P`` and responses right-padded to the longest response ``T``, so row ``i``
is ``[pad]*(P - len(prompt_i)) + prompt_i + response_i + [pad]*(T - len(response_i))`` and its response sits in
the last ``T`` positions. Per-token response lists (loss masks, rewards, log-probs) become ``[B, T]`` tensors,
zero-padded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from skyrl_train.backends.base import TrainingBatch


def pad_right(rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[len(rows), width]`` tensor of ``rows``, each zero-padded on the right."""
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {i} has {len(row)} entries, more than the width {width}")
        out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
    return out


def collate(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[float]] | None = None,
    *,
    pad_token_id: int,
    per_token: dict[str, Sequence[Sequence[float]]] | None = None,
) -> TrainingBatch:
    """Pad prompts left and responses right into one :class:`TrainingBatch`.

    Args:
        prompt_ids: Token ids of each row's prompt (at least one token each).
        response_ids: Token ids of each row's response (may be empty).
        loss_masks: Per response token, 1 where the loss applies; defaults to every response token.
        pad_token_id: Filler for padded positions (masked out by ``attention_mask``).
        per_token: Extra per-response-token lists (e.g. ``"rewards"``, ``"rollout_log_probs"``) to put in
            ``batch.tensors`` as ``[B, T]`` float32 tensors.

    Raises:
        ValueError: Lists of different lengths, an empty prompt, or a per-token list that does not match its
            response's length.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    masks = loss_masks if loss_masks is not None else [[1.0] * len(r) for r in response_ids]
    extra = dict(per_token or {})
    for name, rows in {"loss_masks": masks, **extra}.items():
        _check_aligned(name, rows, response_ids)
    width_p = max(len(p) for p in prompt_ids)
    width_t = max(max((len(r) for r in response_ids), default=0), 1)
    input_ids = torch.full((len(prompt_ids), width_p + width_t), pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for i, (prompt, response) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        start = width_p - len(prompt)
        end = width_p + len(response)
        input_ids[i, start:end] = torch.as_tensor(list(prompt) + list(response), dtype=torch.long)
        attention[i, start:end] = 1
    return TrainingBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=pad_right(masks, width_t),
        tensors={name: pad_right(rows, width_t) for name, rows in extra.items()},
    )


def _check_aligned(name: str, rows: Sequence[Sequence[float]], responses: Sequence[Sequence[int]]) -> None:
    if len(rows) != len(responses):
        raise ValueError(f"{name} has {len(rows)} rows for {len(responses)} responses")
    for i, (row, response) in enumerate(zip(rows, responses, strict=True)):
        if len(row) != len(response):
            raise ValueError(f"{name}[{i}] has {len(row)} entries for a response of {len(response)} tokens")


def concat_batches(batches: Sequence[TrainingBatch], pad_token_id: int) -> TrainingBatch:
    """Stack batches collated separately into one with :func:`collate`'s layout.

    Each batch has its own prompt width ``P_i`` and response width ``T_i``; the result re-pads every row to
    ``max P_i`` on the left and ``max T_i`` on the right, exactly as if all rows had been collated together.
    ``tensors`` (``[B_i, T_i]`` each) are zero-padded on the right; every batch must hold the same names.

    Raises:
        ValueError: No batches, or batches whose ``tensors`` have different names.
    """
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    names = list(batches[0].tensors)
    if any(set(b.tensors) != set(names) for b in batches):
        raise ValueError(f"batches carry different tensors: {[sorted(b.tensors) for b in batches]}")
    prompt_width = max(b.input_ids.shape[1] - b.response_length for b in batches)
    response_width = max(b.response_length for b in batches)
    parts = [_repad(b, prompt_width, response_width, pad_token_id) for b in batches]
    return TrainingBatch(
        input_ids=torch.cat([p.input_ids for p in parts]),
        attention_mask=torch.cat([p.attention_mask for p in parts]),
        response_mask=torch.cat([p.response_mask for p in parts]),
        tensors={name: torch.cat([p.tensors[name] for p in parts]) for name in names},
    )


def _repad(batch: TrainingBatch, prompt_width: int, response_width: int, pad_token_id: int) -> TrainingBatch:
    """``batch`` padded to ``prompt_width`` prompt columns (on the left) and ``response_width`` response columns."""
    left = prompt_width - (batch.input_ids.shape[1] - batch.response_length)
    right = response_width - batch.response_length
    pad = torch.nn.functional.pad
    return TrainingBatch(
        input_ids=pad(batch.input_ids, (left, right), value=pad_token_id),
        attention_mask=pad(batch.attention_mask, (left, right), value=0),
        response_mask=pad(batch.response_mask, (0, right), value=0.0),
        tensors={name: pad(t, (0, right), value=0.0) for name, t in batch.tensors.items()},
    )
