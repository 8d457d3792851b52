"""Batches: one program run against several standard inputs, each in a fresh process forked from one sandboxed run.

:class:`Batch` turns ``CodeExecutor.run_many``'s arguments into one sandboxed job (marshal data read by
``_run_batch`` in ``bootstrap/batch_parent.py``, and the job's limits) and the job's output back into one result
per input.
"""

from __future__ import annotations

import dataclasses
import marshal
import signal
from collections.abc import Sequence
from typing import Final

from skyrl_gym.sandbox.limits import SandboxLimits
from skyrl_gym.sandbox.result import ExecutionResult

__all__ = ["Batch"]

# The marshal format every supported interpreter reads (Python 3.4 and later), whatever runs the library.
_MARSHAL_VERSION: Final = 4
# Bytes of one record's header line, at most (seven integers).
_RECORD_HEADER_BYTES: Final = 160
# Wall-clock slack of the whole job beyond the inputs' own timeouts, in seconds: set-up, and one per input for
# killing and draining.
_JOB_SLACK_S: Final = 5.0


@dataclasses.dataclass(frozen=True)
class Batch:
    """What ``run_many`` runs: ``code`` once per element of ``stdins`` (bytes), after ``setup``, under ``limits``.

    Attributes:
        code: The program, run in each input's process like ``python -c code``.
        stdins: One standard input per run.
        limits: Limits of each input's run; ``timeout_s`` and ``max_output_bytes`` apply per input.
        setup: Source run once, before any input, in the namespace every input's run starts from.
        stop_on_failure: Stop after the first input whose result is not ``ok``.
        max_total_output_bytes: Budget for the output of all inputs together (None: no budget beyond the
            per-input caps): each stream of an input is capped at what is left of it after the earlier inputs.
    """

    code: str
    stdins: tuple[bytes, ...]
    limits: SandboxLimits
    setup: str = ""
    stop_on_failure: bool = False
    max_total_output_bytes: int | None = None

    @classmethod
    def of(
        cls,
        code: str,
        stdins: Sequence[str | bytes],
        limits: SandboxLimits,
        *,
        setup: str = "",
        stop_on_failure: bool = False,
        max_total_output_bytes: int | None = None,
    ) -> Batch:
        """Validate and normalise ``run_many``'s arguments (str inputs are sent as UTF-8)."""
        for name, text in (("code", code), ("setup", setup)):
            if not isinstance(text, str):
                raise TypeError(f"{name} must be a str, got {type(text).__name__}")
        if isinstance(stdins, str | bytes):
            raise TypeError("stdins must be a sequence of inputs, not one str or bytes")
        data = tuple(s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s) for s in stdins)
        if max_total_output_bytes is not None and max_total_output_bytes < 0:
            raise ValueError(f"max_total_output_bytes must be >= 0 or None, got {max_total_output_bytes}")
        return cls(code, data, limits, setup, stop_on_failure, max_total_output_bytes)

    def job(self, *, private_uid: bool) -> tuple[bytes, SandboxLimits]:
        """The job body (see ``bootstrap/batch_parent.py``) and the limits of the one sandboxed run that serves it.

        Args:
            private_uid: The run has a uid of its own, so RLIMIT_NPROC is set; it then counts the batch's own
                process too, and gets one more process so that each input keeps ``max_processes``.
        """
        limits = self.limits
        total = -1 if self.max_total_output_bytes is None else self.max_total_output_bytes
        fields = (self.setup, self.code, list(self.stdins), float(limits.timeout_s), limits.max_output_bytes, total)
        body = marshal.dumps((*fields, self.stop_on_failure), _MARSHAL_VERSION)
        inputs = len(self.stdins)
        output = 2 * limits.max_output_bytes * inputs
        if self.max_total_output_bytes is not None:
            output = min(output, self.max_total_output_bytes + 2 * limits.max_output_bytes)
        job_limits = limits.replace(
            timeout_s=(limits.timeout_s + 1) * inputs + _JOB_SLACK_S,
            max_processes=limits.max_processes + 1 if private_uid else limits.max_processes,
            max_output_bytes=output + _RECORD_HEADER_BYTES * inputs + 1,
        )
        return body, job_limits

    def results(self, output: bytes, job: ExecutionResult) -> list[ExecutionResult]:
        """One result per input that ran, from the job's raw stdout and its own result.

        If the job ended abnormally (an input killed the batch's process, or the whole job hit its deadline),
        the input that was running gets a result carrying the job's exit status and timeout flag, and the list
        ends there.
        """
        results = list(_records(output, job.isolation, len(self.stdins)))
        completed = job.exit_code == 0 and not job.killed
        stopped = self.stop_on_failure and results and not results[-1].ok
        if not completed and len(results) < len(self.stdins) and not stopped:
            exit_code = job.exit_code if job.exit_code != 0 else -signal.SIGKILL
            results.append(dataclasses.replace(job, stdout="", exit_code=exit_code, duration_s=0.0))
        return results


def _records(output: bytes, isolation: str, limit: int) -> list[ExecutionResult]:
    """Parse the complete records in ``output`` (see ``bootstrap/batch_parent.py``), at most ``limit``."""
    results: list[ExecutionResult] = []
    position = 0
    while len(results) < limit:
        end = output.find(b"\n", position)
        fields = output[position:end].split() if end >= 0 else []
        if len(fields) != 7:
            break
        exit_code, timed_out, out_truncated, err_truncated, duration_ns, out_len, err_len = (int(f) for f in fields)
        start = end + 1
        stop = start + out_len + err_len
        if stop > len(output):
            break
        results.append(
            ExecutionResult(
                stdout=output[start : start + out_len].decode(errors="replace"),
                stderr=output[start + out_len : stop].decode(errors="replace"),
                exit_code=exit_code,
                timed_out=bool(timed_out),
                stdout_truncated=bool(out_truncated),
                stderr_truncated=bool(err_truncated),
                duration_s=duration_ns / 1e9,
                isolation=isolation,
            )
        )
        position = stop
    return results
