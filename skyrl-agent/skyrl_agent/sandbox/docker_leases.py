"""A Docker backend's lease: the labelled volume it renews while it lives, and the daemon-side records of leases.

See :mod:`.reaper` for how leases tell live owners from dead ones.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import Any

import docker
import docker.errors

from skyrl_agent.sandbox import ownership
from skyrl_agent.sandbox.base import SandboxUnavailableError
from skyrl_agent.sandbox.docker_calls import UNREACHABLE, remove_volume

__all__ = ["Lease", "daemon_time_s", "list_leases"]

log = logging.getLogger(__name__)


def _renewal_client(timeout_s: float) -> Any:
    """A client of the daemon :func:`connect` reaches whose requests time out after ``timeout_s``: a lease's own."""
    return docker.from_env(timeout=timeout_s, max_pool_size=1)


class Lease:
    """An owner's claim on its containers and images: a labelled volume it renews (see :mod:`.reaper`).

    :meth:`acquire` creates the first volume and starts a daemon thread that renews the lease every ``ttl_s / 4``
    (a successor volume first, then the predecessors go); :meth:`release` stops the thread and removes the
    volumes. Leases still held when the interpreter exits are released then.

    Renewals go through a client of their own whose requests time out after ``request_timeout_s`` (``ttl_s / 8``),
    so a daemon that is slow to answer, or never answers, holds the thread back that long at most, not for a whole
    client timeout. While renewals fail an attempt starts every ``request_timeout_s``, about six of them before the
    lease could expire. Once none has succeeded for ``ttl_s``, :attr:`lapsed` is true, an error is logged, and the
    reaper of any process may remove the owner's sandboxes.

    Args:
        run_id: the ``skyrl.run`` label of the lease volumes.
        ttl_s: seconds the lease lasts after its newest volume was created (by the daemon's clock).
        connect_renewals: makes the client renewals go through, given its request timeout in seconds (default: a
            client from the environment, as :func:`connect` makes); it is made on the first renewal.
    """

    def __init__(
        self, run_id: str, ttl_s: float, *, connect_renewals: Callable[[float], Any] = _renewal_client
    ) -> None:
        self.owner = ownership.new_owner_id()
        self.run_id = run_id
        self.ttl_s = ttl_s
        self.request_timeout_s = ttl_s / 8
        self._connect_renewals = connect_renewals
        self._client: Any = None  # the caller's, for the first volume and the release
        self._renewer: Any = None  # the lease's own, for renewals
        self._volumes: list[str] = []  # newest first
        self._renewals = 0
        self._renewed_at = -math.inf  # time.monotonic() when the request of the newest volume was sent
        self._lapse_logged = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        """Whether the lease was acquired and not released."""
        return self._thread is not None

    @property
    def lapsed(self) -> bool:
        """Whether the held lease may have expired: no renewal sent less than ``ttl_s`` ago has succeeded.

        The daemon stamps a volume after its request was sent, so by the daemon's clock the lease lasts at least
        ``ttl_s`` after the send; past that, this owner's sandboxes may have been reaped.
        """
        return self.held and time.monotonic() - self._renewed_at >= self.ttl_s

    def acquire(self, client: Any) -> None:
        """Create the lease with ``client`` and start renewing it.

        Raises:
            SandboxUnavailableError: the daemon refused or did not answer.
        """
        self._client = client
        try:
            self._create_successor(client)
        except (docker.errors.DockerException, *UNREACHABLE) as exc:
            raise SandboxUnavailableError(f"could not create the lease volume of {self.owner}: {exc}") from exc
        self._stop.clear()
        self._thread = threading.Thread(target=self._keep, name=f"skyrl-lease-{self.owner}", daemon=True)
        self._thread.start()
        _hold(self)

    def renew(self) -> None:
        """Create a successor volume through the renewal client, then remove the older ones (those that fail stay).

        Raises:
            docker.errors.DockerException, requests.exceptions.RequestException: the daemon refused, or did not
                answer within ``request_timeout_s``.
        """
        if self._renewer is None:
            self._renewer = self._connect_renewals(self.request_timeout_s)
        self._create_successor(self._renewer)

    def release(self) -> None:
        """Stop renewing and remove the lease volumes; idempotent (a volume that stays expires on its own)."""
        thread, self._thread = self._thread, None
        _HELD.discard(self)
        self._stop.set()
        if thread is not None:
            thread.join()  # a renewal in flight ends within its request timeout
        with self._lock:
            self._volumes = [volume for volume in self._volumes if not remove_volume(self._client, volume)]
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.close()

    def _create_successor(self, client: Any) -> None:
        with self._lock:
            self._renewals += 1
            name = f"skyrl-lease-{self.owner}-{self._renewals}"
            labels = ownership.lease_labels(self.owner, self.run_id, self.ttl_s)
            sent = time.monotonic()
            try:
                client.volumes.create(name=name, driver="local", labels=labels)
            except BaseException:
                self._volumes.append(name)  # a request that timed out may still be carried out: removed later
                raise
            self._renewed_at = sent
            older, self._volumes = self._volumes, [name]
            self._volumes += [volume for volume in older if not remove_volume(client, volume, retries=False)]

    def _keep(self) -> None:
        wait_s = self.ttl_s / 4
        while not self._stop.wait(wait_s):
            started = time.monotonic()
            if self._try_renew():
                wait_s = self.ttl_s / 4
            else:  # the next attempt starts one request timeout after this one did (at once after a timeout)
                wait_s = max(0.0, self.request_timeout_s - (time.monotonic() - started))

    def _try_renew(self) -> bool:
        try:
            self.renew()
        except (docker.errors.DockerException, *UNREACHABLE) as exc:
            if not self.lapsed:
                log.warning("renewing the lease of %s failed (%s); retrying", self.owner, exc)
            elif not self._lapse_logged:
                self._lapse_logged = True
                log.error(
                    "the lease of %s may have expired: no renewal succeeded for %g s (last error: %s); other runs'"
                    " reapers may remove its sandboxes", self.owner, self.ttl_s, exc,
                )  # fmt: skip
            return False
        if self._lapse_logged:
            self._lapse_logged = False
            log.warning("the lease of %s was renewed after it had lapsed; its sandboxes may be gone", self.owner)
        return True


_HELD: weakref.WeakSet[Lease] = weakref.WeakSet()


def _hold(lease: Lease) -> None:
    if not _HELD:
        atexit.unregister(_release_held)  # registered once
        atexit.register(_release_held)
    _HELD.add(lease)


def _release_held() -> None:
    """Release the leases nobody closed (a backend dropped without ``close``): their volumes need no reaper."""
    for lease in list(_HELD):
        with contextlib.suppress(Exception):  # at exit there is nobody to report to
            lease.release()


def list_leases(client: Any, run_id: str | None) -> list[ownership.LeaseRecord]:
    """The lease volumes (of ``run_id`` when given), for the reaper; an unreadable one counts as expired.

    The daemon stamps a volume to the whole second, rounded down; such a stamp is read as the end of its second,
    so that a lease never expires earlier than ``ttl`` after its volume was made.
    """
    filters = [ownership.LEASE_LABEL] + ([f"skyrl.run={run_id}"] if run_id else [])
    leases = []
    for volume in client.volumes.list(filters={"label": filters}):
        labels = volume.attrs.get("Labels") or {}
        try:
            stamp = volume.attrs["CreatedAt"]
            created_s = datetime.fromisoformat(stamp).timestamp() + (0.0 if "." in stamp else 1.0)
            ttl_s = float(labels[ownership.LEASE_TTL_LABEL])
        except (KeyError, ValueError):
            created_s, ttl_s = 0.0, 0.0
        leases.append(ownership.LeaseRecord(volume.name, labels.get(ownership.LEASE_LABEL, ""), created_s, ttl_s))
    return leases


def daemon_time_s(client: Any) -> float:
    """The daemon's clock in seconds since the epoch (leases are timed by it, whatever the caller's clock says)."""
    return datetime.fromisoformat(client.info()["SystemTime"]).timestamp()
