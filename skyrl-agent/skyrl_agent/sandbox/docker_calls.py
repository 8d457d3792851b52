"""Docker daemon calls that several sandbox modules share: what "unreachable" is, and removal with retries."""

from __future__ import annotations

import logging
import time
from typing import Any

import docker.errors
import requests.exceptions

__all__ = ["REMOVE_BACKOFF_S", "UNREACHABLE", "remove_volume", "retry_remove"]

REMOVE_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)  # waits between force-removal attempts of a container, image or volume
UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError)

log = logging.getLogger(__name__)


def retry_remove(remove: Any, ref: str, what: str) -> bool:
    """Call ``remove(ref, force=True)`` until it succeeds or ``ref`` is gone; False (and a warning) if it stays."""
    error: Exception | None = None
    for attempt, wait_s in enumerate((0.0, *REMOVE_BACKOFF_S)):
        time.sleep(wait_s)
        try:
            remove(ref, force=True)
            return True
        except docker.errors.NotFound:
            return True
        except (docker.errors.APIError, *UNREACHABLE) as exc:
            error = exc
            log.debug("removing %s failed (attempt %d): %s", what, attempt + 1, exc)
    log.warning("%s was not removed after %d attempts: %s", what, len(REMOVE_BACKOFF_S) + 1, error)
    return False


def remove_volume(client: Any, name: str, *, retries: bool = True) -> bool:
    """Force-remove the volume ``name`` (with retries unless told not to); True when it is gone (or was already)."""
    if retries:
        return retry_remove(client.api.remove_volume, name, f"volume {name}")
    try:
        client.api.remove_volume(name, force=True)
    except docker.errors.NotFound:
        pass
    except (docker.errors.APIError, *UNREACHABLE) as exc:
        log.debug("removing volume %s failed: %s", name, exc)
        return False
    return True
