"""Find and remove leaked Docker sandboxes by label.

Every managed container and snapshot image carries ``skyrl.managed=1``, ``skyrl.run=<run id>`` and
``skyrl.owner=<pid>:<boot id>:<start ticks>``: the process that created it. The owner is alive only if that PID
exists on this boot *and* started at the same clock tick, so a reused PID or a reboot counts as dead.

:func:`reap` removes what belongs to dead owners (or everything, or one run's). :func:`install_reaper` does that
at start-up, and removes this run's sandboxes at exit and on SIGTERM/SIGINT (then calls the previous handler).
A SIGKILLed run cannot clean up after itself; the next start-up (or ``skyrl-agent reap``) does.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any


@functools.cache
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _start_ticks(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot), or None if there is no such PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after "(comm)" start at field 3


def owner(pid: int | None = None) -> str:
    """The ``skyrl.owner`` label value for ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_boot_id()}:{_start_ticks(pid)}"


def owner_alive(label: str | None) -> bool:
    """Whether the process named by a ``skyrl.owner`` label still runs (unparseable labels count as dead)."""
    try:
        pid_text, boot, ticks = (label or "").split(":")
        pid = int(pid_text)
    except ValueError:
        return False
    return boot == _boot_id() and _start_ticks(pid) == ticks


@functools.cache
def default_run_id() -> str:
    """This process's run id: host, PID and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class ReapReport:
    """Short ids of what :func:`reap` removed."""

    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)


def reap(run_id: str | None = None, *, dead_only: bool = True) -> ReapReport:
    """Remove managed containers, then managed images, whose owner is dead (or all of them if not ``dead_only``).

    Args:
        run_id: only this run's resources (default: every run's).
        dead_only: keep resources whose owning process is alive.

    Raises:
        SandboxUnavailableError: no Docker daemon answered.
    """
    from skyrl_agent.sandbox import docker_backend  # the docker SDK is imported only where it is adapted

    client = docker_backend.connect()
    report = ReapReport()
    try:
        containers, images = docker_backend.list_managed(client, run_id)
        for container in containers:
            if dead_only and owner_alive(container.labels.get("skyrl.owner")):
                continue
            if docker_backend.remove_container(container):
                report.containers.append(container.short_id)
        for image in images:
            if dead_only and owner_alive(image.labels.get("skyrl.owner")):
                continue
            if docker_backend.remove_image(client, image):
                report.images.append(image.short_id)
    finally:
        client.close()
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
