"""How a run describes its Ray actors before Ray is imported: role specs and cluster-check rows (a leaf).

:mod:`skyrl_train.wiring` fills them from the config; :mod:`skyrl_train.ray_cluster` checks the cluster against
the :class:`ActorDemand` rows and reserves placement-group bundles for the :class:`RoleSpec` roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ActorDemand", "PlacementMode", "RoleSpec"]

PlacementMode = Literal["colocate", "disaggregate"]


@dataclass(frozen=True)
class ActorDemand:
    """``count`` Ray actors asking for ``cpus`` and ``gpus`` each; the keys name the config keys that set them."""

    count: int
    cpus: float
    gpus: float
    what: str  # e.g. "5 training workers (policy 2, ref 1, critic 2)"
    cpu_key: str
    gpu_key: str


@dataclass(frozen=True)
class RoleSpec:
    """One role's actors: ``count`` of them, each asking for ``cpus`` and ``gpus``."""

    name: str  # e.g. "policy", "engines"
    count: int
    cpus: float
    gpus: float = 0.0
