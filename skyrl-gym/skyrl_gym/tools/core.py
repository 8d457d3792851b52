"""Tools: methods an env can call by name, grouped in :class:`ToolGroup` objects.

::

    class Calculator(ToolGroup):
        def __init__(self) -> None:
            super().__init__(name="Calculator")

        @tool
        def add(self, a: int, b: int) -> int:
            return a + b

    Calculator().execute_tool("add", 1, 2)  # 3
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from skyrl_gym import error

__all__ = ["ToolGroup", "tool"]

P = ParamSpec("P")
R = TypeVar("R")


class tool(Generic[P, R]):
    """Mark a method of a :class:`ToolGroup` subclass as a tool named after the method.

    Lower case because it is used as a decorator, like ``property``.

    On an instance the attribute is the ordinary bound method; on the class it is the ``tool`` object itself.

    Attributes:
        func: The undecorated function.
        name: The tool name (the function's ``__name__``).
    """

    def __init__(self, func: Callable[Concatenate[Any, P], R]) -> None:
        self.func = func
        self.name: str = func.__name__
        self.__doc__ = func.__doc__

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> tool[P, R]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> Callable[P, R]: ...

    def __get__(self, instance: object | None, owner: type[Any] | None = None) -> tool[P, R] | Callable[P, R]:
        if instance is None:
            return self
        bound: Callable[P, R] = types.MethodType(self.func, instance)
        return bound

    def __repr__(self) -> str:
        return f"tool({self.name!r})"


class ToolGroup:
    """A named set of tools, found by scanning the class for :class:`tool` attributes.

    Tool names must be unique across the groups of one env, because envs look tools up by name alone.

    Attributes:
        name: The group's name, e.g. ``"PythonCodeExecutorToolGroup"``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tool_registry: dict[str, Callable[..., Any]] = {}
        self._register_tools()

    def _register_tools(self) -> None:
        # The class dictionaries along the MRO, read directly: this finds the `tool` descriptors themselves without
        # running other descriptors (properties) defined on subclasses, as inspect.getattr_static would, at a
        # fraction of its cost (it runs for every env an episode makes). A name is decided by the first class that
        # defines it, so a subclass can hide an inherited tool. Tools register in name order, as dir() lists them.
        found: dict[str, object] = {}
        for klass in type(self).__mro__:
            for attr_name, value in vars(klass).items():
                if attr_name not in found:
                    found[attr_name] = value
        for attr_name in sorted(found):
            value = found[attr_name]
            if isinstance(value, tool):
                self._tool_registry[value.name] = getattr(self, attr_name)

    def get_name(self) -> str:
        """The group's name."""
        return self.name

    def get_tool(self, name: str) -> Callable[..., Any] | None:
        """The bound tool called ``name``, or ``None`` if the group has none."""
        return self._tool_registry.get(name)

    def get_tool_names(self) -> list[str]:
        """The names of the group's tools."""
        return list(self._tool_registry)

    def execute_tool(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the tool ``name`` with the given arguments and return its result.

        Raises:
            skyrl_gym.error.ToolNotFoundError: The group has no such tool (a ``ValueError``).
        """
        func = self._tool_registry.get(name)
        if func is None:
            raise error.ToolNotFoundError(f"Tool '{name}' not found in group '{self.name}'.")
        return func(*args, **kwargs)

    def get_tool_to_group_mapping(self) -> dict[str, str]:
        """Tool name → this group's name, for every tool of the group."""
        return dict.fromkeys(self._tool_registry, self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, tools={self.get_tool_names()})"
