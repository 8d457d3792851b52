"""Who owns a managed Docker object: the labels that say so, owner and run ids, and lease records.

The backend writes them (:mod:`.docker_backend`) and the reaper reads them (:mod:`.reaper`); both import this
module, which imports neither, so that the reaper can be loaded without the docker SDK and the backend without
the reaper. What a lease means (who is alive, when an owner is dead) is the reaper's; see its module docstring.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import uuid
from dataclasses import dataclass

__all__ = [
    "LEASE_LABEL",
    "LEASE_TTL_ENV",
    "LEASE_TTL_LABEL",
    "LEASE_TTL_S",
    "OWNER_LABEL",
    "LeaseRecord",
    "default_run_id",
    "lease_labels",
    "lease_ttl_s",
    "new_owner_id",
]

OWNER_LABEL = "skyrl.owner"
LEASE_LABEL = "skyrl.lease"  # on a lease volume: the owner id it keeps alive
LEASE_TTL_LABEL = "skyrl.lease.ttl"  # seconds the lease lasts after its volume was created
LEASE_TTL_S = 60.0  # default lease length; renewed every quarter of it
LEASE_TTL_ENV = "SKYRL_LEASE_TTL_S"


def lease_ttl_s() -> float:
    """The lease length of new owners: ``$SKYRL_LEASE_TTL_S`` or :data:`LEASE_TTL_S` seconds."""
    ttl = float(os.environ.get(LEASE_TTL_ENV, LEASE_TTL_S))
    if ttl <= 0:
        raise ValueError(f"{LEASE_TTL_ENV} must be a positive number of seconds, got {ttl:g}")
    return ttl


def new_owner_id() -> str:
    """A fresh owner id (``host-pid-random``; usable in a Docker object name)."""
    host = re.sub(r"[^a-zA-Z0-9_.-]", "-", socket.gethostname())
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@functools.cache
def default_run_id() -> str:
    """This process's run id: host, PID and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class LeaseRecord:
    """One lease volume as listed from the daemon."""

    name: str
    owner: str
    created_s: float  # creation time by the daemon's clock, seconds since the epoch
    ttl_s: float


def lease_labels(owner: str, run_id: str, ttl_s: float) -> dict[str, str]:
    """The labels of a lease volume of ``owner``."""
    return {"skyrl.managed": "1", "skyrl.run": run_id, LEASE_LABEL: owner, LEASE_TTL_LABEL: f"{ttl_s:g}"}
