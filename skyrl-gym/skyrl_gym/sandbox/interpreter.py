"""The Python interpreter that sandboxed runs use, and what the sandbox needs to know about it."""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from skyrl_gym.sandbox.bootstrap import bootstrap_text
from skyrl_gym.sandbox.errors import SandboxUnavailableError

__all__ = [
    "SYSTEM_PYTHON",
    "Interpreter",
    "default_python",
    "inspect_interpreter",
    "normalize_interpreter_path",
    "sandbox_env",
]

SYSTEM_PYTHON: Final = "/usr/bin/python3"


@dataclass(frozen=True)
class Interpreter:
    """A Python executable as the sandbox sees it.

    Attributes:
        path: The executable, absolute, its directories resolved (see :func:`normalize_interpreter_path`). The
            file itself is not resolved: a virtual environment's ``bin/python`` stays, so the snippet sees that
            environment's site-packages, as ``python -c`` started from it would.
        roots: Directories it reads at run time (``sys.prefix``, ``sys.base_prefix``, the exec prefixes and the
            directory of the resolved executable); bwrap makes them visible read-only.
        recursion_depth: How deep the bootstrap's recursion probe gets under ``path -c`` (see
            :mod:`skyrl_gym.sandbox.bootstrap`).
    """

    path: str
    roots: tuple[str, ...]
    recursion_depth: int

    def usable_by_any_uid(self) -> bool:
        """Whether an unprivileged uid can run it: its file and every root are world-readable and searchable."""
        return all(_world_accessible(Path(p)) for p in (os.path.realpath(self.path), *self.roots))


def default_python() -> str:
    """The interpreter running this library (``sys.executable``), else the system's ``python3``.

    ``sys.executable`` is the real binary (or a virtual environment's link to it), never a version-manager
    shim, so it starts without the shim's extra ~60 ms.
    """
    return sys.executable or SYSTEM_PYTHON


def normalize_interpreter_path(path: str) -> str:
    """``path`` made absolute with its directory fully resolved (``..``, linked directories); the file name kept.

    Why: bwrap execs the path inside the sandbox, where only the interpreter's own directories exist, so
    ``/tmp/x/../venv/bin/python`` (what ``sys.executable`` is after starting ``../venv/bin/python``) is not found
    there. The last component is kept, not resolved: a virtual environment's ``bin/python`` is a link to the base
    interpreter, and following it would lose the environment. A bare command name (no ``/``) is returned as is.
    """
    if os.sep not in path:
        return path
    directory, name = os.path.split(path)
    return os.path.join(os.path.realpath(directory), name)


def sandbox_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed interpreter: nothing inherited from the caller but ``extra``.

    Args:
        home: The run's private temporary directory, used as ``HOME`` and ``TMPDIR``.
        extra: Variables to add or override.
    """
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
    env.update(extra or {})
    return env


_INSPECT = """
import json, sys
{probe}
roots = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
print(json.dumps({{"roots": roots, "depth": depth}}))
"""


def inspect_interpreter(path: str) -> Interpreter:
    """Start ``path`` once (unsandboxed, running only this module's fixed script) to learn its roots.

    ``path`` is normalised first (:func:`normalize_interpreter_path`); cached per path for the life of the process.

    Raises:
        SandboxUnavailableError: ``path`` does not run or is not a Python 3 interpreter.
    """
    return _inspect(normalize_interpreter_path(path))


@functools.cache
def _inspect(path: str) -> Interpreter:
    probe = _recursion_probe()
    try:
        done = subprocess.run(
            [path, "-c", _INSPECT.format(probe=probe)],
            capture_output=True,
            env=sandbox_env("/tmp"),
            cwd="/",
            timeout=60,
            check=False,
        )
        info = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise SandboxUnavailableError(f"cannot use {path!r} as the sandbox interpreter: {exc}") from exc
    real_dir = os.path.dirname(os.path.realpath(path))
    roots = tuple(dict.fromkeys([*info["roots"], real_dir]))
    return Interpreter(path=path, roots=roots, recursion_depth=int(info["depth"]))


@functools.cache
def _recursion_probe() -> str:
    # The probe text lives in the bootstrap so that both sides run the very same code.
    text = bootstrap_text()
    start = text.index('RECURSION_PROBE = """') + len('RECURSION_PROBE = """')
    return text[start : text.index('"""', start)]


def _world_accessible(path: Path) -> bool:
    """Whether a uid with no relation to the owner can reach ``path`` and read it (or list it, if a directory)."""
    try:
        for parent in reversed(path.parents):
            if not parent.stat().st_mode & stat.S_IXOTH:
                return False
        mode = path.stat().st_mode
    except OSError:
        return False
    needed = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0)
    return mode & needed == needed
