"""Joining or starting the Ray cluster a run's actors live on, and checking it can hold them.

Ray places every role that leaves the trainer's process: training worker groups
(:mod:`skyrl_train.backends.ray_group`) and engine replicas (:mod:`skyrl_train.inference.ray_engines`). A run
describes its actors as :class:`ActorDemand` rows; :func:`ensure_ray` connects and refuses, before any model
loads, a cluster too small for them (an actor Ray cannot place would wait forever instead of failing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ray

__all__ = ["ActorDemand", "ensure_ray"]


@dataclass(frozen=True)
class ActorDemand:
    """``count`` Ray actors asking for ``cpus`` and ``gpus`` each; the keys name the config keys that set them."""

    count: int
    cpus: float
    gpus: float
    what: str  # e.g. "3 training worker groups × trainer.num_training_workers=2"
    cpu_key: str
    gpu_key: str


def ensure_ray(demands: Sequence[ActorDemand]) -> bool:
    """Connect to Ray (``RAY_ADDRESS``'s cluster, else a new local one) and check it can hold every actor.

    Returns whether this call started Ray (the caller then shuts it down). The check runs before any model loads:
    an actor that asks for more than the cluster has would wait forever instead of failing.

    Raises:
        RuntimeError: the actors ask for more CPUs or GPUs than the cluster has; the message says what was asked,
            what exists and which keys to change.
    """
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
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
