"""Aggregation of per-episode env metrics.

After an episode the trainer calls ``env.get_metrics()`` and later aggregates the dicts of all episodes of one
env class with that class's ``aggregate_metrics`` (by default :func:`default_aggregate_metrics`).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_gym import error
from skyrl_gym.envs.registration import load_env_creator, registry, unregistered_env_message

__all__ = ["aggregate_for_environment", "default_aggregate_metrics"]


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


def aggregate_for_environment(env_name: str, metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Aggregate episode metrics with the ``aggregate_metrics`` of the env registered as ``env_name``.

    Resolving a string entry point imports the env's module, but no env is constructed. Entry points without
    an ``aggregate_metrics`` attribute (e.g. plain factory functions) fall back to
    :func:`default_aggregate_metrics`.

    Raises:
        skyrl_gym.error.UnregisteredEnvError: ``env_name`` is not registered (a ``ValueError``).
    """
    env_spec = registry.get(env_name)
    if env_spec is None:
        raise error.UnregisteredEnvError(unregistered_env_message(env_name))
    entry_point = env_spec.entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    aggregate = getattr(creator, "aggregate_metrics", None)
    if aggregate is None:
        return dict(default_aggregate_metrics(metrics))
    result: dict[str, Any] = aggregate(list(metrics))
    return result
