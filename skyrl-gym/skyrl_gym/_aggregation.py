"""The default ``aggregate_metrics`` of an env class: the mean of every numeric per-episode metric.

Public as :func:`skyrl_gym.metrics.default_aggregate_metrics`. It is defined here, with nothing but the standard
library below it, because the env base class needs it as its default while :mod:`skyrl_gym.metrics` sits above
the registry (it looks up an env's own ``aggregate_metrics``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["default_aggregate_metrics"]


def _is_number(value: object) -> bool:
    # numbers.Real covers int, float, bool and numpy's numeric scalars; complex numbers have no mean we want.
    if isinstance(value, numbers.Real):
        return True
    # numpy.bool_ is not registered as numbers.Real; recognise it (and 0-d arrays) without importing numpy.
    dtype = getattr(value, "dtype", None)
    return getattr(value, "shape", None) == () and getattr(dtype, "kind", "") in ("b", "i", "u", "f")


def default_aggregate_metrics(metrics: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Average every numeric metric over the episodes that report it.

    Booleans count as 0.0/1.0; values that are not real numbers (strings, lists, None) are dropped. A key
    numeric in some episodes only is averaged over those episodes.

    Args:
        metrics: One dict per episode, as returned by ``env.get_metrics()``.

    Returns:
        ``{key: mean}``; ``{}`` when ``metrics`` is empty or holds no numbers.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for episode in metrics:
        for key, value in episode.items():
            if _is_number(value):
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}
