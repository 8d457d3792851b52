"""The outcome of one sandboxed run, and the python tool's text for it."""

from __future__ import annotations

import signal
from dataclasses import dataclass

__all__ = ["ExecutionResult", "format_python_tool_output"]

TOOL_ERROR_PREFIX = "Error executing Python code: "


@dataclass(frozen=True)
class ExecutionResult:
    """What a snippet did, reported like ``subprocess.run([python, "-c", code])`` would.

    Attributes:
        stdout: Everything the run wrote to stdout (at most ``max_output_bytes`` of it), decoded as UTF-8 with
            undecodable bytes replaced.
        stderr: The same for stderr; an uncaught exception's traceback is formatted exactly as ``python -c``
            prints it.
        exit_code: The interpreter's exit status; ``-N`` when it died of signal N (``-9`` after a kill by the
            sandbox, ``-24`` (SIGXCPU) when it used up its CPU time).
        timed_out: The wall-clock timeout expired and the sandbox killed the run.
        stdout_truncated: stdout exceeded ``max_output_bytes``; the run was killed at that point.
        stderr_truncated: The same for stderr.
        duration_s: Wall-clock seconds from the start of the snippet to the end of the run.
        isolation: The isolation mode the run used (see :mod:`skyrl_gym.sandbox.isolation`).
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    isolation: str

    @property
    def cpu_limit_exceeded(self) -> bool:
        """The run used up its CPU-time limit: it died of SIGXCPU.

        (A snippet that catches SIGXCPU is killed by SIGKILL one second later, which reads like any other kill.)
        """
        return self.exit_code == -signal.SIGXCPU

    @property
    def killed(self) -> bool:
        """The sandbox killed the run: timeout or an output stream over its cap."""
        return self.timed_out or self.truncated

    @property
    def truncated(self) -> bool:
        """Either output stream was cut at ``max_output_bytes``."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        """The snippet ran to completion and exited with status 0."""
        return self.exit_code == 0 and not self.killed


def format_python_tool_output(result: ExecutionResult, timeout: float) -> str:
    """The exact text skyrl-gym 0.4's ``python`` tool returned for this run.

    That tool ran ``subprocess.run(["python", "-c", code], timeout=timeout)`` and returned the stripped stdout,
    or, when anything was written to stderr, ``"Error executing Python code: "`` + the stripped stderr, or on
    timeout ``"Error executing Python code: Execution timed out after {timeout} seconds."``. A run stopped by
    its CPU-time limit reads as a timeout too: under 0.4 the wall clock was the only limit.

    Args:
        result: The run.
        timeout: The tool's timeout in seconds, printed as given (``10.0`` prints ``10.0``).
    """
    if result.timed_out or result.cpu_limit_exceeded:
        return f"{TOOL_ERROR_PREFIX}Execution timed out after {timeout} seconds."
    if result.stderr:
        return TOOL_ERROR_PREFIX + result.stderr.strip()
    return result.stdout.strip()
