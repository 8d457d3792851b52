"""A small name → function registry shared by the advantage estimators and the policy losses.

Errors::

    ValueError
     ├── UnknownNameError     a lookup of a name nobody registered (lists the known names, suggests the closest)
     └── DuplicateNameError   a second registration under a name already taken
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable[..., object])


class UnknownNameError(ValueError):
    """No function is registered under the requested name."""


class DuplicateNameError(ValueError):
    """A function is already registered under this name."""


class Registry(Generic[F]):
    """Maps names to functions of one kind (``kind`` names that kind in error messages).

    Registration happens at import time through the ``register`` decorator; lookups happen when a run is configured.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that registers a function under ``name`` and returns it unchanged.

        Raises:
            DuplicateNameError: ``name`` is taken; pick another name or ``unregister`` the old one first.
        """

        def decorate(function: F) -> F:
            if name in self._functions:
                raise DuplicateNameError(
                    f"{self.kind} {name!r} is already registered (by {_qualname(self._functions[name])}); "
                    f"choose another name or unregister the existing one first"
                )
            self._functions[name] = function
            return function

        return decorate

    def get(self, name: str) -> F:
        """The function registered under ``name``.

        Raises:
            UnknownNameError: nothing is registered under ``name``; the message lists what is.
        """
        try:
            return self._functions[name]
        except KeyError:
            raise UnknownNameError(self._unknown_message(name)) from None

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and for replacing a built-in on purpose)."""
        self.get(name)  # raises the same helpful error for an unknown name
        del self._functions[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._functions)

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def _unknown_message(self, name: str) -> str:
        message = f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}"
        close = difflib.get_close_matches(name, self.names(), n=1)
        return f"{message}. Did you mean {close[0]!r}?" if close else message


def _qualname(function: Callable[..., object]) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"
