"""Sandboxed, fast execution of model-written Python.

Every snippet runs in a separate, isolated interpreter, exactly as ``python -c CODE`` would run it (same
output, tracebacks and exit status), under resource limits and a wall-clock timeout::

    from skyrl_gym.sandbox import CodeExecutor, SandboxLimits

    with CodeExecutor(SandboxLimits(timeout_s=5)) as executor:
        result = executor.run("print(input()[::-1])", stdin="abc")
        result.stdout     # 'cba' and a newline
        result.exit_code  # 0

    result = await executor.arun("1/0")  # the same from asyncio; result.stderr holds the traceback
    results = executor.run_many("print(int(input()) * 2)", ["1", "2"])  # one program, several stdins

Speed comes from a warm pool of sandboxed interpreters started (isolation applied, modules preloaded) before they
are needed. By default (for a root caller) each is a fork server that never runs a snippet itself: it forks a
fresh child per run and restores its sandbox afterwards (:mod:`skyrl_gym.sandbox.forkserver`). Otherwise
each interpreter serves one run and exits, and a background thread starts replacements. Either way every run
starts from a clean interpreter, yet a short snippet returns in milliseconds.

Isolation: :func:`isolation_mode` tells which mode this machine gives ("bwrap", "unshare" or "rlimits") and
:func:`isolation_guarantees` what holds in it; :mod:`skyrl_gym.sandbox.isolation` documents each mode, and so
does ``docs/gym/sandbox.md``. :func:`format_python_tool_output` turns a result into the text of skyrl-gym 0.4's
``python`` tool. Errors (the sandbox's own failures only) are in :mod:`skyrl_gym.sandbox.errors`.

Importing this package starts no thread and no process.
"""

from skyrl_gym.sandbox.errors import (
    ExecutorClosedError,
    SandboxError,
    SandboxStartError,
    SandboxUnavailableError,
)
from skyrl_gym.sandbox.executor import DEFAULT_PRELOAD, CodeExecutor, get_default_executor
from skyrl_gym.sandbox.isolation import GUARANTEES, IsolationMode, isolation_guarantees, isolation_mode
from skyrl_gym.sandbox.limits import SandboxLimits
from skyrl_gym.sandbox.result import ExecutionResult, format_python_tool_output

__all__ = [
    "DEFAULT_PRELOAD",
    "GUARANTEES",
    "CodeExecutor",
    "ExecutionResult",
    "ExecutorClosedError",
    "IsolationMode",
    "SandboxError",
    "SandboxLimits",
    "SandboxStartError",
    "SandboxUnavailableError",
    "format_python_tool_output",
    "get_default_executor",
    "isolation_guarantees",
    "isolation_mode",
]
