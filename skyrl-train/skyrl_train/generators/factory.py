"""The plug-in point for generators other than :class:`SkyRLGymGenerator`: ``generator.factory`` in a run config.

A run builds its generator with the function named by ``generator.factory`` (``"package.module:function"``),
called with one :class:`GeneratorContext` and the ``generator.factory_kwargs`` mapping as keywords::

    generator:
      factory: skyrl_agent.integrations.train_factory:swe_generator
      factory_kwargs: {backend: docker, max_turns: 20}

    # the run then calls
    generator = swe_generator(context, backend="docker", max_turns=20)

The function returns anything satisfying the :class:`~skyrl_train.generators.base.Generator` protocol. This module
imports nothing of the packages that provide factories: skyrl-train knows generators only through the protocol.

Typed settings (optional): a factory whose attribute ``settings_type`` is a dataclass declares that its keyword
arguments are that dataclass's fields. :func:`check_factory` (so config validation, before any model loads) then
builds it from ``generator.factory_kwargs`` and reports every problem: an unknown key (with the nearest field), a
value of the wrong type, and what the dataclass's own ``__post_init__`` raises. The factory turns its keywords into
the same dataclass with :func:`build_settings`::

    def swe_generator(context: GeneratorContext, **kwargs: Any) -> Generator:
        settings = build_settings(SWEGeneratorConfig, kwargs)   # FactoryError listing every problem
        ...

    swe_generator.settings_type = SWEGeneratorConfig

Field types :func:`build_settings` checks: ``bool``, ``int``, ``float`` (an ``int`` is taken as a float), ``str``,
``None``, ``Literal[...]``, unions of these (``int | None``), ``Any``; another class by ``isinstance`` (a generic
such as ``list[str]`` by its container only).

Lifecycle (both optional, found by duck typing):

- :class:`PausableGenerator` (``async pause()`` / ``async resume()``): the run pauses the generator around every
  weight sync, its ``pause`` before the engine pauses and its ``resume`` after the engine resumes, so time spent
  syncing can be kept out of the generator's own deadlines. The run gets this by giving the factory a
  :class:`GeneratorPauseLink` as ``context.engine``; a generator may pause that same engine inside its ``pause``
  (the link then pauses only the engine beneath it, never the generator a second time).
- ``close()`` (a coroutine function or a plain one): called once when the run ends, also when it fails after the
  generator was built. The generator closes what it created (sandboxes, pools); the run closes the engine.
- ``timeline`` (an attribute): set to the run's :class:`~skyrl_train.timeline.Timeline`, to record spans into.

Errors: :func:`load_factory`, :func:`build_settings` and :func:`check_factory` raise / report :class:`FactoryError`
(a ``ValueError``) naming the ``generator.factory`` or ``generator.factory_kwargs`` key and what to change.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import importlib
import inspect
import re
import types
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    Protocol,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    runtime_checkable,
)

from skyrl_train.annotations import literal_choices, type_name
from skyrl_train.generators.base import Generator
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig
from skyrl_train.inference.base import EngineLoad, GenerationOutput, InferenceEngine, SamplingParams, load_of

if TYPE_CHECKING:
    import torch

__all__ = [
    "FACTORY_KEY",
    "FACTORY_KWARGS_KEY",
    "SETTINGS_ATTRIBUTE",
    "FactoryError",
    "FactorySettings",
    "GeneratorContext",
    "GeneratorFactory",
    "GeneratorPauseLink",
    "PausableGenerator",
    "build_generator",
    "build_settings",
    "check_factory",
    "load_factory",
    "settings_problems",
]

FACTORY_KEY = "generator.factory"
FACTORY_KWARGS_KEY = "generator.factory_kwargs"
SETTINGS_ATTRIBUTE = "settings_type"  # the factory's attribute naming the dataclass of its keyword arguments
_S = TypeVar("_S")
_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


class FactoryError(ValueError):
    """``generator.factory`` cannot be loaded or called as configured; the message names the key and the fix."""


@dataclass(frozen=True)
class FactorySettings:
    """Which factory builds the run's generator, and its keyword arguments (``generator.factory[_kwargs]``)."""

    path: str  # "package.module:function"
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # passed to the function as keywords


@dataclass(frozen=True)
class GeneratorContext:
    """What a generator factory gets from the run. The run owns every object here; the factory must not close them.

    Attributes:
        engine: The inference engine the policy samples from. The trainer syncs new weights into it (pausing it
            meanwhile); generate from this object, not from an engine of your own.
        tokenizer: The policy's Hugging Face tokenizer (e.g. ``skyrl_train.generators.chat.ChatEncoder(tokenizer)``
            for chat-templated token ids).
        config: The generator settings of the run (``generator`` and ``environment`` sections, resolved: turn and
            length limits, ``timeout_s`` per trajectory, ``max_concurrent_trajectories``, ``on_failure`` …).
        run_dir: The run directory (``trainer.run_dir``), for files the generator writes.
        run_name: ``trainer.run_name``, e.g. to name what the generator creates for this run.
        seed: ``trainer.seed``.
    """

    engine: InferenceEngine
    tokenizer: Any
    config: GeneratorConfig
    run_dir: Path
    run_name: str
    seed: int


class GeneratorFactory(Protocol):
    """``factory(context, **generator.factory_kwargs) -> Generator``; see the module docstring.

    A factory may also carry ``settings_type`` (:data:`SETTINGS_ATTRIBUTE`), the dataclass of its keyword
    arguments, for :func:`check_factory` to build at validation.
    """

    def __call__(self, context: GeneratorContext, /, **kwargs: Any) -> Generator:
        """Build the run's generator from ``context`` and the configured keyword arguments."""
        ...


@runtime_checkable
class PausableGenerator(Protocol):
    """A generator with work of its own to hold during a weight sync (e.g. deadline clocks)."""

    async def pause(self) -> None:
        """Stop what must not run (or be timed) while the weights change."""
        ...

    async def resume(self) -> None:
        """Undo :meth:`pause`."""
        ...


def load_factory(path: str) -> GeneratorFactory:
    """The callable ``path`` (``"package.module:function"``) names, imported now.

    Raises:
        FactoryError: ``path`` is malformed, its module cannot be imported, it has no such attribute, or the
            attribute is not callable.
    """
    if not _PATH.fullmatch(path):
        raise FactoryError(
            f"{FACTORY_KEY} {path!r} must be 'package.module:function' "
            "(e.g. skyrl_agent.integrations.train_factory:swe_generator)"
        )
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise FactoryError(
            f"{FACTORY_KEY} {path!r}: cannot import {module_name} ({type(exc).__name__}: {exc}); install the "
            "package that provides it, or fix the module path"
        ) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise FactoryError(f"{FACTORY_KEY} {path!r}: {module_name} has no attribute {attribute!r}; fix the name")
        target = getattr(target, part)
    if not callable(target):
        raise FactoryError(f"{FACTORY_KEY} {path!r} is a {type(target).__name__}, not a function; name a callable")
    factory: GeneratorFactory = target
    return factory


def check_factory(settings: FactorySettings) -> list[str]:
    """Every problem of ``settings`` found without calling the factory.

    The factory must import, ``generator.factory_kwargs`` must fit its signature, and, when the factory declares a
    ``settings_type``, the kwargs must build that dataclass (:func:`settings_problems`).
    """
    try:
        factory = load_factory(settings.path)
    except FactoryError as exc:
        return [str(exc)]
    problems = _signature_problems(factory, settings)
    settings_type = getattr(factory, SETTINGS_ATTRIBUTE, None)
    if problems or settings_type is None:
        return problems
    if not (isinstance(settings_type, type) and dataclasses.is_dataclass(settings_type)):
        return [f"{FACTORY_KEY} {settings.path}: its {SETTINGS_ATTRIBUTE} must be a dataclass, got {settings_type!r}"]
    return settings_problems(settings_type, settings.kwargs)


def _signature_problems(factory: GeneratorFactory, settings: FactorySettings) -> list[str]:
    """Whether ``factory(context, **settings.kwargs)`` binds to the factory's signature."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins and C callables have no signature: accept what is given
        return []
    try:
        signature.bind(None, **settings.kwargs)  # None stands in for the context
    except TypeError as exc:
        return [
            f"{FACTORY_KWARGS_KEY} {dict(settings.kwargs)!r} do not fit {settings.path}{signature}: {exc}; it is "
            "called as factory(context, **generator.factory_kwargs)"
        ]
    return []


def build_settings(settings_type: type[_S], kwargs: Mapping[str, Any]) -> _S:
    """``settings_type(**kwargs)`` for a dataclass, each value checked against its field's type first.

    See the module docstring for the types checked; an ``int`` given for a ``float`` field becomes a float.

    Raises:
        FactoryError: every problem, ``; ``-separated (:func:`settings_problems` lists them one by one).
    """
    built, problems = _build(settings_type, kwargs)
    if built is None:
        raise FactoryError("; ".join(problems))
    return built


def settings_problems(settings_type: type[Any], kwargs: Mapping[str, Any]) -> list[str]:
    """Why ``kwargs`` cannot build the dataclass ``settings_type``; empty when :func:`build_settings` succeeds.

    Each problem names its ``generator.factory_kwargs`` key: an unknown key and the nearest field, a value of the
    wrong type with the type expected. When every value fits, what the dataclass raises (``ValueError`` or
    ``TypeError``, e.g. from its ``__post_init__``) is the one problem.
    """
    return _build(settings_type, kwargs)[1]


def _build(settings_type: type[_S], kwargs: Mapping[str, Any]) -> tuple[_S | None, list[str]]:
    try:
        hints = get_type_hints(settings_type)
    except (NameError, TypeError) as exc:  # an annotation names what its module does not define
        return None, [f"{FACTORY_KWARGS_KEY}: the field types of {settings_type.__name__} do not resolve: {exc}"]
    fields = {f.name: hints[f.name] for f in dataclasses.fields(settings_type) if f.init}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    problems = []
    for key, value in kwargs.items():
        if key not in fields:
            problems.append(_unknown_key(key, list(fields), settings_type.__name__))
        elif (fitted := _fitted(value, fields[key])) is _MISFIT:
            problems.append(_misfit(key, value, fields[key]))
        else:
            values[key] = fitted
    if problems:
        return None, problems
    try:
        return settings_type(**values), []
    except (TypeError, ValueError) as exc:
        return None, [str(exc)]


_MISFIT = object()  # what _fitted returns for a value its field's type does not take


def _fitted(value: Any, tp: Any) -> Any:
    """``value`` as a field of type ``tp`` takes it (an ``int`` for a ``float`` becomes one), else ``_MISFIT``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Union or origin is types.UnionType:
        for option in get_args(tp):
            if (fitted := _fitted(value, option)) is not _MISFIT:
                return fitted
        return _MISFIT
    if origin is Literal:
        return value if any(value == c and type(value) is type(c) for c in get_args(tp)) else _MISFIT
    if tp is type(None):
        return value if value is None else _MISFIT
    if tp is float and type(value) is int:
        return float(value)
    if tp is int and isinstance(value, bool):  # True is an int to Python, never to a config
        return _MISFIT
    return value if isinstance(value, origin or tp) else _MISFIT


def _unknown_key(key: str, fields: list[str], settings_name: str) -> str:
    close = difflib.get_close_matches(key, fields, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"{settings_name} takes {', '.join(fields)}"
    return f"{FACTORY_KWARGS_KEY}.{key}: unexpected keyword argument {key!r}; {hint}"


def _misfit(key: str, value: Any, tp: Any) -> str:
    choices = literal_choices(tp)
    if choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        listed = ", ".join(repr(c) for c in choices)
        return f"{FACTORY_KWARGS_KEY}.{key}: unknown {key} {value!r}; expected one of {listed}{hint}"
    got = "None" if value is None else f"{type(value).__name__} {value!r}"
    return f"{FACTORY_KWARGS_KEY}.{key}: expected {type_name(tp)}, got {got}"


def build_generator(settings: FactorySettings, context: GeneratorContext) -> Generator:
    """Call the factory of ``settings`` with ``context``; the result must satisfy the ``Generator`` protocol.

    Raises:
        FactoryError: the factory cannot be loaded, or it returned something without an ``async generate``.
    """
    generator = load_factory(settings.path)(context, **settings.kwargs)
    if not (isinstance(generator, Generator) and inspect.iscoroutinefunction(generator.generate)):
        raise FactoryError(
            f"{FACTORY_KEY} {settings.path} returned a {type(generator).__name__}, which is not a Generator: it "
            "needs an `async def generate(self, batch: GeneratorInput) -> GeneratorOutput`"
        )
    return generator


_IN_GENERATOR = contextvars.ContextVar("_IN_GENERATOR", default=False)
"""True inside the link's call of the generator's pause/resume (which may pause the link itself)."""


async def _outside_generator(call: Callable[[], Awaitable[None]]) -> None:
    """``call()`` (the generator's pause or resume), unless the link was called from inside one already."""
    if _IN_GENERATOR.get():
        return
    token = _IN_GENERATOR.set(True)
    try:
        await call()
    finally:
        _IN_GENERATOR.reset(token)


class GeneratorPauseLink:
    """An engine whose ``pause``/``resume`` also pause and resume a generator (see the module docstring).

    ``pause``: the generator's ``pause``, then the inner engine's. ``resume``: the inner engine's, then the
    generator's. A call made from inside the generator's ``pause``/``resume`` (the generator pausing the engine it
    was given, which is this link) goes to the inner engine only. Everything else goes to the inner engine; the
    caller owns it, and :meth:`close` closes it.
    """

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine
        self.generator: PausableGenerator | None = None  # set with attach() once the generator exists

    def attach(self, generator: object) -> None:
        """Pause ``generator`` with the engine from now on, when it has ``pause``/``resume``; else nothing."""
        if isinstance(generator, PausableGenerator):
            self.generator = generator

    @property
    def num_engines(self) -> int:
        """How many engines serve behind this one (an ``EngineGroup`` has several)."""
        return int(getattr(self.engine, "num_engines", 1))

    def load(self) -> EngineLoad | None:
        """The inner engine's load, when it reports one (admission control reads it)."""
        return load_of(self.engine)

    @property
    def pauses_at_token_boundary(self) -> bool:
        """The inner engine's (see :class:`~skyrl_train.inference.versioned.VersionedEngine`)."""
        return bool(getattr(self.engine, "pauses_at_token_boundary", False))

    @property
    def policy_version(self) -> int | None:
        """The inner engine's policy version, recorded on the tokens it samples (None when it records none)."""
        version = getattr(self.engine, "policy_version", None)
        return version if isinstance(version, int) else None

    @policy_version.setter
    def policy_version(self, version: int | None) -> None:
        if not self.pauses_at_token_boundary:
            raise AttributeError("the inner engine records no per-token versions (pauses_at_token_boundary is off)")
        self.engine.policy_version = version  # type: ignore[attr-defined]  # engines that pause between tokens have it

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        """The inner engine's ``generate``."""
        return await self.engine.generate(prompts, params)

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The inner engine's ``update_weights``."""
        await self.engine.update_weights(weights)

    async def pause(self) -> None:
        """Pause the generator (its clocks stop before in-flight requests are waited for), then the engine."""
        if self.generator is not None:
            await _outside_generator(self.generator.pause)
        await self.engine.pause()

    async def resume(self) -> None:
        """Resume the engine, then the generator."""
        await self.engine.resume()
        if self.generator is not None:
            await _outside_generator(self.generator.resume)

    async def close(self) -> None:
        """Close the inner engine."""
        await self.engine.close()
