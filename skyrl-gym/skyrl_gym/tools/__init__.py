"""Tool groups for envs.

``tool`` and ``ToolGroup`` are defined in :mod:`skyrl_gym.tools.core`. The concrete groups are imported on first
access, so ``import skyrl_gym.tools`` stays cheap and does not pull in their dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

from skyrl_gym.tools.core import ToolGroup, tool

__all__ = [
    "PythonCodeExecutorToolGroup",
    "SQLCodeExecutorToolGroup",
    "SearchToolGroup",
    "ToolGroup",
    "tool",
]

# Exported name → module that defines it, imported by __getattr__ on first access.
_LAZY_EXPORTS = {
    "PythonCodeExecutorToolGroup": "skyrl_gym.tools.python",
    "SearchToolGroup": "skyrl_gym.tools.search",
    "SQLCodeExecutorToolGroup": "skyrl_gym.tools.sql",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    # Cache it so later lookups skip __getattr__.
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_EXPORTS))
