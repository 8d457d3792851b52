"""What every benchmark records about the machine it ran on (imported by the benchmark scripts)."""

from __future__ import annotations

import os
import platform
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
