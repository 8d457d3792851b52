"""Aggregation of per-episode env metrics.

After an episode the trainer calls ``env.get_metrics()`` and later aggregates the dicts of all episodes of one
env class with that class's ``aggregate_metrics`` (by default :func:`default_aggregate_metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_gym import error
from skyrl_gym._aggregation import default_aggregate_metrics
from skyrl_gym.envs.registration import load_env_creator, registry, unregistered_env_message

__all__ = ["aggregate_for_environment", "default_aggregate_metrics"]


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
