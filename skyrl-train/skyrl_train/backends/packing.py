"""Micro-batch layout: cutting a batch into micro-batches, and laying a micro-batch out for the model.

A micro-batch reaches the model in one of two layouts (:func:`model_inputs`):

- **padded**: ``[b, N]`` rows with an attention mask, where ``N`` is the batch length minus the leading columns that
  are padding in every row. Position ids count real tokens (``cumsum(mask) − 1``), so a left-padded prompt sees
  the same positions as it would alone.
- **packed** (padding-free): the real tokens of all rows concatenated into one ``[1, N]`` row, with position ids
  restarting at 0 for every sequence and *no* attention mask. Transformers (``masking_utils``; checked with 5.19)
  then derives the sequence boundaries from the position ids: with flash-attention as variable-length offsets,
  with ``sdpa`` and ``eager`` (the CPU implementations) as a block-diagonal causal mask (``N × N`` booleans per
  micro-batch, so a token budget bounds it). That detection only runs when ``attention_mask`` is None and no KV
  cache exists, so the model must be called with ``use_cache=False``: with the default cache the sequences
  silently attend to each other.

Either way the outputs that matter are those at the position before each response token (the logits there
predict it); :class:`ModelInputs` records where they are (``rows``, ``cols``) and scatters per-token results back
to the ``[b, T]`` response grid. Response positions that are padding, or whose predecessor is padding, get 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def require_packed_sequence_support() -> None:
    """Raise a clear error when the installed transformers cannot mask packed sequences by position ids."""
    import transformers
    from transformers import masking_utils

    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        raise RuntimeError(
            f"transformers {transformers.__version__} does not detect packed sequences from position_ids: "
            "set remove_padding=False or upgrade transformers"
        )


@dataclass
class ModelInputs:
    """How one micro-batch is fed to the model and where its response predictions come out.

    ``K`` is the number of response positions with a prediction (``valid.sum()``), in row-major ``(b, t)`` order.
    Laying out reads row lengths into Python (shapes depend on them), so a backend lays micro-batches out on the
    host and moves the result with :meth:`to`: on a GPU, laying out there would wait for the queued kernels.
    """

    input_ids: torch.Tensor  # [R, N] int64: R = b (padded) or 1 (packed)
    position_ids: torch.Tensor  # [R, N] int64: real-token positions, restarting at 0 for every sequence
    attention_mask: torch.Tensor | None  # [R, N] 1 on real tokens (padded); None when packed
    rows: torch.Tensor  # [K] int64: row of the position whose output predicts each response token
    cols: torch.Tensor  # [K] int64: its column; the predicted token is input_ids[rows, cols + 1]
    valid: torch.Tensor  # [b, T] bool: response positions that get a prediction

    @property
    def packed(self) -> bool:
        """Whether the rows were concatenated into one padding-free row."""
        return self.attention_mask is None

    def model_kwargs(self) -> dict[str, torch.Tensor | bool | None]:
        """Keyword arguments of a Hugging Face model call; ``use_cache=False`` keeps packed detection on."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "use_cache": False,
        }

    def targets(self) -> torch.Tensor:
        """``[K]`` int64: the response token each selected position predicts."""
        return self.input_ids[self.rows, self.cols + 1]

    def logits_to_keep(self) -> tuple[int | torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits_to_keep, rows, cols)``: the argument for a causal LM, and where the ``K`` kept logits are.

        Computing the vocabulary projection only where it is needed saves a ``[R, N, V]`` tensor: padded rows keep
        their last ``T + 1`` positions, the packed row keeps exactly the ``K`` selected positions.
        """
        if self.packed:
            return self.cols, self.rows, torch.arange(self.cols.numel(), device=self.cols.device)
        length = self.input_ids.shape[1]
        keep = min(self.valid.shape[1] + 1, length)
        return keep, self.rows, self.cols - (length - keep)

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """Place ``[K]`` per-token values on the ``[b, T]`` response grid, 0 elsewhere (differentiable)."""
        grid = values.new_zeros(self.valid.shape)
        return grid.masked_scatter(self.valid, values)

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> ModelInputs:
        """The same layout on ``device`` (``non_blocking``: an asynchronous copy from pinned host memory)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin(self) -> ModelInputs:
        """The same layout in page-locked host memory, so a copy to a GPU runs asynchronously."""
        return self._map(lambda t: t.pin_memory())

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ModelInputs:
        mask = self.attention_mask
        return ModelInputs(
            input_ids=fn(self.input_ids),
            position_ids=fn(self.position_ids),
            attention_mask=None if mask is None else fn(mask),
            rows=fn(self.rows),
            cols=fn(self.cols),
            valid=fn(self.valid),
        )


def model_inputs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int, *, packed: bool
) -> ModelInputs:
    """Lay out a micro-batch for the model.

    Args:
        input_ids: ``[b, L]`` int64, prompt left-padded and response right-padded.
        attention_mask: ``[b, L]`` 0/1, 1 on real tokens.
        response_length: ``T``; responses occupy the last ``T`` columns.
        packed: concatenate the real tokens into one row instead of keeping padded rows.

    Returns:
        The :class:`ModelInputs`, on the device of ``input_ids``.
    """
    mask = attention_mask.bool()
    length = mask.shape[1]
    valid = _valid_response_positions(mask, response_length)
    batch_idx, t_idx = valid.nonzero(as_tuple=True)
    prev_col = length - response_length + t_idx - 1  # column of the token whose logits predict the response token
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    if packed:
        return _packed(input_ids, mask, positions, valid, batch_idx, prev_col)
    trim = min(_leading_padding(mask), max(length - response_length - 1, 0))
    return ModelInputs(
        input_ids=input_ids[:, trim:],
        position_ids=positions[:, trim:],
        attention_mask=attention_mask[:, trim:],
        rows=batch_idx,
        cols=prev_col - trim,
        valid=valid,
    )


def _packed(
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    valid: torch.Tensor,
    batch_idx: torch.Tensor,
    prev_col: torch.Tensor,
) -> ModelInputs:
    # Index of every (row, column) in the concatenation of the real tokens, row after row.
    packed_index = (mask.flatten().long().cumsum(0) - 1).view(mask.shape)
    ids, pos = input_ids[mask], positions[mask]
    if ids.numel() == 0:
        # No real token at all: run one pad token so the micro-batch still has a (zero) graph to backpropagate.
        ids, pos = input_ids.flatten()[:1], positions.flatten()[:1]
    return ModelInputs(
        input_ids=ids.unsqueeze(0),
        position_ids=pos.unsqueeze(0),
        attention_mask=None,
        rows=torch.zeros_like(batch_idx),
        cols=packed_index[batch_idx, prev_col],
        valid=valid,
    )


def _valid_response_positions(mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """``[b, T]`` bool: the response token is real and so is the token right before it."""
    length = mask.shape[1]
    current = mask[:, length - response_length :]
    previous = torch.zeros_like(current)
    start = length - response_length
    if start > 0:
        previous = mask[:, start - 1 : length - 1]
    else:
        previous[:, 1:] = mask[:, : length - 1]
    return current & previous


def _leading_padding(mask: torch.Tensor) -> int:
    """Number of leading columns that are padding in every row."""
    real_columns = mask.any(0).nonzero()
    return int(real_columns[0]) if real_columns.numel() else mask.shape[1]


def row_costs(attention_mask: torch.Tensor, *, packed: bool) -> list[int]:
    """Tokens each row costs the model: its real tokens (packed), or its span from the first real token (padded)."""
    mask = attention_mask.bool()
    if packed:
        return [int(n) for n in mask.sum(-1).tolist()]
    leading = (mask.long().cumsum(-1) == 0).sum(-1)
    return [int(n) for n in (mask.shape[1] - leading).tolist()]


def split_by_rows(num_rows: int, rows_per_micro_batch: int) -> list[slice]:
    """Consecutive slices of ``rows_per_micro_batch`` rows; the last one may be shorter."""
    return [
        slice(start, min(start + rows_per_micro_batch, num_rows)) for start in range(0, num_rows, rows_per_micro_batch)
    ]


def split_by_tokens(costs: list[int], max_tokens: int, *, packed: bool) -> list[slice]:
    """Consecutive slices whose model cost stays within ``max_tokens``, filled greedily in row order.

    A packed micro-batch costs the sum of its rows' costs, a padded one ``rows × longest row`` (rows are padded to
    the longest). A row that alone exceeds the budget gets a micro-batch of its own.
    """
    slices: list[slice] = []
    start, total, longest = 0, 0, 0
    for index, cost in enumerate(costs):
        new_total, new_longest = total + cost, max(longest, cost)
        new_cost = new_total if packed else new_longest * (index - start + 1)
        if index > start and new_cost > max_tokens:
            slices.append(slice(start, index))
            start, new_total, new_longest = index, cost, cost
        total, longest = new_total, new_longest
    if costs:
        slices.append(slice(start, len(costs)))
    return slices


def even_out(slices: list[slice], count: int) -> tuple[list[slice], int]:
    """``slices`` cut into ``count`` micro-batches: the largest split in halves while one has two rows or more.

    Returns the slices and how many empty micro-batches are still missing (when every slice is down to one row):
    the caller runs those as fully masked rows. For FSDP ranks, which must all run the same number of micro-batches
    (each is a sequence of collectives) though a token budget cuts their shares differently.
    """
    result = list(slices)
    while len(result) < count:
        widest = max(range(len(result)), key=lambda i: result[i].stop - result[i].start, default=None)
        if widest is None or result[widest].stop - result[widest].start < 2:
            break
        cut = result[widest]
        middle = (cut.start + cut.stop) // 2
        result[widest : widest + 1] = [slice(cut.start, middle), slice(middle, cut.stop)]
    return result, count - len(result)
