"""What every benchmark records about the machine it ran on, and how its workers read CPU time (standard library only:
the gym worker imports it into upstream's venv too)."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The processor's model name from ``/proc/cpuinfo`` ("" where that is unavailable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def host_info() -> dict[str, Any]:
    """CPU count (total and usable by this process), CPU model and platform string."""
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
    }


def read_cpu_seconds(path: str | None) -> float | None:
    """CPU seconds used so far by the cgroup whose usage file is ``path`` (v1 ``cpuacct.usage`` or v2 ``cpu.stat``)."""
    if not path:
        return None
    with open(path) as file:
        text = file.read()
    if os.path.basename(path) == "cpuacct.usage":
        return int(text) / 1e9
    for line in text.splitlines():
        if line.startswith("usage_usec "):
            return int(line.split()[1]) / 1e6
    raise SystemExit(f"no usage_usec line in {path}")


class Lockstep:
    """A benchmark worker's side of the lockstep protocol: ``@ready``, wait for ``go`` on stdin, then ``@step {json}``.

    The parent runs two workers step by step, alternating which goes first, so both see the same machine load.
    """

    def wait(self) -> None:
        """Announce readiness and block until the parent says ``go``."""
        print("@ready", flush=True)
        line = sys.stdin.readline()
        if line.strip() != "go":
            raise SystemExit(f"stopped by the parent (got {line.strip()!r} instead of 'go')")

    def done(self, record: dict[str, Any]) -> None:
        """Report one step's record to the parent."""
        print("@step " + json.dumps(record), flush=True)
