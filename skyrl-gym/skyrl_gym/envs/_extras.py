"""Reading the ``extras`` a built-in text env is constructed with (a dataset row's columns plus ``max_turns``).

Missing required fields raise ``AssertionError`` with the messages skyrl-gym 0.4 used (it checked them with
``assert``), so code that catches that error or matches the messages keeps working. Unlike ``assert``, the
checks here also run under ``python -O``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ground_truth", "require", "turn_budget"]


def require(condition: bool, message: str) -> None:
    """Raise ``AssertionError(message)`` unless ``condition`` holds."""
    if not condition:
        raise AssertionError(message)


def ground_truth(extras: Mapping[str, Any] | None, field: str = "reward_spec") -> Any:
    """Return ``extras[field]["ground_truth"]``.

    Raises:
        AssertionError: ``"{field} field is required"`` when ``field`` is missing, or
            ``"ground_truth is required in {field} field"`` when it has no ``ground_truth``.
    """
    extras = extras or {}
    # Messages are built only on failure: this runs once per episode, on the hot path of make().
    if field not in extras:
        raise AssertionError(f"{field} field is required")
    spec = extras[field]
    if not isinstance(spec, (dict, Mapping)) or "ground_truth" not in spec:
        raise AssertionError(f"ground_truth is required in {field} field")
    return spec["ground_truth"]


def turn_budget(extras: Mapping[str, Any] | None, default: int) -> int:
    """The episode's turn budget: ``extras["max_turns"]``, else ``extras["extra_info"]["max_turns"]``, else ``default``.

    A value of ``None`` counts as absent (the generator may pass ``max_turns=None`` for "use the env default").

    Raises:
        ValueError: The value is not a whole number of at least 1.
    """
    extras = extras or {}
    value = extras.get("max_turns")
    extra_info = extras.get("extra_info")
    if value is None and isinstance(extra_info, Mapping):
        value = extra_info.get("max_turns")
    if value is None:
        return default
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"max_turns must be a whole number >= 1, got {value!r}")
    return int(value)
