"""A task suite made from real PyPI packages: bugs injected into released sdists, graded by the packages' own tests.

Only the recipe (``recipe.json``) lives in the repository: which sdist (name, version, sha256) each package comes
from, which of its files make up the task repository, which test files are hidden, and per task the injected bug as
exact string replacements, the issue text and the expected FAIL_TO_PASS tests.
:func:`~skyrl_agent.tasks.real.build.build_suite` downloads the sdists and turns the recipe into a ``tasks.jsonl``;
nothing it writes is committed.

Errors in the recipe raise :class:`RecipeError`, whose message names the package or task and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECIPE_PATH = Path(__file__).parent / "recipe.json"


class RecipeError(ValueError):
    """The recipe is malformed or does not fit its sdists; the message names the package or task at fault."""


@dataclass(frozen=True)
class Sdist:
    """One source distribution and the files taken from it: sdist path (file or directory) → repository path."""

    name: str
    version: str
    sha256: str
    files: Mapping[str, str]

    @property
    def requirement(self) -> str:
        """The ``NAME==VERSION`` pip is asked for."""
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class PackageSpec:
    """A package whose released sdist becomes the task repository.

    ``test_deps`` are sdists of test-only dependencies (the image has none but pytest); their files join the
    hidden tests, so the agent's repository holds only the package itself.
    """

    sdist: Sdist
    hidden_tests: tuple[str, ...]
    test_deps: tuple[Sdist, ...] = ()
    timeout_s: float = 120.0

    @property
    def name(self) -> str:
        """The package's PyPI name."""
        return self.sdist.name


@dataclass(frozen=True)
class Edit:
    """One exact replacement in the released source; ``old`` must occur exactly once in ``path``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class TaskSpec:
    """One injected bug: the edits that make it, the issue a user would file, and the tests it breaks.

    ``test_files`` are the hidden test files the task runs (all of the package's by default).
    """

    id: str
    package: str
    bug: tuple[Edit, ...]
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    test_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recipe:
    """Every package and task of the suite, in the order they are built."""

    packages: Mapping[str, PackageSpec]
    tasks: tuple[TaskSpec, ...]

    def test_files(self, task: TaskSpec) -> tuple[str, ...]:
        """The hidden test files ``task`` runs: its own list, or every ``test_*.py`` its package hides."""
        if task.test_files:
            return task.test_files
        hidden = self.packages[task.package].hidden_tests
        return tuple(path for path in hidden if path.rsplit("/", 1)[-1].startswith("test_"))


def load_recipe(path: str | Path = RECIPE_PATH) -> Recipe:
    """Read and check a recipe file (the shipped one by default)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RecipeError(f"{path}: cannot read the recipe ({exc})") from exc
    return recipe_from_dict(raw, where=str(path))


def recipe_from_dict(raw: Any, *, where: str = "<recipe>") -> Recipe:
    """Build a :class:`Recipe` from its JSON object, checking every field and cross-reference."""
    root = _mapping(raw, where)
    packages = {
        name: _package(name, _mapping(value, f"{where}: package {name!r}"), f"{where}: package {name!r}")
        for name, value in _mapping(root.get("packages"), f"{where}: 'packages'").items()
    }
    rows = root.get("tasks")
    if not isinstance(rows, list) or not rows:
        raise RecipeError(f"{where}: 'tasks' must be a non-empty list")
    tasks = tuple(_task(_mapping(row, f"{where}: tasks[{i}]"), f"{where}: tasks[{i}]") for i, row in enumerate(rows))
    recipe = Recipe(packages, tasks)
    _check_references(recipe, where)
    return recipe


def _check_references(recipe: Recipe, where: str) -> None:
    seen: set[str] = set()
    for task in recipe.tasks:
        if task.id in seen:
            raise RecipeError(f"{where}: task id {task.id!r} is used twice")
        seen.add(task.id)
        package = recipe.packages.get(task.package)
        if package is None:
            raise RecipeError(f"{where}: task {task.id!r} names unknown package {task.package!r}")
        unknown = [path for path in recipe.test_files(task) if path not in package.hidden_tests]
        if unknown or not recipe.test_files(task):
            raise RecipeError(f"{where}: task {task.id!r}: test files must be hidden tests of {task.package!r}")
        stray = [node for node in task.fail_to_pass if node.split("::", 1)[0] not in recipe.test_files(task)]
        if stray:
            raise RecipeError(f"{where}: task {task.id!r}: FAIL_TO_PASS ids outside its test files: {stray}")


def _sdist(name: str, raw: Mapping[str, Any], where: str) -> Sdist:
    sha256 = _str(raw, "sha256", where)
    if len(sha256) != 64 or any(char not in "0123456789abcdef" for char in sha256):
        raise RecipeError(f"{where}: 'sha256' must be 64 lower-case hex digits")
    files = _mapping(raw.get("files"), f"{where}: 'files'")
    if not files or not all(isinstance(v, str) and v for v in files.values()):
        raise RecipeError(f"{where}: 'files' must map sdist paths to repository paths")
    return Sdist(name, _str(raw, "version", where), sha256, dict(files))


def _package(name: str, raw: Mapping[str, Any], where: str) -> PackageSpec:
    deps = raw.get("test_deps", [])
    if not isinstance(deps, list):
        raise RecipeError(f"{where}: 'test_deps' must be a list")
    test_deps = []
    for i, item in enumerate(deps):
        dep_where = f"{where}: test_deps[{i}]"
        dep = _mapping(item, dep_where)
        test_deps.append(_sdist(_str(dep, "name", dep_where), dep, dep_where))
    timeout = raw.get("timeout_s", 120.0)
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise RecipeError(f"{where}: 'timeout_s' must be a positive number")
    hidden = _str_list(raw, "hidden_tests", where)
    return PackageSpec(_sdist(name, raw, where), hidden, tuple(test_deps), float(timeout))


def _task(raw: Mapping[str, Any], where: str) -> TaskSpec:
    task_id = _str(raw, "id", where)
    where = f"{where} (task {task_id!r})"
    edits = raw.get("bug")
    if not isinstance(edits, list) or not edits:
        raise RecipeError(f"{where}: 'bug' must be a non-empty list of {{path, old, new}} edits")
    bug = tuple(_edit(_mapping(edit, f"{where}: bug[{i}]"), f"{where}: bug[{i}]") for i, edit in enumerate(edits))
    return TaskSpec(
        id=task_id,
        package=_str(raw, "package", where),
        bug=bug,
        problem_statement=_str(raw, "problem_statement", where),
        fail_to_pass=_str_list(raw, "FAIL_TO_PASS", where),
        test_files=_str_list(raw, "test_files", where, required=False),
    )


def _edit(raw: Mapping[str, Any], where: str) -> Edit:
    old, new = _str(raw, "old", where), raw.get("new")
    if not isinstance(new, str) or new == old:
        raise RecipeError(f"{where}: 'new' must be a string that differs from 'old'")
    return Edit(_str(raw, "path", where), old, new)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RecipeError(f"{where}: expected a JSON object")
    return value


def _str(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise RecipeError(f"{where}: field {key!r} must be a non-empty string")
    return value


def _str_list(raw: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> tuple[str, ...]:
    value = raw.get(key, [] if not required else None)
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise RecipeError(f"{where}: field {key!r} must be a list of strings")
    if required and not value:
        raise RecipeError(f"{where}: field {key!r} must not be empty")
    return tuple(value)


__all__ = [
    "RECIPE_PATH",
    "Edit",
    "PackageSpec",
    "Recipe",
    "RecipeError",
    "Sdist",
    "TaskSpec",
    "load_recipe",
    "recipe_from_dict",
]
