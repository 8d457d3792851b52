"""SWE-bench-style grading of a model patch, in a fresh sandbox the agent never touched.

Steps (the contract of :func:`grade`):

1. start a fresh sandbox from the task's image and write the repository snapshot as a single-commit git repo
   (:func:`prepare_workspace`), or use the repository the image holds;
2. apply the model's diff with ``git apply``, falling back to ``patch -p1 --fuzz=5``; a diff that applies neither
   way leaves the task unresolved with ``status="patch_failed"``;
3. undo what the diff did to tests and test configuration: every changed or added ``conftest.py``, pytest/tox/setup
   config, ``sitecustomize.py``/``*.pth`` and test file is restored to the task's version (or deleted when new),
   the task's ``test_files`` and the files the hidden tests touch are restored too, and bytecode caches are removed;
4. apply the hidden tests and run the test command (``-p no:cacheprovider``) under an in-sandbox timeout;
5. parse the ``-rA`` summary; resolved iff every FAIL_TO_PASS test passed (PASSED/XFAIL) and every PASS_TO_PASS
   test passed or was skipped. A test missing from the log counts as failed.

Sandbox infrastructure failures (:class:`~skyrl_agent.sandbox.base.SandboxError`) propagate: they say nothing
about the patch and the caller decides whether to retry.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from skyrl_agent.sandbox.base import CommandResult, Sandbox, SandboxBackend, SandboxSpec
from skyrl_agent.tasks.format import SWETask, repo_files
from skyrl_agent.tasks.pytest_log import parse_pytest_log

SandboxFactory = Callable[[SandboxSpec], Awaitable[Sandbox]]
PASSING = frozenset({"PASSED", "XFAIL"})
# Files that configure or hook into pytest (or the interpreter) and therefore decide what "passed" means.
PROTECTED_NAMES = frozenset(
    {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py", "usercustomize.py"}
)
_GIT = "git -c user.name=skyrl -c user.email=skyrl@localhost -c commit.gpgsign=false -c core.hooksPath=/dev/null"
_START, _END = ">>>>> Start Test Output", ">>>>> End Test Output"
_LOG_TAIL = 4000  # characters of the test log kept on the result


@dataclass(frozen=True)
class GradeResult:
    """The verdict on one patch.

    ``status`` is ``resolved``, ``unresolved``, ``patch_failed`` (the model diff did not apply), ``timeout`` (the
    hidden tests ran past the task's limit) or ``error`` (the task itself is broken: its hidden tests do not apply).
    """

    task_id: str
    resolved: bool
    status: str
    tests: Mapping[str, str] = field(default_factory=dict)  # node id → pytest status, as parsed
    fail_to_pass: Mapping[str, bool] = field(default_factory=dict)
    pass_to_pass: Mapping[str, bool] = field(default_factory=dict)
    log: str = ""  # the tail of the test output (or of the failed apply)
    error: str | None = None
    duration_s: float = 0.0


async def grade(
    task: SWETask, model_patch: str, sandboxes: SandboxBackend | SandboxFactory, *, spec: SandboxSpec | None = None
) -> GradeResult:
    """Grade ``model_patch`` against ``task`` in a fresh sandbox from ``sandboxes`` (closed before returning)."""
    start = time.monotonic()
    spec = replace(spec or SandboxSpec(), image=task.base_image, workdir=task.workdir)
    create = sandboxes.create if isinstance(sandboxes, SandboxBackend) else sandboxes
    sandbox = await create(spec)
    try:
        result = await _grade_in(task, model_patch, sandbox)
    finally:
        await sandbox.close()
    return replace(result, duration_s=time.monotonic() - start)


async def prepare_workspace(task: SWETask, sandbox: Sandbox) -> None:
    """Write the task's repository into ``task.workdir`` as a fresh git repo with one commit and no hidden tests.

    The single commit carries no history, tags or remote, so nothing in the repository reveals the fix. A task
    whose ``repo`` is ``None`` relies on its image and is left as the image has it.
    """
    files = repo_files(task)
    if not files:
        return
    for path, content in files.items():
        await sandbox.write_file(f"{task.workdir}/{path}", content)
    result = await _run(sandbox, task, f"git init -q && {_GIT} add -A && {_GIT} commit -q -m 'Initial commit'")
    if result.exit_code != 0:
        raise RuntimeError(f"task {task.id}: could not create the workspace git repo: {result.output[-500:]}")


def test_targets(task: SWETask) -> list[str]:
    """The test files to pass to the test command: the files of every FAIL_TO_PASS and PASS_TO_PASS node id."""
    files = dict.fromkeys(node.split("::", 1)[0] for node in (*task.fail_to_pass, *task.pass_to_pass))
    return list(files)


def patch_paths(patch: str) -> list[str]:
    """Every path a unified diff touches (old and new names, ``a/``/``b/`` prefixes removed)."""
    paths: dict[str, None] = {}
    for match in re.finditer(r"^(?:---|\+\+\+) (\S+)", patch, flags=re.MULTILINE):
        name = match.group(1)
        if name != "/dev/null":
            paths[name.split("/", 1)[1] if name.startswith(("a/", "b/")) else name] = None
    return list(paths)


def is_protected(path: str, task: SWETask) -> bool:
    """Whether a model may not change ``path``: tests, pytest/interpreter configuration, or a task test file."""
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


async def _grade_in(task: SWETask, model_patch: str, sandbox: Sandbox) -> GradeResult:
    await prepare_workspace(task, sandbox)
    ref = task.base_commit or "HEAD"
    if model_patch.strip():
        applied = await _apply(sandbox, task, model_patch, "model.diff", fallback=True)
        if applied.exit_code != 0:
            return GradeResult(task.id, False, "patch_failed", log=applied.output[-_LOG_TAIL:], error="patch failed")
    await _restore(sandbox, task, ref, await _changed_paths(sandbox, task, ref))
    hidden = [*patch_paths(task.test_patch), *task.hidden_tests, *task.test_files]
    await _restore(sandbox, task, ref, hidden, force=True)
    if task.test_patch:
        applied = await _apply(sandbox, task, task.test_patch, "tests.diff", fallback=False)
        if applied.exit_code != 0:
            return GradeResult(task.id, False, "error", log=applied.output[-_LOG_TAIL:], error="test patch failed")
    for path, content in task.hidden_tests.items():
        await sandbox.write_file(f"{task.workdir}/{path}", content)
    return await _run_tests(sandbox, task)


async def _run_tests(sandbox: Sandbox, task: SWETask) -> GradeResult:
    limit = max(1, round(task.timeout_s))
    targets = " ".join(shlex.quote(target) for target in test_targets(task))
    command = (
        "find . -name __pycache__ -type d -prune -exec rm -rf {} + ; rm -rf .pytest_cache ; "
        f"echo '{_START}'; PYTHONDONTWRITEBYTECODE=1 timeout -k 5 {limit} {task.test_command} {targets}; "
        f"code=$?; echo '{_END}'; exit $code"
    )
    result = await _run(sandbox, task, command, timeout_s=limit + 30)
    log = _between_markers(result.output)
    tests = parse_pytest_log(log)
    f2p = {node: tests.get(node) in PASSING for node in task.fail_to_pass}
    p2p = {node: tests.get(node) in PASSING or tests.get(node) == "SKIPPED" for node in task.pass_to_pass}
    resolved = all(f2p.values()) and all(p2p.values())
    timed_out = result.timed_out or result.exit_code in (124, 137)
    status = "resolved" if resolved else "timeout" if timed_out else "unresolved"
    error = f"the tests ran past {limit} s" if timed_out and not resolved else None
    return GradeResult(task.id, resolved, status, tests, f2p, p2p, log[-_LOG_TAIL:], error)


async def _apply(sandbox: Sandbox, task: SWETask, patch: str, name: str, *, fallback: bool) -> CommandResult:
    # The diff goes inside .git: outside the work tree, so it can neither be committed nor collected as a test.
    path = f".git/skyrl-{name}"
    await sandbox.write_file(f"{task.workdir}/{path}", patch if patch.endswith("\n") else patch + "\n")
    command = f"git apply --whitespace=nowarn {path}"
    if fallback:
        command += f" || patch --batch --fuzz=5 -p1 -i {path}"
    return await _run(sandbox, task, f"({command}) 2>&1; code=$?; rm -f {path}; exit $code")


async def _changed_paths(sandbox: Sandbox, task: SWETask, ref: str) -> list[str]:
    # `ls-files --others` without --exclude-standard also lists ignored files: a planted .gitignore hides nothing.
    command = f"git diff --name-only --no-renames -z {ref} && git ls-files --others -z"
    result = await _run(sandbox, task, command)
    if result.exit_code != 0:
        raise RuntimeError(f"task {task.id}: could not list the files the patch changed: {result.output[-500:]}")
    return [path for path in dict.fromkeys(result.output.split("\0")) if path and is_protected(path, task)]


async def _restore(sandbox: Sandbox, task: SWETask, ref: str, paths: Iterable[str], *, force: bool = False) -> None:
    """Put ``paths`` back as they are at ``ref``: check out the tracked ones, delete the others."""
    paths = [path for path in dict.fromkeys(paths) if force or is_protected(path, task)]
    if not paths:
        return
    quoted = " ".join(shlex.quote(path) for path in paths)
    command = (
        f"for p in {quoted}; do "
        f'if git cat-file -e {ref}:"$p" 2>/dev/null; then git checkout -q {ref} -- "$p"; else rm -rf -- "$p"; fi; '
        "done"
    )
    result = await _run(sandbox, task, command)
    if result.exit_code != 0:
        raise RuntimeError(f"task {task.id}: could not restore test files: {result.output[-500:]}")


async def _run(sandbox: Sandbox, task: SWETask, command: str, *, timeout_s: float = 60.0) -> CommandResult:
    return await sandbox.run(command, timeout_s=timeout_s, workdir=task.workdir)


def _between_markers(output: str) -> str:
    start = output.find(_START)  # our echo runs before any code under test can print a forged marker
    end = output.rfind(_END)
    if start == -1:
        return output
    return output[start + len(_START) : end if end > start else None]
