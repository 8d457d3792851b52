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

Lifecycle (both optional, found by duck typing):

- :class:`PausableGenerator` (``async pause()`` / ``async resume()``): the run pauses the generator around every
  weight sync, its ``pause`` before the engine pauses and its ``resume`` after the engine resumes, so time spent
  syncing can be kept out of the generator's own deadlines. The run gets this by giving the factory a
  :class:`GeneratorPauseLink` as ``context.engine``; a generator may pause that same engine inside its ``pause``
  (the link then pauses only the engine beneath it, never the generator a second time).
- ``close()`` (a coroutine function or a plain one): called once when the run ends, also when it fails after the
  generator was built. The generator closes what it created (sandboxes, pools); the run closes the engine.
- ``timeline`` (an attribute): set to the run's :class:`~skyrl_train.timeline.Timeline`, to record spans into.

Errors: :func:`load_factory` and :func:`check_factory` raise / report :class:`FactoryError` (a ``ValueError``)
naming the ``generator.factory`` or ``generator.factory_kwargs`` key and what to change.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from skyrl_train.generators.base import Generator
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig
from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams

if TYPE_CHECKING:
    import torch

__all__ = [
    "FACTORY_KEY",
    "FACTORY_KWARGS_KEY",
    "FactoryError",
    "FactorySettings",
    "GeneratorContext",
    "GeneratorFactory",
    "GeneratorPauseLink",
    "PausableGenerator",
    "build_generator",
    "check_factory",
    "load_factory",
]

FACTORY_KEY = "generator.factory"
FACTORY_KWARGS_KEY = "generator.factory_kwargs"
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
    """``factory(context, **generator.factory_kwargs) -> Generator``; see the module docstring."""

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
    """Every problem of ``settings`` found without calling the factory (import, and whether the kwargs fit it)."""
    try:
        factory = load_factory(settings.path)
    except FactoryError as exc:
        return [str(exc)]
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
