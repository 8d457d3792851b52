"""SWE-bench-style grading of a model patch, in a fresh sandbox the agent never touched.

Steps (the contract of :func:`grade` and :class:`Grader`):

1. check the diff against the patch policy (:mod:`.policy`): a diff that may not apply is ``patch_rejected``;
2. start a fresh sandbox from the task's image and write the repository as a single-commit git repo (or use the
   repository the image holds);
3. apply the diff from a file outside the repository with ``git apply``, falling back to ``patch -u --fuzz=5``;
   a diff that applies neither way is ``patch_failed``;
4. put back what the diff did to tests and test configuration (:func:`.policy.is_protected`), then the hidden
   tests: the task's ``test_files``, the files of ``test_patch`` and ``hidden_tests``;
5. run the hidden tests through the test run (:mod:`.testrun`): an interpreter in isolated mode, a pytest the
   repository cannot shadow or extend (plugin autoload off, only the declared plugins, explicit rootdir and the
   task's own config), results on the test run's own signed channel, the log to a file with a cap;
6. resolved iff every FAIL_TO_PASS test passed (PASSED/XFAIL) and every PASS_TO_PASS test passed or was
   skipped; a test missing from the report counts as failed. A run whose report was forged or whose tripwire
   fired is ``tampered``.

A run that hits its time limit is retried once, alone (no other grading of the same :class:`Grader` runs
meanwhile), with a limit derived from the task's reference time: a run that timed out because the machine was
busy is not a reward of 0. If the retry times out too, the patch is at fault: ``timeout``, unresolved.

A sandbox that the test run ends from the inside (:class:`~skyrl_agent.sandbox.shell.CommandBrokeSandboxError`:
the patched code killed every process, or wrote into the runner's channel) is ``broke_sandbox``, unresolved: it
says something about the patch, and masking it would reward a patch that kills its grader. Other sandbox
infrastructure failures (:class:`~skyrl_agent.sandbox.base.SandboxError`) propagate: they say nothing about
the patch and the caller decides whether to retry. The grading sandbox is closed on every exit path, to the end
even when the grading is cancelled meanwhile; a close that fails after the verdict was reached is logged and
the verdict kept (the verdict is sound, and the sandbox is the backend's to reap).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import shlex
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from skyrl_agent.sandbox.base import (
    CommandResult,
    Sandbox,
    SandboxBackend,
    SandboxClosedError,
    SandboxError,
    SandboxSpec,
    SandboxUnavailableError,
)
from skyrl_agent.tasks.format import SWETask, parse_test_command, repo_files
from skyrl_agent.tasks.policy import patch_paths, protected, violations
from skyrl_agent.tasks.workspace import GIT, WorkspaceError, prepare_workspace, write_repo

SandboxFactory = Callable[[SandboxSpec], Awaitable[Sandbox]]
PASSING = frozenset({"PASSED", "XFAIL"})
LOG_CAP = 8 << 20  # bytes of test log kept in the sandbox (plus its last 64 KiB); more is reported
RETRY_FACTOR = 3.0  # a retried run's limit: this many times the task's reference time (at least its timeout_s)
RETRY_MARGIN_S = 10.0
_TESTRUN = (Path(__file__).parent / "testrun.py").read_bytes()
_TRIPWIRE = (Path(__file__).parent / "tripwire.py").read_bytes()
IDLE_SHARE = 0.05  # a timed-out run whose tests used less CPU than this (cores, second half of the run) slept
_LOG_TAIL = 4000  # characters of the test log kept on the result
# pytest reports more than one status for a test that passes and errors in teardown: the worst one wins.
_RANK = {"ERROR": 5, "FAILED": 4, "XPASS": 3, "SKIPPED": 2, "XFAIL": 1, "PASSED": 0}
_CONFIG_PROBE = """
for f in pytest.ini .pytest.ini pytest.toml .pytest.toml; do
  {git} cat-file -e {ref}:"$f" 2>/dev/null && {{ echo "$f"; exit 0; }}
done
{git} show {ref}:pyproject.toml 2>/dev/null | grep -q '^\\[tool\\.pytest' && {{ echo pyproject.toml; exit 0; }}
{git} show {ref}:tox.ini 2>/dev/null | grep -q '^\\[pytest\\]' && {{ echo tox.ini; exit 0; }}
{git} show {ref}:setup.cfg 2>/dev/null | grep -q '^\\[tool:pytest\\]' && {{ echo setup.cfg; exit 0; }}
exit 0
"""

# For each NUL-separated path in "$d/restore": clear any ancestor the patch made a file, then check the path out
# of the base commit (replacing whatever the patch put there) or, if the base does not have it, remove it.
_RESTORE = """
while IFS= read -r -d "" p; do
  rest="$p"; a=""
  while case "$rest" in */*) true;; *) false;; esac; do
    a="${{a:+$a/}}${{rest%%/*}}"; rest="${{rest#*/}}"
    if [ -L "$a" ] || {{ [ -e "$a" ] && [ ! -d "$a" ]; }}; then rm -f -- "$a" || exit 1; fi
  done
  rm -rf -- "$p" || exit 1
  if {git} cat-file -e {ref}:"$p" 2>/dev/null; then {git} checkout -q {ref} -- "$p" || exit 1; fi
done < "$d/restore"
"""

log = logging.getLogger(__name__)

__all__ = ["GradeResult", "Grader", "default_concurrency", "grade", "prepare_workspace", "test_targets"]


@dataclass(frozen=True)
class GradeResult:
    """The verdict on one patch.

    ``status`` is ``resolved``, ``unresolved``, ``patch_rejected`` (the patch policy forbids the diff),
    ``patch_failed`` (the diff did not apply), ``timeout`` (the hidden tests ran past the limit twice),
    ``tampered`` (the test run's report was forged or its tripwire fired), ``broke_sandbox`` (the test run, which
    runs the patch's code, ended the sandbox from the inside) or ``error`` (the task itself is
    broken: its hidden tests do not apply, or the test run could not start).
    """

    task_id: str
    resolved: bool
    status: str
    tests: Mapping[str, str] = field(default_factory=dict)  # node id → pytest status, from the test run's report
    fail_to_pass: Mapping[str, bool] = field(default_factory=dict)
    pass_to_pass: Mapping[str, bool] = field(default_factory=dict)
    log: str = ""  # the tail of the test output (or of the failed apply)
    error: str | None = None
    duration_s: float = 0.0  # the whole grading: sandbox, patch, tests
    test_s: float = 0.0  # the hidden-test run alone (what a task's reference time measures)
    attempts: int = 1  # 2 when the first run timed out and was retried alone
    log_truncated: bool = False  # the test log passed LOG_CAP (the report is not affected)
    tests_run: int = 0  # tests pytest collected
    busy_share: float | None = None  # a timed-out run: cores the tests used over its second half (None: unknown)

    @property
    def slept(self) -> bool:
        """Whether a timed-out run's tests slept through it (a busy machine slows tests down, it does not stop them)."""
        return self.status == "timeout" and self.busy_share is not None and self.busy_share < IDLE_SHARE


def default_concurrency(spec: SandboxSpec | None = None) -> int:
    """Gradings at once that this machine can run without slowing each other: its cores ÷ a sandbox's CPUs."""
    cpus = (spec or SandboxSpec()).cpus
    return max(1, int((os.cpu_count() or 1) // max(cpus, 1.0)))


def retry_limit(task: SWETask) -> float:
    """The limit of a retried run: ``RETRY_FACTOR`` × the reference time plus a margin, at least ``timeout_s``."""
    if task.reference_s is None:
        return task.timeout_s
    return max(task.timeout_s, RETRY_FACTOR * task.reference_s + RETRY_MARGIN_S)


class Grader:
    """Grades patches in fresh sandboxes from ``sandboxes``, at most ``concurrency`` at once.

    Args:
        sandboxes: a backend, or a coroutine function making a sandbox from a spec.
        concurrency: gradings at once (default: :func:`default_concurrency`).
        spec: the base of every grading sandbox's spec (the task sets image and workdir).
        log_cap: bytes of test log kept in the sandbox.
    """

    def __init__(
        self,
        sandboxes: SandboxBackend | SandboxFactory,
        *,
        concurrency: int | None = None,
        spec: SandboxSpec | None = None,
        log_cap: int = LOG_CAP,
    ) -> None:
        self._create = sandboxes.create if isinstance(sandboxes, SandboxBackend) else sandboxes
        self.spec = spec or SandboxSpec()
        self.concurrency = concurrency or default_concurrency(self.spec)
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        self.log_cap = log_cap
        self._slots = asyncio.Semaphore(self.concurrency)

    async def grade(self, task: SWETask, model_patch: str, *, spec: SandboxSpec | None = None) -> GradeResult:
        """Grade ``model_patch`` against ``task``; a timed-out run that did not sleep is retried once (module doc)."""
        start = time.monotonic()
        rejected = violations(model_patch)
        if rejected:
            error = "the patch policy forbids this diff: " + "; ".join(rejected)
            return GradeResult(task.id, False, "patch_rejected", error=error)
        async with self._slots:
            result = await self._attempt(task, model_patch, task.timeout_s, spec)
        if result.status == "timeout" and not result.slept:
            async with self._slots:  # one slot like any grading: a hanging patch holds no one else up
                result = replace(await self._attempt(task, model_patch, retry_limit(task), spec), attempts=2)
        return replace(result, duration_s=time.monotonic() - start)

    async def _attempt(self, task: SWETask, patch: str, limit: float, spec: SandboxSpec | None) -> GradeResult:
        sandbox = await self._create(replace(spec or self.spec, image=task.base_image, workdir=task.workdir))
        try:
            result = await _Run(task, sandbox, limit, self.log_cap).grade(patch)
        except BaseException:
            await _close_to_the_end(sandbox, task.id)
            raise
        await _close_to_the_end(sandbox, task.id)
        return result


async def _close_to_the_end(sandbox: Sandbox, task_id: str) -> None:
    """Close ``sandbox``; a cancellation meanwhile waits for the close and is raised after it. A close error is logged.

    The caller's result (a verdict, or the error that ended the grading) is what counts, not the close's error.
    """
    closing = asyncio.ensure_future(sandbox.close())
    cancelled = False
    while True:
        try:
            await asyncio.shield(closing)
            break
        except asyncio.CancelledError:
            if closing.cancelled():
                break
            cancelled = True  # the grading was cancelled; the close goes on
        except Exception as exc:
            log.warning("task %s: closing grading sandbox %s failed: %s", task_id, sandbox.id, exc)
            break
    if cancelled:
        raise asyncio.CancelledError


_SHARED: weakref.WeakKeyDictionary[Any, Grader] = weakref.WeakKeyDictionary()


async def grade(
    task: SWETask, model_patch: str, sandboxes: SandboxBackend | SandboxFactory, *, spec: SandboxSpec | None = None
) -> GradeResult:
    """Grade ``model_patch`` against ``task`` in a fresh sandbox from ``sandboxes`` (closed before returning).

    Calls with the same ``sandboxes`` object share one :class:`Grader`, so its concurrency limit holds for them
    all.
    """
    grader = _SHARED.get(sandboxes)
    if grader is None:
        grader = _SHARED[sandboxes] = Grader(sandboxes)
    return await grader.grade(task, model_patch, spec=spec)


def test_targets(task: SWETask) -> list[str]:
    """The test files to pass to pytest: the files of every FAIL_TO_PASS and PASS_TO_PASS node id."""
    files = dict.fromkeys(node.split("::", 1)[0] for node in (*task.fail_to_pass, *task.pass_to_pass))
    return list(files)


class _Run:
    """One grading attempt in one sandbox."""

    def __init__(self, task: SWETask, sandbox: Sandbox, limit: float, log_cap: int) -> None:
        self.task, self.sandbox, self.limit, self.log_cap = task, sandbox, limit, log_cap
        self.token = secrets.token_hex(16)
        # Outside the repository, where the patch cannot reach. Commands name it "$d": a sandbox may keep its
        # /tmp elsewhere for the host (the process backend's TMPDIR); files are written to its sandbox path.
        self.name = f"skyrl-grader-{self.token[:12]}"
        self.dir = f"/tmp/{self.name}"
        self.ref = shlex.quote(task.base_commit or "HEAD")

    async def grade(self, patch: str) -> GradeResult:
        task = self.task
        files = repo_files(task)
        if files:
            await write_repo(task, self.sandbox, files)
        if patch.strip():
            applied = await self._apply(patch, "model.diff", fallback=True)
            if applied.exit_code != 0:
                return GradeResult(
                    task.id, False, "patch_failed", log=applied.output[-_LOG_TAIL:], error="patch failed"
                )
        try:
            await self._restore(protected(await self._changed_paths(), task))
            await self._restore([*patch_paths(task.test_patch), *task.hidden_tests, *task.test_files])
        except _PatchInTheWay as exc:
            return GradeResult(task.id, False, "tampered", error=str(exc))
        if task.test_patch:
            applied = await self._apply(task.test_patch, "tests.diff", fallback=False)
            if applied.exit_code != 0:
                return GradeResult(task.id, False, "error", log=applied.output[-_LOG_TAIL:], error="test patch failed")
        for path, content in task.hidden_tests.items():
            await self.sandbox.write_file(f"{task.workdir}/{path}", content)
        return await self._run_tests()

    async def _apply(self, patch: str, name: str, *, fallback: bool) -> CommandResult:
        await self.sandbox.write_file(f"{self.dir}/{name}", patch if patch.endswith("\n") else patch + "\n")
        path = f'"$d/{name}"'
        command = f"{GIT} apply --whitespace=nowarn {path}"
        if fallback:  # -u: only a unified diff; patch would otherwise also take context and ed-style diffs
            command += f" || patch --batch -u --fuzz=5 -p1 --no-backup-if-mismatch -r - -i {path}"
        return await self._sh(f"({command}) 2>&1")

    async def _changed_paths(self) -> list[str]:
        # `ls-files --others` without --exclude-standard also lists ignored files: a planted .gitignore hides nothing.
        # The list goes through a file: a patch with many files must not overflow the command output's cap.
        listed = f"{GIT} diff --name-only --no-renames -z {self.ref} && {GIT} ls-files --others -z"
        result = await self._sh(f'mkdir -p "$d" && {{ {listed}; }} > "$d/changed"')
        if result.exit_code != 0:
            raise WorkspaceError(f"task {self.task.id}: could not list the files the patch changed: {result.output}")
        data = await self.sandbox.read_file(f"{self.dir}/changed")
        return [path for path in data.decode("utf-8", errors="surrogateescape").split("\0") if path]

    async def _restore(self, paths: Iterable[str]) -> None:
        """Put ``paths`` back as they are at the base commit: check out the tracked ones, delete the others.

        A path whose parent the patch replaced with a file (or whose own place holds a directory of the patch's)
        is cleared first: the hidden tests go where the task says. Raises :class:`_PatchInTheWay` when the
        patch's files still keep a path from being restored.
        """
        paths = list(dict.fromkeys(path for path in paths if path))
        if not paths:
            return
        data = "".join(f"{path}\0" for path in paths)
        await self.sandbox.write_file(f"{self.dir}/restore", data)
        command = _RESTORE.format(git=GIT, ref=self.ref)
        result = await self._sh(command)
        if result.exit_code != 0:
            raise _PatchInTheWay(
                f"task {self.task.id}: the patch's files keep the tests from being put back: {result.output[-500:]}"
            )

    async def _config(self) -> str:
        """The task's pytest config file at the base commit (restored in the tree), or an empty one of ours."""
        probe = _CONFIG_PROBE.format(git=GIT, ref=self.ref)
        found = (await self._sh(probe)).output.strip().splitlines()
        if found:
            return shlex.quote(found[-1])  # relative: pytest resolves it in the working directory
        await self.sandbox.write_file(f"{self.dir}/pytest.ini", "[pytest]\n")
        return '"$d/pytest.ini"'

    async def _run_tests(self) -> GradeResult:
        task, command = self.task, parse_test_command(self.task.test_command)
        guard = [*test_targets(task), *task.hidden_tests, *patch_paths(task.test_patch)]
        await self.sandbox.write_file(f"{self.dir}/testrun.py", _TESTRUN)
        await self.sandbox.write_file(f"{self.dir}/tripwire.py", _TRIPWIRE)
        await self.sandbox.write_file(f"{self.dir}/guard", "".join(f"{path}\n" for path in dict.fromkeys(guard)))
        await self.sandbox.write_file(f"{self.dir}/token", self.token)
        config = await self._config()
        supervisor = f'{shlex.quote(command.python)} -I "$d/testrun.py" run --dir "$d"'
        options = shlex.join(["--log-cap", str(self.log_cap), "--timeout", f"{self.limit:g}", "--", "child"])
        child = f'--workdir "$PWD" --config {config} --plugins {shlex.quote(",".join(command.plugins))}'
        pytest_args = shlex.join(["--", *without_summary(command.args), *test_targets(task)])
        clean = "find . -name __pycache__ -type d -prune -exec rm -rf {} + ; rm -rf .pytest_cache ; "
        run = f'{clean}{supervisor} {options} {child} --guard "$d/guard" {pytest_args}'
        try:
            # From here on the sandbox runs the patch's code: what becomes of it is the patch's doing.
            result = await self._sh(run, timeout_s=self.limit + 60)
            summary = _summary(result.output, self.token)
            if summary is None:
                return self._unreported(result)
            files = [await self._read(f"{self.dir}/{name}") for name in ("report.jsonl", "test.log")]
        except (SandboxUnavailableError, SandboxClosedError):
            raise  # the daemon stopped answering, or the grader closed the sandbox: not the patch
        except SandboxError as exc:
            error = f"the patched code ended the grading sandbox from the inside: {exc}"
            return GradeResult(task.id, False, "broke_sandbox", error=error)
        return self._verdict(summary, *files)

    def _unreported(self, result: CommandResult) -> GradeResult:
        """No summary from the supervisor: the tests (the patch's code) killed it, starved it or buried its line."""
        if result.timed_out:
            status, why = "timeout", "the sandbox command timed out: the tests kept the test run from finishing"
        else:
            status = "broke_sandbox"
            why = "its output was flooded past the sandbox's cap" if result.truncated else "it was ended from inside"
        error = f"the grading test run did not report ({why})"
        return GradeResult(self.task.id, False, status, log=result.output[-_LOG_TAIL:], error=error)

    def _verdict(self, summary: Mapping[str, Any], report: bytes | str, log: bytes | str) -> GradeResult:
        """The verdict from the supervisor's summary and the raw files (a str for a file: why it could not be read)."""
        task = self.task
        problems = [f"the {name} could not be read: {why}" for name, why in (("report", report), ("test log", log))
                    if isinstance(why, str)]  # fmt: skip
        report = report if isinstance(report, bytes) else b""
        log_text = log[-4 * _LOG_TAIL :].decode("utf-8", errors="replace") if isinstance(log, bytes) else ""
        if summary.get("report_error"):
            problems.append(f"the test run could not write its report: {summary['report_error']}")
        if hashlib.sha256(report).hexdigest() != summary.get("report_sha256"):
            # Nothing in a report rewritten behind the test run's back is read (it may not even parse).
            problems.append("the report file changed after the test run wrote it")
            report = b""
        tests, finish, tampered = _parse_report(report)
        f2p = {node: tests.get(node) in PASSING for node in task.fail_to_pass}
        p2p = {node: tests.get(node) in PASSING or tests.get(node) == "SKIPPED" for node in task.pass_to_pass}
        problems += tampered
        if summary.get("forged"):
            problems.append(f"{summary['forged']} unsigned lines arrived on the report channel")
        resolved = all(f2p.values()) and all(p2p.values()) and finish is not None and not problems
        status, error = "resolved" if resolved else "unresolved", None
        if problems:
            status, error = "tampered", "; ".join(problems)
        elif summary.get("timed_out"):
            status, error = ("timeout", f"the tests ran past {self.limit:g} s") if not resolved else (status, None)
        elif finish is None:
            error = f"the test process ended (exit {summary.get('exit_code')}) before pytest finished its session"
        return GradeResult(
            task.id, resolved, status, tests, f2p, p2p, log_text[-_LOG_TAIL:], error,
            test_s=float(summary.get("duration_s", 0.0)), log_truncated=bool(summary.get("log_truncated")),
            tests_run=int(finish.get("collected", 0)) if finish else 0,
            busy_share=summary.get("busy_share"),
        )  # fmt: skip

    async def _read(self, path: str) -> bytes | str:
        """The bytes of a file the supervisor wrote, or why they cannot be read (the tests may have replaced it)."""
        try:
            return await self.sandbox.read_file(path)
        except OSError as exc:  # a directory, a file made unreadable or too large, or removed
            return f"{type(exc).__name__}: {exc}"

    async def _sh(self, command: str, *, timeout_s: float = 120.0) -> CommandResult:
        prefix = f'd="${{TMPDIR:-/tmp}}/{self.name}"; '
        return await self.sandbox.run(prefix + command, timeout_s=timeout_s, workdir=self.task.workdir)


class _PatchInTheWay(Exception):
    """The patch's files keep a test file from being put back where the task has it."""


def without_summary(args: Iterable[str]) -> list[str]:
    """``args`` with pytest's ``-r`` summary options replaced by ``-rfE`` (failures and errors only).

    The verdict comes from the test run's report, not the terminal: a ``-rA`` summary only costs time (on a
    7,500-test suite it made pytest 4× slower, 4.5 → 19.8 s), while failures and errors still help a reader.
    """
    kept = [arg for arg in args if not (arg.startswith("-r") and len(arg) > 2) and arg != "--report-chars"]
    return [*kept, "-rfE"]


def _summary(output: str, token: str) -> dict[str, Any] | None:
    """The test run's last line, if it carries this run's token (a forged line cannot know it)."""
    for line in reversed(output.strip().splitlines()):
        try:
            summary = json.loads(line)
        except ValueError:
            continue
        if isinstance(summary, dict) and summary.get("token") == token:
            return summary
    return None


def _parse_report(report: bytes) -> tuple[dict[str, str], dict[str, Any] | None, list[str]]:
    """Node id → worst status, the session's final record (None when it did not finish), and tamper findings."""
    tests: dict[str, str] = {}
    finish: dict[str, Any] | None = None
    tampered: list[str] = []
    for line in report.splitlines():
        record = json.loads(line)  # the test run wrote every line with json.dumps, and the hash says it did
        kind = record.get("t")
        if kind == "finish":
            finish = record
        elif kind == "tamper":
            tampered.append(str(record.get("what")))
        elif kind == "test":
            node, status = str(record.get("id")), status_of(record)
            if status is not None and _RANK[status] >= _RANK.get(tests.get(node, ""), -1):
                tests[node] = status
    return tests, finish, tampered


def status_of(record: Mapping[str, Any]) -> str | None:
    """The SWE-bench status of one test phase, from the raw facts the test run sent (None: the phase decides none).

    A call phase that passed counts as PASSED only if it reached the test function; a skip or an xfail counts as
    SKIPPED or XFAIL only if the tests declared it (a marker, or raised from a test file or ``conftest.py``), and
    as FAILED when the code under test raised it.
    """
    when, outcome = record.get("when"), record.get("outcome")
    xfail, declared = bool(record.get("xfail")), bool(record.get("declared"))
    if when == "collect":
        return "ERROR" if outcome == "failed" else None
    skipped = ("XFAIL" if xfail else "SKIPPED") if declared else "FAILED"
    if when == "call":
        if outcome == "passed":
            return "XPASS" if xfail else ("PASSED" if record.get("ran") else "FAILED")
        return skipped if outcome == "skipped" else "FAILED"
    if outcome == "failed":
        return "ERROR"
    return skipped if when == "setup" and outcome == "skipped" else None
