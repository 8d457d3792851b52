"""Joining or starting the Ray cluster a run's actors live on, and checking it can hold them.

Ray places every role that leaves the trainer's process: training worker groups
(:mod:`skyrl_train.backends.ray_group`) and engine replicas (:mod:`skyrl_train.inference.ray_engines`). A run
describes its actors as :class:`ActorDemand` rows; :func:`ensure_ray` connects and refuses, before any model
loads, a cluster too small for them (an actor Ray cannot place would wait forever instead of failing).
:class:`Placement` then reserves placement-group bundles for the roles, colocated or disaggregated.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import ray

from skyrl_train.actor_specs import ActorDemand, PlacementMode, RoleSpec

__all__ = ["ActorDemand", "Placement", "PlacementMode", "RoleSpec", "ensure_ray"]


def ensure_ray(demands: Sequence[ActorDemand], address: str | None = None) -> bool:
    """Connect to Ray (``RAY_ADDRESS``'s cluster, else a new local one) and check it can hold every actor.

    ``address`` (the ``ray.address`` key) wins over ``RAY_ADDRESS``; without either a fresh local cluster starts,
    even when another one runs on the machine.

    Returns whether this call started Ray (the caller then shuts it down). The check runs before any model loads:
    an actor that asks for more than the cluster has would wait forever instead of failing.

    Raises:
        RuntimeError: the actors ask for more CPUs or GPUs than the cluster has; the message says what was asked,
            what exists and which keys to change.
    """
    started = not ray.is_initialized()
    if started:
        # "local": a fresh cluster of this machine, never one another process happens to have started.
        address = address or os.environ.get("RAY_ADDRESS") or "local"
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    available = ray.cluster_resources()  # type: ignore[no-untyped-call]
    for resource, per_actor, key in (("CPU", "cpus", "cpu_key"), ("GPU", "gpus", "gpu_key")):
        asked = sum(d.count * getattr(d, per_actor) for d in demands)
        has = float(available.get(resource, 0.0))
        if asked > has + 1e-9:
            if started:
                ray.shutdown()
            parts = "; ".join(f"{d.what} × {getattr(d, key)}={getattr(d, per_actor):g}" for d in demands)
            keys = " or ".join(getattr(d, key) for d in demands)
            raise RuntimeError(
                f"the run's actors ask Ray for {asked:g} {resource}s ({parts}) but the cluster has {has:g}: "
                f"lower {keys}, run fewer actors, or add nodes to the cluster"
            )
    return started


class Placement:
    """Ray placement groups for a run's roles, and the options each actor is started with.

    ``disaggregate``: every role gets a placement group of its own (one bundle per actor, packed onto as few nodes
    as fit), so roles never share a bundle. ``colocate``: one placement group whose bundle ``i`` holds actor ``i``
    of every role that has one (e.g. training rank ``i`` and engine ``i``), sized for those together, so they
    land on the same node and share its devices; roles of different sizes give as many bundles as the largest.

    Raises:
        RuntimeError: the cluster cannot place the bundles within ``timeout_s`` (the message names the roles).
    """

    def __init__(self, roles: Sequence[RoleSpec], mode: PlacementMode, timeout_s: float = 120.0) -> None:
        from ray.util.placement_group import placement_group

        self.mode = mode
        self.groups: dict[str, Any] = {}
        if mode == "disaggregate":
            for role in roles:
                bundles = [_bundle(role.cpus, role.gpus) for _ in range(role.count)]
                self.groups[role.name] = placement_group(bundles, strategy="PACK", name=f"skyrl-{role.name}")
        elif mode == "colocate":
            size = max((role.count for role in roles), default=0)
            bundles = [
                _bundle(sum(r.cpus for r in roles if r.count > i), sum(r.gpus for r in roles if r.count > i))
                for i in range(size)
            ]
            shared = placement_group(bundles, strategy="PACK", name="skyrl-colocated")
            self.groups = {role.name: shared for role in roles}
        else:
            raise ValueError(f"unknown placement {mode!r}; expected 'colocate' or 'disaggregate'")
        self._wait(roles, timeout_s)

    def options(self, role: str, index: int) -> dict[str, Any]:
        """What ``actor.options(...)`` takes for actor ``index`` of ``role``: its placement group and bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self.groups[role], placement_group_bundle_index=index)
        return {"scheduling_strategy": strategy}

    def remove(self) -> None:
        """Release the bundles (idempotent); the actors in them must be stopped first."""
        from ray.util.placement_group import remove_placement_group

        for group in {id(g): g for g in self.groups.values()}.values():
            remove_placement_group(group)
        self.groups = {}

    def _wait(self, roles: Sequence[RoleSpec], timeout_s: float) -> None:
        pending = {id(g): g for g in self.groups.values()}.values()
        ready, _ = ray.wait([g.ready() for g in pending], num_returns=len(pending), timeout=timeout_s)
        if len(ready) < len(pending):
            self.remove()
            asked = ", ".join(f"{r.name}: {r.count} × ({r.cpus:g} CPU, {r.gpus:g} GPU)" for r in roles)
            raise RuntimeError(
                f"Ray could not place the run's actors within {timeout_s:g} s ({self.mode}: {asked}): no node (or "
                "set of nodes) has room for the bundles. Lower the per-actor resources, use "
                "trainer.placement=disaggregate (smaller bundles), or add nodes"
            )


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    bundle = {"CPU": cpus}
    if gpus > 0:
        bundle["GPU"] = gpus
    return bundle
