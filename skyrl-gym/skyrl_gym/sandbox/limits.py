"""Per-run resource limits of sandboxed code."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = ["SandboxLimits"]

_MIB = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. All of them are applied to every run, by the parent or inside the sandbox.

    The rlimits (memory, CPU, file size, processes) are set by the interpreter itself just before the snippet
    runs, so a warm interpreter serves runs with any limits.
    """

    timeout_s: float = 10.0  # wall-clock seconds from the start of the snippet until its process group is killed
    memory_mb: int = 1024  # address space of each process in MiB (RLIMIT_AS), interpreter and preloads included
    cpu_s: float | None = None  # CPU seconds per process (RLIMIT_CPU); None: timeout_s rounded up, plus one
    max_processes: int = 64  # processes + threads of the run at once, interpreter included (RLIMIT_NPROC)
    max_output_bytes: int = 1 << 20  # cap on each of stdout and stderr; a run exceeding it is killed
    max_file_mb: int = 64  # largest file the run may write, in MiB (RLIMIT_FSIZE)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.cpu_s is not None and not self.cpu_s > 0:
            raise ValueError(f"cpu_s must be positive or None, got {self.cpu_s}")
        for name in ("memory_mb", "max_processes", "max_output_bytes", "max_file_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def cpu_seconds(self) -> int:
        """The CPU-time limit in whole seconds (RLIMIT_CPU has one-second resolution)."""
        if self.cpu_s is None:
            return math.ceil(self.timeout_s) + 1
        return math.ceil(self.cpu_s)

    def replace(self, **changes: float | int | None) -> SandboxLimits:
        """A copy with some fields changed, e.g. ``limits.replace(timeout_s=2.0)``."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def rlimit_header(self, *, max_processes: bool) -> bytes:
        """The job header line the interpreter reads (see ``bootstrap/serve.py``): bytes, seconds, count, bytes.

        Args:
            max_processes: Whether to send RLIMIT_NPROC. Only a private uid makes it a per-run limit; for a
                shared uid it would count the caller's own processes, so it is then left alone (-1).
        """
        nproc = self.max_processes if max_processes else -1
        fields = (self.memory_mb * _MIB, self.cpu_seconds, nproc, self.max_file_mb * _MIB)
        return " ".join(str(field) for field in fields).encode() + b"\n"
