"""The SWE-style task format: a buggy repository snapshot, an issue, hidden tests and a reference fix.

A task is one JSON object (one line of a ``.jsonl`` file). Its ``repo`` is either a directory (a string, relative to
the file that names it) or an inline mapping of path → file content; either way it is the repository at the buggy
commit, and the agent gets it as a fresh single-commit git repository. The hidden tests come as ``test_patch`` (a
unified diff, as in SWE-bench) and/or ``hidden_tests`` (path → content); they are written only at grading time.

Errors in a task file raise :class:`TaskFormatError`, whose message names the file, the line and the field.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

DEFAULT_TEST_COMMAND = "python3 -m pytest -q -rA -p no:cacheprovider"
DEFAULT_IMAGE = "skyrl-sandbox:base"
SWEBENCH_IMAGE_TEMPLATE = "sweb.eval.x86_64.{id}"
_SKIPPED_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})


class TaskFormatError(ValueError):
    """A task file or row is malformed; the message says where (file, line, field) and what is wrong."""


@dataclass(frozen=True)
class SWETask:
    """One SWE-style task.

    ``repo`` is ``None`` only when ``base_image`` already holds the repository at ``workdir`` (SWE-bench images);
    then ``base_commit`` names the commit test files are restored from. Node ids in ``fail_to_pass`` and
    ``pass_to_pass`` are pytest ids relative to ``workdir`` (``tests/test_x.py::test_y``).
    """

    id: str
    repo: Path | Mapping[str, str] | None
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    test_patch: str = ""
    hidden_tests: Mapping[str, str] = field(default_factory=dict)
    test_files: tuple[str, ...] = ()  # extra paths the grader restores to the task's version before testing
    gold_patch: str = ""
    base_image: str = DEFAULT_IMAGE
    test_command: str = DEFAULT_TEST_COMMAND
    workdir: str = "/workspace"
    base_commit: str | None = None
    timeout_s: float = 120.0  # limit of one hidden-test run
    reference_s: float | None = None  # the gold patch's test run, measured by `tasks validate --record`
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PytestCommand:
    """A task's ``test_command`` taken apart: the interpreter, pytest's arguments, and the declared plugins."""

    python: str
    args: tuple[str, ...]
    plugins: tuple[str, ...]  # modules named by ``-p NAME``: imported before the repository is on sys.path


# The grader sets these itself (config, rootdir, conftest boundary, plugin autoload): a task may not.
_GRADER_OPTIONS = ("-c", "--rootdir", "--confcutdir", "--config-file", "--inifile")


def parse_test_command(command: str) -> PytestCommand:
    """Split ``PYTHON -m pytest ARGS`` (or ``pytest ARGS``, run with ``python3``) into a :class:`PytestCommand`.

    Raises:
        ValueError: the command is not a pytest invocation, or sets an option the grader owns.
    """
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"cannot split the command ({exc})") from exc
    if words and PurePosixPath(words[0]).name in ("pytest", "py.test"):
        python, rest = "python3", words[1:]
    elif len(words) >= 3 and words[1:3] == ["-m", "pytest"]:
        python, rest = words[0], words[3:]
    else:
        raise ValueError(f"{command!r} is not 'PYTHON -m pytest [ARGS]' or 'pytest [ARGS]' (the grader runs pytest)")
    args: list[str] = []
    plugins: list[str] = []
    words_iter = iter(rest)
    for word in words_iter:
        if word.split("=", 1)[0] in _GRADER_OPTIONS:
            raise ValueError(f"{word.split('=', 1)[0]} is set by the grader; remove it from the test command")
        name = next(words_iter, "") if word == "-p" else word[2:] if word.startswith("-p") else None
        if name is None or name.startswith("no:"):
            args += [word] if name is None else ["-p", name]
        elif not name:
            raise ValueError("-p needs a plugin module name")
        else:
            plugins.append(name)
    return PytestCommand(python, tuple(args), tuple(plugins))


def repo_files(task: SWETask) -> dict[str, bytes]:
    """The files of the task's repository snapshot, path (POSIX, relative) → content; caches and VCS dirs skipped."""
    if task.repo is None:
        return {}
    if isinstance(task.repo, Path):
        if not task.repo.is_dir():
            raise TaskFormatError(f"task {task.id!r}: repo directory {task.repo} does not exist")
        top, where = task.repo.resolve(), f"task {task.id!r}"
        files: dict[str, bytes] = {}
        for directory, dirnames, filenames in os.walk(task.repo):
            for name in (*dirnames, *filenames):
                _check_link(Path(directory) / name, top, where)
            dirnames[:] = sorted(name for name in dirnames if name not in _SKIPPED_DIRS)
            for name in sorted(filenames):
                path = Path(directory) / name
                if path.suffix != ".pyc":
                    files[path.relative_to(task.repo).as_posix()] = path.read_bytes()
        return dict(sorted(files.items()))
    return {path: content.encode() for path, content in task.repo.items()}


# --- JSON (de)serialisation -------------------------------------------------------------------------------------

_LIST_FIELDS = {"fail_to_pass": "FAIL_TO_PASS", "pass_to_pass": "PASS_TO_PASS", "test_files": "test_files"}
_STR_FIELDS = ("problem_statement", "test_patch", "gold_patch", "base_image", "test_command", "workdir")


def task_from_dict(row: Mapping[str, Any], *, where: str = "<dict>", base_dir: Path | None = None) -> SWETask:
    """Build a task from its JSON object; ``where`` prefixes error messages, ``base_dir`` anchors a repo directory."""
    if not isinstance(row, Mapping):
        raise TaskFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    task_id = _require_str(row, "id", where)
    where = f"{where} (task {task_id!r})"
    kwargs: dict[str, Any] = {"id": task_id, "repo": _repo_field(row.get("repo"), where, base_dir)}
    for name in _STR_FIELDS:
        if name in row:
            kwargs[name] = _require_str(row, name, where)
    if "problem_statement" not in kwargs:
        raise TaskFormatError(f"{where}: field 'problem_statement' is required")
    for name, key in _LIST_FIELDS.items():
        kwargs[name] = _str_list(row.get(key, []), key, where)
    if not kwargs["fail_to_pass"]:
        raise TaskFormatError(f"{where}: field 'FAIL_TO_PASS' must list at least one test")
    kwargs["hidden_tests"] = _str_mapping(row.get("hidden_tests", {}), "hidden_tests", where)
    if not kwargs.get("test_patch") and not kwargs["hidden_tests"]:
        raise TaskFormatError(f"{where}: one of 'test_patch' or 'hidden_tests' is required")
    if row.get("base_commit") is not None:
        kwargs["base_commit"] = _require_str(row, "base_commit", where)
    for name in ("timeout_s", "reference_s"):
        if row.get(name) is not None:
            kwargs[name] = _positive_seconds(row[name], name, where)
    if "test_command" in kwargs:
        try:
            parse_test_command(kwargs["test_command"])
        except ValueError as exc:
            raise TaskFormatError(f"{where}: field 'test_command': {exc}") from exc
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        for node in kwargs[key.lower()]:
            _check_relative(node.split("::", 1)[0], key, where)
    for path in (*kwargs["hidden_tests"], *kwargs["test_files"]):
        _check_relative(path, "hidden_tests" if path in kwargs["hidden_tests"] else "test_files", where)
    metadata = row.get("metadata", {})
    if not isinstance(metadata, Mapping):
        raise TaskFormatError(f"{where}: field 'metadata' must be an object")
    kwargs["metadata"] = dict(metadata)
    return SWETask(**kwargs)


def task_to_dict(task: SWETask, *, base_dir: Path | None = None) -> dict[str, Any]:
    """The JSON object of ``task``; a repo directory is written relative to ``base_dir`` when given."""
    repo: str | dict[str, str] | None
    if isinstance(task.repo, Path):
        relative = Path(_relpath(task.repo, base_dir)).as_posix()
        # A loader refuses '..' and absolute repo paths (they could copy any host directory into a sandbox), so a
        # directory outside the file's own is written inline.
        outside = relative.startswith(("/", "../")) or relative == ".."
        repo = {path: content.decode() for path, content in repo_files(task).items()} if outside else relative
    else:
        repo = dict(task.repo) if task.repo is not None else None
    row: dict[str, Any] = {"id": task.id, "repo": repo}
    row.update({name: getattr(task, name) for name in _STR_FIELDS})
    row.update({key: list(getattr(task, name)) for name, key in _LIST_FIELDS.items()})
    row.update(hidden_tests=dict(task.hidden_tests), base_commit=task.base_commit, timeout_s=task.timeout_s)
    if task.reference_s is not None:
        row["reference_s"] = task.reference_s
    row["metadata"] = dict(task.metadata)
    return row


def load_tasks(path: str | Path) -> list[SWETask]:
    """Load tasks from a ``.jsonl`` file (one object a line) or a ``.json`` file (a list of objects)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFormatError(f"{path}: cannot read the task file ({exc.strerror})") from exc
    if path.suffix == ".json":
        rows = _parse_json(text, str(path))
        if not isinstance(rows, list):
            raise TaskFormatError(f"{path}: expected a JSON list of task objects")
        return [task_from_dict(row, where=f"{path}[{i}]", base_dir=path.parent) for i, row in enumerate(rows)]
    tasks = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            where = f"{path}:{lineno}"
            tasks.append(task_from_dict(_parse_json(line, where), where=where, base_dir=path.parent))
    return tasks


def save_tasks(tasks: Iterable[SWETask], path: str | Path) -> None:
    """Write tasks as JSONL (or a JSON list when ``path`` ends in ``.json``); repo dirs become relative paths."""
    path = Path(path)
    rows = [task_to_dict(task, base_dir=path.parent) for task in tasks]
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


# --- SWE-bench rows -----------------------------------------------------------------------------------------------


def task_from_swebench(
    row: Mapping[str, Any],
    *,
    image_template: str = SWEBENCH_IMAGE_TEMPLATE,
    workdir: str = "/testbed",
    test_command: str = "python -m pytest -rA -p no:cacheprovider",
    where: str = "<row>",
) -> SWETask:
    """A task from a SWE-bench-style row, for users who have its per-instance images.

    The image (``image_template`` formatted with ``id``, the instance id with ``__`` → ``_1776_`` as on Docker Hub)
    holds the repository at ``workdir``; ``FAIL_TO_PASS``/``PASS_TO_PASS`` may be JSON strings or lists.
    ``test_command`` must suit the repository (SWE-bench uses per-repo commands).
    """
    instance_id = _require_str(row, "instance_id", where)
    where = f"{where} (instance {instance_id!r})"
    image_id = instance_id.replace("__", "_1776_")
    return SWETask(
        id=instance_id,
        repo=None,
        problem_statement=_require_str(row, "problem_statement", where),
        fail_to_pass=_str_list(_maybe_json(row.get("FAIL_TO_PASS", []), "FAIL_TO_PASS", where), "FAIL_TO_PASS", where),
        pass_to_pass=_str_list(_maybe_json(row.get("PASS_TO_PASS", []), "PASS_TO_PASS", where), "PASS_TO_PASS", where),
        test_patch=_require_str(row, "test_patch", where),
        gold_patch=str(row.get("patch", "")),
        base_image=image_template.format(id=image_id),
        test_command=test_command,
        workdir=workdir,
        base_commit=_require_str(row, "base_commit", where),
        metadata={k: row[k] for k in ("repo", "version", "environment_setup_commit") if k in row},
    )


def load_swebench(path: str | Path, **options: Any) -> list[SWETask]:
    """Load SWE-bench-style rows from a ``.jsonl``/``.json`` file; ``options`` go to :func:`task_from_swebench`."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = _parse_json(text, str(path))
        if not isinstance(rows, list):
            raise TaskFormatError(f"{path}: expected a JSON list of SWE-bench rows")
        return [task_from_swebench(row, where=f"{path}[{i}]", **options) for i, row in enumerate(rows)]
    return [
        task_from_swebench(_parse_json(line, f"{path}:{n}"), where=f"{path}:{n}", **options)
        for n, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]


# --- field helpers ------------------------------------------------------------------------------------------------


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskFormatError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc


def _require_str(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or (key == "id" and not value):
        raise TaskFormatError(f"{where}: field {key!r} must be a non-empty string, got {value!r:.60}")
    return value


def _str_list(value: Any, key: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TaskFormatError(f"{where}: field {key!r} must be a list of strings")
    return tuple(value)


def _str_mapping(value: Any, key: str, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TaskFormatError(f"{where}: field {key!r} must map paths to file contents (strings)")
    return dict(value)


def _positive_seconds(value: Any, key: str, where: str) -> float:
    # json.loads accepts Infinity and NaN: a limit of either would never end a hung test run.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise TaskFormatError(f"{where}: field {key!r} must be a finite positive number of seconds, got {value!r}")
    return float(value)


def _check_relative(path: str, key: str, where: str) -> None:
    """Paths inside the repository only: no absolute path, no ``..``, nothing inside ``.git``."""
    parts = PurePosixPath(path).parts
    if not path or path.startswith(("/", "~")) or ".." in parts or ".git" in parts or "\0" in path:
        raise TaskFormatError(
            f"{where}: field {key!r}: {path!r} must be a relative path inside the repository (no '/', '..' or .git)"
        )


def _maybe_json(value: Any, key: str, where: str) -> Any:
    # SWE-bench stores the test lists as JSON-encoded strings.
    return _parse_json(value, f"{where}: field {key!r}") if isinstance(value, str) else value


def _repo_field(value: Any, where: str, base_dir: Path | None) -> Path | dict[str, str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        _check_relative(value, "repo", where)
        path = Path(value) if base_dir is None else base_dir / value
        if path.is_dir():
            _check_no_escaping_links(path, where)
        return path
    files = _str_mapping(value, "repo", where)
    for name in files:
        _check_relative(name, "repo", where)
    return files


def _check_no_escaping_links(root: Path, where: str) -> None:
    """A repository directory may hold symbolic links only to files inside it: nothing of the host gets copied."""
    top = root.resolve()
    for directory, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            _check_link(Path(directory) / name, top, where)


def _check_link(path: Path, top: Path, where: str) -> None:
    if not path.is_symlink():
        return
    target = path.resolve()
    if not target.is_relative_to(top) or target.is_dir():
        raise TaskFormatError(
            f"{where}: field 'repo': {path} is a symbolic link to {target}, outside the repository or a"
            " directory; replace it with the file itself"
        )


def _relpath(path: Path, base_dir: Path | None) -> str:
    if base_dir is None:
        return str(path)
    return os.path.relpath(path.resolve(), base_dir.resolve())
