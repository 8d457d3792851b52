"""Find and remove leaked Docker sandboxes by label, telling live owners from dead ones by lease.

Every managed container and snapshot image carries ``skyrl.managed=1``, ``skyrl.run=<run id>`` and
``skyrl.owner=<owner id>``: the :class:`~.docker_backend.DockerBackend` that created it. An owner is alive while
it holds a **lease**, and the lease is kept with the daemon, so every process that reaches the daemon gets the
same answer: two runs in different PID namespaces, or on different hosts sharing a remote daemon, never take each
other's live sandboxes for leaked ones.

* A lease is an empty Docker volume labelled ``skyrl.lease=<owner id>``, ``skyrl.run`` and
  ``skyrl.lease.ttl=<seconds>``. The daemon stamps its creation time with its own clock, the only clock expiry
  is judged by.
* The owner renews it every ``ttl / 4`` from a thread of its own: it creates a successor volume, then removes
  the older ones, so one always exists while it renews. Releasing it (``DockerBackend.close``) removes them all.
* A renewal request times out after ``ttl / 8`` and a failed one is retried at once, so one slow or lost request
  costs an eighth of the lease, not all of it. An owner with no successful renewal sent within ``ttl`` knows its
  lease may have expired (``Lease.lapsed``, and an error in the log).
* An owner is alive iff one of its lease volumes was created less than ``ttl`` ago by the daemon's clock. A
  process that was SIGKILLed, is stopped or hung, or lost the daemon, stops renewing: after ``ttl`` its
  containers and images are reapable (``SKYRL_LEASE_TTL_S``, default 60 s).

:func:`reap` removes what belongs to dead owners (or everything, or one run's) and the expired leases. An owner
of containers or images is dead only when it is found dead twice::

    list containers and images, then leases         # an owner's lease exists before its first resource
    suspects = their owners without a live lease
    wait the suspects' renewal period (ttl / 4)     # none when no suspect holds a lease: nothing to wait for
    read the daemon's clock, list leases again      # right before removing
    dead = suspects still without a live lease that created no lease volume in between

so a renewal that lands late (the daemon was slow, the reaper read its clock just before) keeps its owner's
sandboxes. :func:`install_reaper` does that at start-up, and removes this run's sandboxes at exit and on
SIGTERM/SIGINT (then calls the previous handler). A SIGKILLed run cannot clean up after itself; a start-up or a
``skyrl-agent reap`` more than ``ttl`` after its death does.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

# Shared with the backend that writes these labels, and re-exported: callers read them as `reaper.OWNER_LABEL`.
from skyrl_agent.sandbox.ownership import (
    LEASE_LABEL,
    LEASE_TTL_ENV,
    LEASE_TTL_LABEL,
    LEASE_TTL_S,
    OWNER_LABEL,
    LeaseRecord,
    default_run_id,
    lease_labels,
    lease_ttl_s,
    new_owner_id,
)

__all__ = [
    "LEASE_LABEL",
    "LEASE_TTL_ENV",
    "LEASE_TTL_LABEL",
    "LEASE_TTL_S",
    "OWNER_LABEL",
    "LeaseRecord",
    "ReapReport",
    "confirmation_s",
    "default_run_id",
    "install_reaper",
    "lease_labels",
    "lease_ttl_s",
    "live_owners",
    "new_owner_id",
    "reap",
    "survivors",
]


def live_owners(leases: Iterable[LeaseRecord], now_s: float) -> set[str]:
    """The owners holding a lease that has not expired at ``now_s`` (the daemon's clock)."""
    return {lease.owner for lease in leases if now_s < lease.created_s + lease.ttl_s}


def confirmation_s(leases: Iterable[LeaseRecord], suspects: set[str]) -> float:
    """Seconds to wait before confirming that ``suspects`` are dead: the longest renewal period among their leases.

    0 when no suspect holds a lease: an owner without one is not renewing, so waiting could not change the verdict.
    """
    return max((lease.ttl_s / 4 for lease in leases if lease.owner in suspects), default=0.0)


def survivors(
    first: Sequence[LeaseRecord], second: Sequence[LeaseRecord], now_s: float, unsuspected: set[str]
) -> set[str]:
    """The owners to keep after a confirmation wait: live in ``second`` (at ``now_s``), or renewed since ``first``.

    An owner that created a lease volume between the two listings is alive, whatever its stamp says.
    ``unsuspected`` (owners of resources found live in ``first``) are kept too: one listing is not two verdicts.
    """
    seen = {lease.name for lease in first}
    renewed = {lease.owner for lease in second if lease.name not in seen}
    return live_owners(second, now_s) | renewed | unsuspected


@dataclass
class ReapReport:
    """Short ids of the containers and images :func:`reap` removed, and names of the leases."""

    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    leases: list[str] = field(default_factory=list)


def reap(
    run_id: str | None = None, *, dead_only: bool = True, wait: Callable[[float], None] = time.sleep
) -> ReapReport:
    """Remove managed containers, then images, of dead owners (all of them if not ``dead_only``), and their leases.

    An owner is dead when found so twice, before and after a confirmation wait (see the module docstring).

    Args:
        run_id: only this run's resources (default: every run's).
        dead_only: keep resources whose owner's lease is live.
        wait: waits out the confirmation, given in seconds (``time.sleep``).

    Raises:
        SandboxUnavailableError: no Docker daemon answered.
    """
    # Imported here, not at the top: the docker SDK loads only when something is reaped.
    from skyrl_agent.sandbox import docker_backend, docker_leases

    client = docker_backend.connect()
    try:
        containers, images = docker_backend.list_managed(client, run_id)
        if dead_only:
            owners = {_owner_of(resource) for resource in (*containers, *images)}
            leases, alive = _alive_owners(client, run_id, owners, wait)
        else:
            leases, alive = docker_leases.list_leases(client, run_id), set()
        return _remove_unowned(client, containers, images, leases, alive)
    finally:
        client.close()


def _owner_of(resource: Any) -> str:
    return str(resource.labels.get(OWNER_LABEL, ""))


def _alive_owners(
    client: Any, run_id: str | None, owners: set[str], wait: Callable[[float], None]
) -> tuple[list[LeaseRecord], set[str]]:
    """The newest listing of leases and the owners alive by it, among ``owners`` (of resources) and lease holders."""
    from skyrl_agent.sandbox import docker_leases

    # Listed after the resources: a resource listed before has its owner's lease (if live) in this listing. The
    # clock is read before each listing, so a lease created in between is judged by a time before its stamp.
    now_s = docker_leases.daemon_time_s(client)
    first = docker_leases.list_leases(client, run_id)
    live = live_owners(first, now_s)
    suspects = owners - live
    wait_s = confirmation_s(first, suspects)
    if wait_s == 0:
        return first, live
    wait(wait_s)
    now_s = docker_leases.daemon_time_s(client)
    second = docker_leases.list_leases(client, run_id)
    return second, survivors(first, second, now_s, owners - suspects)


def _remove_unowned(
    client: Any, containers: list[Any], images: list[Any], leases: list[LeaseRecord], alive: set[str]
) -> ReapReport:
    """Remove the containers, images and leases whose owner is not in ``alive``."""
    from skyrl_agent.sandbox import docker_backend, docker_calls

    report = ReapReport()
    for container in containers:
        if _owner_of(container) not in alive and docker_backend.remove_container(container):
            report.containers.append(container.short_id)
    for image in images:
        if _owner_of(image) not in alive and docker_backend.remove_image(client, image):
            report.images.append(image.short_id)
    for lease in leases:
        if lease.owner not in alive and docker_calls.remove_volume(client, lease.name):
            report.leases.append(lease.name)
    return report


def install_reaper(run_id: str) -> None:
    """Reap dead runs now; reap ``run_id`` at exit and on SIGTERM/SIGINT (chained to the previous handlers).

    Call it from the main thread (signal handlers can be set only there).
    """
    reap(dead_only=True)
    atexit.register(_reap_quietly, run_id)
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        signal.signal(signum, functools.partial(_on_signal, run_id, previous))


def _reap_quietly(run_id: str) -> None:
    # At exit or in a signal handler there is nobody left to report to (failed removals are logged).
    with contextlib.suppress(Exception):
        reap(run_id, dead_only=False)


def _on_signal(run_id: str, previous: Any, signum: int, frame: FrameType | None) -> None:
    _reap_quietly(run_id)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)  # default action: die of the same signal
        os.kill(os.getpid(), signum)
