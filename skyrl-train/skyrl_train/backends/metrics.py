"""A batch's metrics from its micro-batches' (or ranks'), read back to the host once.

A loss function returns its metrics as 0-dim tensors on the model's device (``LossMetrics``). Reading one into
Python (``.item()``, ``float(t)``) makes the host wait for every kernel queued before it; done once per
micro-batch, the GPU would idle while the host queues the next one. So the backend keeps them as they come and
:func:`combine_metrics` reads them all in one transfer per device, after the last backward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Weighted = Sequence[tuple[torch.Tensor | float, Mapping[str, torch.Tensor | float]]]
"""``(token count, metrics)`` of each micro-batch or rank, in order; counts and values are tensors or floats."""


def host_floats(values: Sequence[torch.Tensor | float]) -> list[float]:
    """Every value as a Python float, the tensors read in one transfer per device (one wait on a GPU).

    Tensors hold one element each; they are read as float64, exact for every float32, bfloat16 and float16 value,
    so each float equals ``float(t)``.
    """
    floats = [0.0 if isinstance(v, torch.Tensor) else float(v) for v in values]
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for index, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            by_device.setdefault(value.device, []).append((index, value))
    for tensors in by_device.values():
        stacked = torch.stack([t.detach().reshape(()).to(torch.float64) for _, t in tensors])
        for (index, _), read in zip(tensors, stacked.tolist(), strict=True):
            floats[index] = read
    return floats


def combine_metrics(weighted: Weighted, totals: Mapping[str, torch.Tensor | float] | None = None) -> dict[str, float]:
    """Micro-batch metrics → the batch's, as floats: ``*_loss`` shares summed, the rest weighted by token counts.

    A token-weighted mean of loss shares would come out too small by about the number of micro-batches (each
    share is already scaled by the whole batch's token count). Means are uniform when every count is 0.
    ``totals`` (values of the whole batch, such as the summed loss) are returned as they are, after the metrics.
    Counts and values may be tensors: all are read back together (:func:`host_floats`).
    """
    totals = totals or {}
    counts = [count for count, _ in weighted]
    values = [value for _, metrics in weighted for value in metrics.values()]
    floats = iter(host_floats([*counts, *values, *totals.values()]))
    read_counts = [next(floats) for _ in counts]
    read = [
        (count, {name: next(floats) for name in metrics})
        for count, (_, metrics) in zip(read_counts, weighted, strict=True)
    ]
    return {**_combine(read), **{name: next(floats) for name in totals}}


def _combine(weighted: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    if not weighted:
        return {}
    if sum(w for w, _ in weighted) <= 0:
        weighted = [(1.0, metrics) for _, metrics in weighted]
    totals: dict[str, float] = {}
    weights: dict[str, float] = {}
    for weight, metrics in weighted:
        for name, value in metrics.items():
            totals[name] = totals.get(name, 0.0) + (1.0 if _is_share(name) else weight) * value
            weights[name] = weights.get(name, 0.0) + weight
    return {
        name: total if _is_share(name) else (total / weights[name] if weights[name] > 0 else 0.0)
        for name, total in totals.items()
    }


def _is_share(name: str) -> bool:
    """Whether a metric is a share of the batch loss (pre-scaled for accumulation), so summed, not averaged."""
    return name.endswith("_loss")
