"""Errors of the sandbox. A snippet that fails is not an error: its traceback is in the result's ``stderr``.

::

    skyrl_gym.error.Error
    └── SandboxError                     the sandbox itself failed; the snippet's outcome is unknown
        ├── SandboxUnavailableError      the requested isolation mode cannot run on this machine
        ├── SandboxStartError            an interpreter did not start (the message carries its stderr)
        └── ExecutorClosedError          run() on a closed CodeExecutor
"""

from __future__ import annotations

from skyrl_gym.error import Error

__all__ = ["ExecutorClosedError", "SandboxError", "SandboxStartError", "SandboxUnavailableError"]


class SandboxError(Error):
    """The sandbox failed to run a snippet; unlike a snippet's own failure, nothing is known about its outcome."""


class SandboxUnavailableError(SandboxError):
    """The requested isolation mode (or interpreter) cannot be used on this machine. Pick another mode."""


class SandboxStartError(SandboxError):
    """A sandboxed interpreter exited or hung before it was ready; the message includes what it printed."""


class ExecutorClosedError(SandboxError):
    """The :class:`~skyrl_gym.sandbox.CodeExecutor` was closed; create a new one."""
