"""``generator.factory``: config-time checks, the pause link, and a real run with a factory-built generator."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from skyrl_gym.datasets import make_demo_dataset, write_dataset
from skyrl_train.config import Config, ConfigError, load_config, validate
from skyrl_train.generators import GeneratorContext, GeneratorInput, GeneratorOutput, SkyRLGymGenerator
from skyrl_train.generators.factory import (
    FactoryError,
    FactorySettings,
    GeneratorPauseLink,
    build_generator,
    build_settings,
)
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.versioned import VersionedEngine
from skyrl_train.run import _Session, run

PLUGINS = "skyrl_test_generator_plugins"  # the module the factories below are registered under


class RecordingGenerator:
    """The SkyRLGymGenerator with the optional lifecycle: pause/resume (pausing its engine too) and async close."""

    def __init__(self, context: GeneratorContext, label: str) -> None:
        self.context, self.label = context, label
        self.inner = SkyRLGymGenerator(context.engine, context.tokenizer, context.config)
        self.events: list[str] = []
        self.paused = False
        self.generated_while_paused = 0

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        self.generated_while_paused += self.paused
        self.events.append("generate")
        return await self.inner.generate(batch)

    async def pause(self) -> None:
        self.events.append("pause")
        self.paused = True
        await self.context.engine.pause()  # what AgentGenerator does: the link must not call back into us

    async def resume(self) -> None:
        await self.context.engine.resume()
        self.paused = False
        self.events.append("resume")

    async def close(self) -> None:
        self.inner.close()
        self.events.append("close")


BUILT: list[RecordingGenerator] = []


def recording_generator(context: GeneratorContext, *, label: str = "default") -> RecordingGenerator:
    generator = RecordingGenerator(context, label)
    BUILT.append(generator)
    return generator


def not_a_generator(context: GeneratorContext) -> object:
    return object()


@dataclass(frozen=True)
class TypedSettings:
    """The keyword arguments of ``typed_generator``."""

    label: str = "default"
    mode: Literal["fast", "slow"] = "fast"
    limit: int | None = None
    ratio: float = 0.5

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"generator.factory_kwargs.limit must be at least 1, got {self.limit}")


def typed_generator(context: GeneratorContext, **kwargs: Any) -> RecordingGenerator:
    return recording_generator(context, label=build_settings(TypedSettings, kwargs).label)


typed_generator.settings_type = TypedSettings  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the factories of this file importable as ``skyrl_test_generator_plugins:NAME``."""
    module = types.ModuleType(PLUGINS)
    module.recording_generator = recording_generator  # type: ignore[attr-defined]
    module.not_a_generator = not_a_generator  # type: ignore[attr-defined]
    module.typed_generator = typed_generator  # type: ignore[attr-defined]
    module.NOT_CALLABLE = 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PLUGINS, module)
    BUILT.clear()
    yield
    BUILT.clear()


def _config(tmp_path: Path, model: Path, *overrides: str) -> Config:
    train = write_dataset(make_demo_dataset("gsm8k", 4), tmp_path / "data", ["jsonl"])[0]
    return load_config(
        None,
        [
            f"model.path={model}",
            "model.gradient_checkpointing=false",
            f"data.train_data=[{train}]",
            f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2",
            "trainer.micro_train_batch_size=4",
            "trainer.micro_forward_batch_size=4",
            "trainer.logger=[jsonl]",
            "trainer.eval_before_train=false",
            "trainer.ckpt_interval=0",
            "generator.n_samples_per_prompt=2",
            "generator.max_generate_length=8",
            *overrides,
        ],
    )


# -- validation: before any model loads ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["generator.factory=no_colon_here"], r"generator\.factory 'no_colon_here' must be 'package\.module:function'"),
        (["generator.factory=skyrl_no_such_package.mod:f"], r"cannot import skyrl_no_such_package\.mod"),
        ([f"generator.factory={PLUGINS}:missing"], rf"{PLUGINS} has no attribute 'missing'"),
        ([f"generator.factory={PLUGINS}:NOT_CALLABLE"], r"is a int, not a function"),
        (
            [f"generator.factory={PLUGINS}:recording_generator", "generator.factory_kwargs.lable=x"],
            r"generator\.factory_kwargs \{'lable': 'x'\} do not fit .*unexpected keyword argument 'lable'",
        ),
        (["generator.factory_kwargs.label=x"], r"generator\.factory_kwargs is set but generator\.factory is null"),
        (
            [f"generator.factory={PLUGINS}:recording_generator", "environment.num_env_workers=2"],
            r"environment\.num_env_workers > 0 .* set environment\.num_env_workers=0",
        ),
    ],
)
def test_a_bad_factory_fails_validation_naming_the_key(
    tmp_path: Path, tiny_model_dir: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(_config(tmp_path, tiny_model_dir, *overrides))


def test_a_good_factory_validates_and_skips_the_env_registry_check(tmp_path: Path, tiny_model_dir: Path) -> None:
    good = [f"generator.factory={PLUGINS}:recording_generator", "generator.factory_kwargs.label=x"]
    # The default generator needs a registered skyrl-gym env class; a factory's generator decides for itself.
    unknown = "environment.env_class=no_such_skyrl_gym_env"
    validate(_config(tmp_path, tiny_model_dir, *good, unknown))
    with pytest.raises(ConfigError, match=r"environment\.env_class"):
        validate(_config(tmp_path, tiny_model_dir, unknown))
    assert not BUILT  # validation imports the factory but never calls it


def test_typed_factory_kwargs_are_built_at_validation_and_every_problem_named(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    factory = f"generator.factory={PLUGINS}:typed_generator"
    bad = [
        "generator.factory_kwargs.lable=x",
        "generator.factory_kwargs.limit=many",
        "generator.factory_kwargs.mode=fats",
    ]
    with pytest.raises(ConfigError) as raised:
        validate(_config(tmp_path, tiny_model_dir, factory, *bad))
    message = str(raised.value)
    assert "generator.factory_kwargs.lable: unexpected keyword argument 'lable'; did you mean 'label'?" in message
    assert "generator.factory_kwargs.limit: expected int | None, got str 'many'" in message
    assert "generator.factory_kwargs.mode: unknown mode 'fats'; expected one of 'fast', 'slow'; did you mean" in message
    with pytest.raises(ConfigError, match=r"generator\.factory_kwargs\.limit must be at least 1, got 0"):
        validate(_config(tmp_path, tiny_model_dir, factory, "generator.factory_kwargs.limit=0"))  # __post_init__
    good = [
        "generator.factory_kwargs.limit=3",
        "generator.factory_kwargs.ratio=1",
        "generator.factory_kwargs.mode=slow",
    ]
    validate(_config(tmp_path, tiny_model_dir, factory, *good))  # an int is taken for a float
    assert not BUILT  # validation builds the settings, never the generator


def test_a_factory_that_returns_no_generator_is_refused() -> None:
    context: Any = None  # never looked at
    with pytest.raises(FactoryError, match=r"returned a object, which is not a Generator"):
        build_generator(FactorySettings(f"{PLUGINS}:not_a_generator"), context)


# -- the pause link -----------------------------------------------------------------------------------------------


class EventEngine:
    """An engine that only records what is called on it."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        self.events.append("engine.generate")
        return [GenerationOutput([1], [0.0], "stop") for _ in prompts]

    async def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        self.events.append("engine.update")

    async def pause(self) -> None:
        self.events.append("engine.pause")

    async def resume(self) -> None:
        self.events.append("engine.resume")

    async def close(self) -> None:
        self.events.append("engine.close")


class SelfPausingGenerator:
    """Pauses the engine it was given (the link) from inside its own pause, as AgentGenerator does."""

    def __init__(self, engine: Any, events: list[str]) -> None:
        self.engine, self.events = engine, events

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        raise AssertionError("not called")

    async def pause(self) -> None:
        self.events.append("generator.pause")
        await self.engine.pause()

    async def resume(self) -> None:
        await self.engine.resume()
        self.events.append("generator.resume")


def test_the_link_pauses_the_generator_first_and_resumes_it_last() -> None:
    events: list[str] = []
    link = GeneratorPauseLink(EventEngine(events))
    link.attach(SelfPausingGenerator(link, events))

    async def sync() -> None:
        await link.pause()
        await link.update_weights([])
        await link.resume()

    asyncio.run(sync())
    # The generator's own engine pause reaches the engine only (no second generator pause, no recursion).
    assert events == [
        "generator.pause",
        "engine.pause",
        "engine.pause",
        "engine.update",
        "engine.resume",
        "engine.resume",
        "generator.resume",
    ]


def test_the_link_under_a_versioned_engine_still_versions_and_pauses_once() -> None:
    events: list[str] = []
    link = GeneratorPauseLink(EventEngine(events))
    versioned = VersionedEngine(link)
    link.attach(SelfPausingGenerator(versioned, events))  # fully_async: the generator is given the versioned engine

    async def sync() -> list[GenerationOutput]:
        await versioned.pause()  # what Trainer.sync_weights does
        versioned.version = 7
        await versioned.resume()
        return await versioned.generate([[1]], SamplingParams())

    outputs = asyncio.run(sync())
    assert outputs[0].policy_version == 7
    assert events.count("generator.pause") == events.count("generator.resume") == 1
    assert events[-2:] == ["generator.resume", "engine.generate"]


def test_the_link_passes_through_without_a_pausable_generator() -> None:
    events: list[str] = []
    link = GeneratorPauseLink(EventEngine(events))
    link.attach(object())  # no pause/resume: nothing to link
    asyncio.run(link.pause())
    asyncio.run(link.resume())
    asyncio.run(link.close())
    assert events == ["engine.pause", "engine.resume", "engine.close"]
    assert link.num_engines == 1


# -- a real run ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_builds_pauses_and_closes_the_factory_generator(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _config(
        tmp_path,
        tiny_model_dir,
        f"generator.factory={PLUGINS}:recording_generator",
        "generator.factory_kwargs.label=from-config",
        "generator.max_turns=2",
        "trainer.max_training_steps=2",
    )
    result = run(config, echo_config=False)
    assert result.global_step == 2
    (generator,) = BUILT
    assert generator.label == "from-config"
    context = generator.context
    assert (context.config.max_turns, context.run_dir, context.run_name) == (2, tmp_path / "run", "run")
    assert isinstance(context.engine, GeneratorPauseLink)
    # One weight sync after each step, each inside one pause; never a rollout during one; closed once, at the end.
    assert generator.events == ["generate", "pause", "resume", "generate", "pause", "resume", "close"]
    assert generator.generated_while_paused == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "reward/mean" in line] == [1, 2]


@pytest.mark.slow
def test_a_build_that_fails_after_the_generator_closes_it(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skyrl_train import run as run_module

    def broken_tracker(*args: object, **kwargs: object) -> None:
        raise RuntimeError("tracker failed")

    monkeypatch.setattr(run_module.Tracker, "create", broken_tracker)
    config = _config(tmp_path, tiny_model_dir, f"generator.factory={PLUGINS}:recording_generator")
    with pytest.raises(RuntimeError, match="tracker failed"):
        asyncio.run(_Session.open(config))
    (generator,) = BUILT
    assert generator.events == ["close"]
