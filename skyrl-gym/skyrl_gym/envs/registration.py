"""The env registry: ids mapped to entry points, imported only when an env is made.

``register(id="gsm8k", entry_point="skyrl_gym.envs.gsm8k.env:GSM8kEnv")`` records a string; the module is imported
by the first ``make("gsm8k", ...)``. ``registry`` is a plain ``dict`` of id → :class:`EnvSpec`, so
``"gsm8k" in registry`` and ``registry["gsm8k"]`` work as expected.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from skyrl_gym import error
from skyrl_gym.core import Env

__all__ = [
    "EnvCreator",
    "EnvSpec",
    "deregister",
    "load_env_creator",
    "make",
    "pprint_registry",
    "register",
    "registry",
    "spec",
]

EnvCreator = Callable[..., Env[Any, Any]]
"""Anything that builds an env from keyword arguments, normally the env class."""


@dataclasses.dataclass
class EnvSpec:
    """How to build one registered env.

    Attributes:
        id: The registry key, e.g. ``"gsm8k"``.
        entry_point: ``"module.path:AttrName"`` (imported lazily) or a callable returning an :class:`Env`.
        kwargs: Default keyword arguments for the entry point; ``make`` deep-copies them, then applies its own.
        name: Same as ``id`` (kept for Gymnasium-style code that reads ``spec.name``).
    """

    id: str
    entry_point: EnvCreator | str | None = None
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    name: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.name = self.id

    def make(self, **kwargs: Any) -> Env[Any, Any]:
        """Build an env from this spec; same as ``skyrl_gym.make(self, **kwargs)``."""
        return make(self, **kwargs)

    def to_json(self) -> str:
        """Serialise the spec as JSON.

        Raises:
            ValueError: The entry point is a callable, or ``kwargs`` is not JSON-serialisable.
        """
        if callable(self.entry_point):
            raise ValueError(
                f"Cannot serialise env spec {self.id!r} to JSON: its entry point is a callable "
                f"({self.entry_point!r}); register a 'module.path:AttrName' string instead."
            )
        try:
            return json.dumps({"id": self.id, "entry_point": self.entry_point, "kwargs": self.kwargs})
        except TypeError as exc:
            raise ValueError(f"Cannot serialise the kwargs of env spec {self.id!r} to JSON: {exc}") from exc

    @staticmethod
    def from_json(json_env_spec: str) -> EnvSpec:
        """Rebuild a spec written by :meth:`to_json` (a ``name`` field, if present, is ignored)."""
        fields = json.loads(json_env_spec)
        fields.pop("name", None)
        return EnvSpec(**fields)

    def pprint(self, disable_print: bool = False, include_entry_points: bool = False) -> str | None:
        """Describe the spec as ``key=value`` lines.

        Args:
            disable_print: Return the text instead of printing it.
            include_entry_points: Add the ``entry_point`` line.

        Returns:
            The text when ``disable_print`` is true, else ``None``.
        """
        lines = [f"id={self.id}"]
        if include_entry_points:
            lines.append(f"entry_point={self.entry_point}")
        if self.kwargs:
            lines.append(f"kwargs={self.kwargs}")
        text = "\n".join(lines)
        if disable_print:
            return text
        print(text)
        return None


registry: dict[str, EnvSpec] = {}
"""Every registered env, by id."""


def unregistered_env_message(env_id: str, known: Mapping[str, EnvSpec] | None = None) -> str:
    """The error message for an unknown id: the 0.4 wording, the registered ids and a close match if any."""
    known_ids = sorted(registry if known is None else known)
    message = f"No registered env with id: {env_id}."
    close = difflib.get_close_matches(env_id, known_ids, n=1)
    if close:
        message += f" Did you mean {close[0]!r}?"
    listed = ", ".join(known_ids) if known_ids else "(none)"
    return f"{message} Registered ids: {listed}."


def register(id: str, entry_point: EnvCreator | str | None = None, kwargs: dict[str, Any] | None = None) -> None:
    """Register an env under ``id``.

    Args:
        id: The id for :func:`make`; must not be registered already.
        entry_point: ``"module.path:AttrName"`` (imported by the first :func:`make`) or a callable.
        kwargs: Default keyword arguments for the entry point.

    Raises:
        skyrl_gym.error.RegistrationError: ``id`` is already registered (call :func:`deregister` first).
        skyrl_gym.error.InvalidEntryPointError: ``entry_point`` is missing or malformed.
    """
    _check_entry_point(id, entry_point)
    if id in registry:
        raise error.RegistrationError(
            f"Env id {id!r} is already registered (entry point {registry[id].entry_point!r}); "
            "call deregister() first to replace it."
        )
    registry[id] = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(kwargs or {}))


def _check_entry_point(env_id: str, entry_point: object) -> None:
    if entry_point is None:
        raise error.InvalidEntryPointError(f"Env {env_id!r} needs an entry point; got None.")
    if isinstance(entry_point, str):
        module, sep, attr = entry_point.partition(":")
        if not (module and sep and attr):
            raise error.InvalidEntryPointError(
                f"Entry point {entry_point!r} of env {env_id!r} is not of the form 'module.path:AttrName'."
            )
    elif not callable(entry_point):
        raise error.InvalidEntryPointError(
            f"Entry point of env {env_id!r} must be a 'module.path:AttrName' string or a callable; "
            f"got {type(entry_point).__name__}."
        )


def deregister(id: str) -> None:
    """Remove ``id`` from the registry.

    Raises:
        skyrl_gym.error.UnregisteredEnvError: ``id`` is not registered (an ``error.Error``).
    """
    if id not in registry:
        raise error.UnregisteredEnvError(unregistered_env_message(id))
    del registry[id]


def spec(env_id: str) -> EnvSpec:
    """The spec registered under ``env_id``.

    Raises:
        skyrl_gym.error.UnregisteredEnvError: ``env_id`` is not registered.
    """
    found = registry.get(env_id)
    if found is None:
        raise error.UnregisteredEnvError(unregistered_env_message(env_id))
    return found


def load_env_creator(name: str) -> EnvCreator:
    """Import and return the object named by ``"module.path:AttrName"`` (``AttrName`` may be dotted).

    Raises:
        ImportError: The module cannot be imported (a note names the entry point).
        AttributeError: The module has no such attribute.
    """
    module_name, _, attr_path = name.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        exc.add_note(f"while loading env entry point {name!r}")
        raise
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise AttributeError(f"Env entry point {name!r}: {target!r} has no attribute {attr!r}")
        target = getattr(target, attr)
    creator: EnvCreator = target
    return creator


def make(id: str | EnvSpec, **kwargs: Any) -> Env[Any, Any]:
    """Build a new env.

    The registered ``kwargs`` are deep-copied and then updated with ``kwargs``, so an env can never mutate the
    registry's defaults. Built-in envs take ``env_config`` and ``extras``.

    Args:
        id: A registered id or an :class:`EnvSpec`.
        **kwargs: Keyword arguments for the entry point, e.g. ``env_config=..., extras={...}``.

    Returns:
        The env, with ``env.spec`` set to the spec it was made from (with the merged kwargs).

    Raises:
        skyrl_gym.error.UnregisteredEnvError: ``id`` is not registered.
        TypeError: The entry point rejected the arguments; the message names the env id.
        skyrl_gym.error.InvalidEnvError: The entry point returned something that is not an :class:`Env`.
    """
    env_spec = id if isinstance(id, EnvSpec) else spec(id)
    # Most specs register no default kwargs: then the call's own dict (built afresh by **) is the whole of them.
    env_kwargs = copy.deepcopy(env_spec.kwargs) | kwargs if env_spec.kwargs else kwargs
    creator = _resolve_creator(env_spec)
    try:
        env = creator(**env_kwargs)
    except TypeError as exc:
        raise TypeError(
            f"{exc} (raised while making env {env_spec.id!r} with keyword arguments {sorted(env_kwargs)})"
        ) from exc
    if not isinstance(env, Env):
        raise error.InvalidEnvError(
            f"Entry point of env {env_spec.id!r} returned {type(env).__name__}, which is not a skyrl_gym.Env."
        )
    env.spec = EnvSpec(id=env_spec.id, entry_point=env_spec.entry_point, kwargs=env_kwargs)
    return env


def _resolve_creator(env_spec: EnvSpec) -> EnvCreator:
    entry_point = env_spec.entry_point
    if entry_point is None:
        raise error.InvalidEntryPointError(f"Env {env_spec.id!r} is registered without an entry point.")
    if isinstance(entry_point, str):
        # Resolved once per entry point: importlib's lookups dominate the cost of make() otherwise.
        creator = _CREATORS.get(entry_point)
        if creator is None:
            creator = _CREATORS[entry_point] = load_env_creator(entry_point)
        return creator
    return entry_point


_CREATORS: dict[str, EnvCreator] = {}


def pprint_registry(
    print_registry: Mapping[str, EnvSpec] = registry,
    *,
    num_cols: int = 3,
    disable_print: bool = False,
) -> str | None:
    """Show the registered ids in a sorted grid of ``num_cols`` columns.

    Args:
        print_registry: The registry to show (defaults to the global one).
        num_cols: Ids per row.
        disable_print: Return the text instead of printing it.

    Returns:
        The text when ``disable_print`` is true, else ``None``.
    """
    ids = sorted(print_registry)
    if not ids:
        text = "(no registered envs)"
    else:
        width = max(len(env_id) for env_id in ids) + 2
        cols = max(1, num_cols)
        rows = [ids[i : i + cols] for i in range(0, len(ids), cols)]
        text = "\n".join("".join(env_id.ljust(width) for env_id in row).rstrip() for row in rows)
    if disable_print:
        return text
    print(text)
    return None
