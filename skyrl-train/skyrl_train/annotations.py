"""How a field's type annotation reads in an error message (a leaf: the config loader and the factory share it)."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

__all__ = ["literal_choices", "type_name"]


def type_name(tp: Any) -> str:
    """``tp`` as a message names it: ``one of 'a', 'b'``, ``float | None``, ``list[str]``, ``int``."""
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in get_args(tp))
    if origin is Union or origin is types.UnionType:
        return " | ".join(type_name(a) for a in get_args(tp))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(tp))}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def literal_choices(tp: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` field (or ``Literal | None``) takes; empty for any other type."""
    options = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
    literals = [option for option in options if get_origin(option) is Literal]
    return tuple(choice for literal in literals for choice in get_args(literal)) if literals else ()
