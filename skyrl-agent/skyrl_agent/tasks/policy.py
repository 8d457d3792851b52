"""What a model patch may touch, and which files the grader puts back before the hidden tests run.

The policy, applied to every model diff before grading (docs/agent/tasks.md, "The patch policy"):

* **Rejected** (verdict ``patch_rejected``, reward 0, nothing applied): a path that is absolute, contains ``..``
  or leaves the repository; a path inside ``.git``; a symbolic link or submodule (modes ``120000``/``160000``);
  a diff that is not a git-style unified diff (no ``---``/``+++`` file headers, or a context or ed-style diff,
  which ``patch`` would otherwise interpret).
* **Discarded** (the diff applies, then the grader restores the task's version): test files and directories,
  ``conftest.py`` files, pytest and packaging configuration, ``sitecustomize``/``usercustomize``/``*.pth``, the
  task's ``test_files`` and every hidden test file.

Everything else is the model's fix.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable

from skyrl_agent.tasks.format import SWETask

# Files that configure or hook into pytest (or the interpreter) and therefore decide what "passed" means.
PROTECTED_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
_FILE_HEADER = re.compile(r"^(?:---|\+\+\+) (.+?)(?:\t.*)?$", re.MULTILINE)
_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$", re.MULTILINE)
_RENAME = re.compile(r"^(?:rename|copy) (?:from|to) (.+)$", re.MULTILINE)
_MODE = re.compile(r"^(?:new file mode|deleted file mode|new mode|old mode|index \S+) (\d{6})$", re.MULTILINE)
_FOREIGN = re.compile(r"^(?:\*\*\* \S|\*{15}$|Index: |Prereq: |\d+(?:,\d+)?[acd]\d+(?:,\d+)?$)", re.MULTILINE)
_FORBIDDEN_MODES = {"120000": "a symbolic link", "160000": "a submodule"}


def patch_paths(patch: str) -> list[str]:
    """Every path a unified diff touches (old and new names, ``a/``/``b/`` prefixes removed, quotes decoded)."""
    names = [match.group(1) for match in _FILE_HEADER.finditer(patch)]
    for match in _GIT_HEADER.finditer(patch):
        names += [match.group(1), match.group(2)]
    names += [match.group(1) for match in _RENAME.finditer(patch)]
    paths: dict[str, None] = {}
    for raw in names:
        name = _unquote(raw.strip())
        if name != "/dev/null":
            paths[name[2:] if name.startswith(("a/", "b/")) else name] = None
    return list(paths)


def violations(patch: str) -> list[str]:
    """Why ``patch`` may not be applied at all (empty when the policy allows it); see the module docstring."""
    if not patch.strip():
        return []
    problems = []
    if not _FILE_HEADER.search(patch):
        problems.append("not a unified diff: no '--- a/…' / '+++ b/…' file headers")
    if _FOREIGN.search(patch):
        problems.append("not a unified diff: it holds context-diff or ed-style lines (only unified diffs apply)")
    for path in patch_paths(patch):
        reason = _path_problem(path)
        if reason:
            problems.append(f"{path!r} {reason}")
    for match in _MODE.finditer(patch):
        kind = _FORBIDDEN_MODES.get(match.group(1))
        if kind:
            problems.append(f"it creates {kind} (mode {match.group(1)}); only regular files may change")
    return list(dict.fromkeys(problems))


def is_protected(path: str, task: SWETask) -> bool:
    """Whether a model's change to ``path`` is discarded: tests, pytest/interpreter configuration, hidden tests."""
    name = path.rsplit("/", 1)[-1]
    parts = path.split("/")
    return (
        name in PROTECTED_NAMES
        or name.endswith(".pth")
        or name.startswith("test_")
        or name.endswith("_test.py")
        or "tests" in parts[:-1]
        or "test" in parts[:-1]
        or path in task.test_files
        or path in task.hidden_tests
    )


def protected(paths: Iterable[str], task: SWETask) -> list[str]:
    """The protected paths among ``paths``, in order, without duplicates."""
    return [path for path in dict.fromkeys(paths) if path and is_protected(path, task)]


def _path_problem(path: str) -> str | None:
    if path.startswith("/") or path.startswith("~"):
        return "is an absolute path: paths must be relative to the repository"
    parts = path.split("/")
    if ".." in parts:
        return "leaves the repository ('..')"
    if ".git" in parts:
        return "is inside .git: the repository's metadata is the grader's"
    if "\0" in path or not path.strip("/."):
        return "is not a file name"
    return None


def _unquote(name: str) -> str:
    """Git quotes unusual file names C-style, with octal escapes for bytes outside ASCII."""
    if len(name) >= 2 and name[0] == name[-1] == '"':
        raw = codecs.escape_decode(name[1:-1].encode())[0]
        assert isinstance(raw, bytes)
        return raw.decode("utf-8", errors="replace")
    return name
