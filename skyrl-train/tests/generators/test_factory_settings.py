"""``generator.factory_kwargs`` as a factory's typed settings: ``build_settings``, ``settings_problems``, the check."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from skyrl_train.generators.factory import (
    FactoryError,
    FactorySettings,
    build_settings,
    check_factory,
    settings_problems,
)

PLUGINS = "skyrl_test_settings_plugins"


@dataclass(frozen=True)
class Settings:
    """One field of each kind the builder checks."""

    name: str = "x"
    count: int = 1
    scale: float = 1.0
    enabled: bool = True
    limit: int | None = None
    mode: Literal["a", "b"] | None = None
    extra: Any = None
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"generator.factory_kwargs.count must be at least 1, got {self.count}")


def typed(context: Any, **kwargs: Any) -> Any:
    return build_settings(Settings, kwargs)


def plain(context: Any, *, count: int = 1) -> Any:
    return count


typed.settings_type = Settings  # type: ignore[attr-defined]
plain.settings_type = int  # type: ignore[attr-defined]  # not a dataclass


@pytest.fixture(autouse=True)
def plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the factories of this file importable as ``skyrl_test_settings_plugins:NAME``."""
    module = types.ModuleType(PLUGINS)
    module.typed = typed  # type: ignore[attr-defined]
    module.plain = plain  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PLUGINS, module)


def test_values_that_fit_build_the_dataclass() -> None:
    built = build_settings(Settings, {"name": "y", "count": 2, "scale": 3, "limit": None, "mode": "b", "tags": ["t"]})
    assert built == Settings(name="y", count=2, scale=3.0, mode="b", tags=["t"])
    assert isinstance(built.scale, float)  # an int given for a float field becomes a float
    assert build_settings(Settings, {"extra": {"any": ["thing"]}}).extra == {"any": ["thing"]}
    assert build_settings(Settings, {}) == Settings()


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"count": "2"}, "generator.factory_kwargs.count: expected int, got str '2'"),
        ({"count": True}, "generator.factory_kwargs.count: expected int, got bool True"),  # a bool is no count
        ({"count": 1.5}, "generator.factory_kwargs.count: expected int, got float 1.5"),
        ({"enabled": 1}, "generator.factory_kwargs.enabled: expected bool, got int 1"),
        ({"name": None}, "generator.factory_kwargs.name: expected str, got None"),
        ({"limit": "many"}, "generator.factory_kwargs.limit: expected int | None, got str 'many'"),
        ({"tags": "t"}, "generator.factory_kwargs.tags: expected list[str], got str 't'"),
        ({"mode": "c"}, "generator.factory_kwargs.mode: unknown mode 'c'; expected one of 'a', 'b'"),
        (
            {"mode": "aa"},
            "generator.factory_kwargs.mode: unknown mode 'aa'; expected one of 'a', 'b'; did you mean 'a'?",
        ),
        ({"cont": 2}, "generator.factory_kwargs.cont: unexpected keyword argument 'cont'; did you mean 'count'?"),
        (
            {"zzz": 2},
            "generator.factory_kwargs.zzz: unexpected keyword argument 'zzz'; Settings takes name, count, scale, "
            "enabled, limit, mode, extra, tags",
        ),
        ({"count": 0}, "generator.factory_kwargs.count must be at least 1, got 0"),  # the dataclass's own check
    ],
)
def test_each_problem_names_its_key(kwargs: dict[str, Any], problem: str) -> None:
    assert settings_problems(Settings, kwargs) == [problem]
    with pytest.raises(FactoryError) as raised:
        build_settings(Settings, kwargs)
    assert str(raised.value) == problem


def test_every_problem_is_reported_at_once() -> None:
    kwargs = {"cont": 2, "scale": "big", "mode": "c"}
    problems = settings_problems(Settings, kwargs)
    assert [p.split(":")[0] for p in problems] == [f"generator.factory_kwargs.{key}" for key in kwargs]
    with pytest.raises(FactoryError) as raised:
        build_settings(Settings, kwargs)
    assert str(raised.value) == "; ".join(problems)


def test_check_factory_builds_a_declared_settings_type() -> None:
    assert check_factory(FactorySettings(f"{PLUGINS}:typed", {"count": 3, "mode": "a"})) == []
    assert check_factory(FactorySettings(f"{PLUGINS}:typed", {"count": "3", "cont": 1})) == [
        "generator.factory_kwargs.count: expected int, got str '3'",
        "generator.factory_kwargs.cont: unexpected keyword argument 'cont'; did you mean 'count'?",
    ]
    (problem,) = check_factory(FactorySettings(f"{PLUGINS}:plain", {"count": 2}))
    assert problem == f"generator.factory {PLUGINS}:plain: its settings_type must be a dataclass, got <class 'int'>"
    (problem,) = check_factory(FactorySettings(f"{PLUGINS}:plain", {"cont": 2}))
    assert "unexpected keyword argument 'cont'" in problem  # the signature is checked first


@dataclass(frozen=True)
class Unresolved:
    """A field whose annotation names nothing its module defines."""

    value: NoSuchType = None  # type: ignore[name-defined]  # noqa: F821


def test_unresolvable_field_types_are_a_problem_not_a_crash() -> None:
    (problem,) = settings_problems(Unresolved, {"value": 1})
    assert problem.startswith("generator.factory_kwargs: the field types of Unresolved do not resolve: ")
