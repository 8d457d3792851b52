"""Check that tasks are well-formed and that their tests discriminate: the base fails, the gold patch passes.

:func:`validate_task` runs two gradings: the empty patch (every FAIL_TO_PASS test must fail, every PASS_TO_PASS
test must pass) and the gold patch (everything must pass). Static checks run first and need no sandbox.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from skyrl_agent.sandbox.backends import make_machine_backend
from skyrl_agent.sandbox.base import SandboxBackend
from skyrl_agent.tasks.format import SWETask, repo_files
from skyrl_agent.tasks.grading import GradeResult, SandboxFactory, grade, test_targets
from skyrl_agent.tasks.policy import is_protected, patch_paths, violations

if TYPE_CHECKING:
    from skyrl_agent.sandbox.ray_hosts import RayHostSettings

_HUNK = re.compile(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", re.MULTILINE)


@dataclass
class ValidationReport:
    """What is wrong with one task; ``ok`` iff ``problems`` is empty."""

    task_id: str
    problems: list[str] = field(default_factory=list)
    base: GradeResult | None = None  # grading of the empty patch
    gold: GradeResult | None = None  # grading of the gold patch

    @property
    def ok(self) -> bool:
        """Whether the task passed every check."""
        return not self.problems


def static_problems(task: SWETask) -> list[str]:
    """Checks that need no sandbox: patches are well-formed diffs, and the tests they name exist."""
    problems = []
    for name in ("gold_patch", "test_patch"):
        patch = getattr(task, name)
        if patch and not (patch_paths(patch) and _HUNK.search(patch)):
            problems.append(f"{name} is not a unified diff (no ---/+++ headers or @@ hunks)")
    if not task.gold_patch:
        problems.append("gold_patch is empty")
    problems += [f"gold_patch breaks the patch policy: {reason}" for reason in violations(task.gold_patch)]
    touched_tests = [path for path in patch_paths(task.gold_patch) if is_protected(path, task)]
    if touched_tests:
        problems.append(f"gold_patch touches test or config files: {', '.join(touched_tests)}")
    if task.repo is not None:
        available = {*repo_files(task), *patch_paths(task.test_patch), *task.hidden_tests}
        missing = [target for target in test_targets(task) if target not in available]
        if missing:
            problems.append(f"test files of FAIL_TO_PASS/PASS_TO_PASS do not exist: {', '.join(missing)}")
    overlap = set(task.fail_to_pass) & set(task.pass_to_pass)
    if overlap:
        problems.append(f"tests listed as both FAIL_TO_PASS and PASS_TO_PASS: {', '.join(sorted(overlap))}")
    return problems


async def validate_task(task: SWETask, sandboxes: SandboxBackend | SandboxFactory) -> ValidationReport:
    """Validate one task: static checks, then the base (empty patch) and gold gradings in fresh sandboxes."""
    report = ValidationReport(task.id, static_problems(task))
    if report.problems:
        return report
    base, gold = await asyncio.gather(grade(task, "", sandboxes), grade(task, task.gold_patch, sandboxes))
    report.base, report.gold = base, gold
    if base.status == "error":
        report.problems.append(f"hidden tests do not apply: {base.log[-300:]}")
        return report
    passing_on_base = [node for node, ok in base.fail_to_pass.items() if ok]
    if passing_on_base:
        report.problems.append(f"FAIL_TO_PASS tests pass without a fix: {', '.join(passing_on_base)}")
    failing_p2p = [node for node, ok in base.pass_to_pass.items() if not ok]
    if failing_p2p:
        report.problems.append(f"PASS_TO_PASS tests fail on the base: {', '.join(failing_p2p)}")
    if not gold.resolved:
        failing = [node for node, ok in {**gold.fail_to_pass, **gold.pass_to_pass}.items() if not ok]
        reason = gold.error or f"failing tests: {', '.join(failing)}"
        report.problems.append(f"gold patch does not resolve the task ({gold.status}; {reason})")
    return report


async def validate_tasks(
    tasks: Sequence[SWETask], sandboxes: SandboxBackend | SandboxFactory, *, concurrency: int = 4
) -> list[ValidationReport]:
    """Validate every task (``concurrency`` at a time), adding a problem to each task whose id is not unique."""
    limit = asyncio.Semaphore(concurrency)

    async def one(task: SWETask) -> ValidationReport:
        async with limit:
            return await validate_task(task, sandboxes)

    reports = await asyncio.gather(*(one(task) for task in tasks))
    counts = Counter(task.id for task in tasks)
    for report in reports:
        if counts[report.task_id] > 1:
            report.problems.append(f"task id is not unique ({counts[report.task_id]} tasks share it)")
    return list(reports)


def format_table(reports: Sequence[ValidationReport]) -> str:
    """A plain-text table: per task its verdict, tests run, the gold grading's test-run and total seconds, problems."""
    width = max([len("task"), *(len(report.task_id) for report in reports)])
    rows = [f"{'task':<{width}}  {'result':<7}  {'tests':>5}  {'tests s':>7}  {'grade s':>7}  problems"]
    for report in reports:
        gold = report.gold
        numbers = (
            f"{gold.tests_run:5d}  {gold.test_s:7.2f}  {gold.duration_s:7.2f}"
            if gold
            else f"{'-':>5}  {'-':>7}  {'-':>7}"
        )
        verdict = "ok" if report.ok else "INVALID"
        rows.append(f"{report.task_id:<{width}}  {verdict:<7}  {numbers}  {'; '.join(report.problems)}")
    valid = sum(report.ok for report in reports)
    rows.append(f"{valid}/{len(reports)} tasks valid")
    return "\n".join(rows)


def with_reference_times(tasks: Sequence[SWETask], reports: Sequence[ValidationReport]) -> list[SWETask]:
    """``tasks`` with ``reference_s`` set to the gold grading's test-run time of each valid task."""
    measured = {report.task_id: report.gold.test_s for report in reports if report.ok and report.gold}
    return [replace(task, reference_s=round(measured[task.id], 2)) if task.id in measured else task for task in tasks]


def make_backend(
    name: str, *, run_id: str | None = None, lifetime_s: float | None = None, hosts: RayHostSettings | None = None
) -> SandboxBackend:
    """The sandbox backend called ``name``: ``docker``, ``local``, ``process`` or ``ray``.

    ``process`` has no isolation (trusted tasks only); ``ray`` places sandboxes on the sandbox hosts of a Ray
    cluster, ``hosts`` saying which and what they run (:mod:`skyrl_agent.sandbox.ray_hosts`).

    ``run_id`` and ``lifetime_s`` go to the Docker backend (its ``skyrl.run`` label, and how long an unclosed
    sandbox may live), also when Ray hosts run it; the other backends have neither.

    Raises ``ValueError`` naming what is missing when the backend's module is not available.
    """
    if name == "ray":
        from skyrl_agent.sandbox.ray_hosts import RayHostBackend  # imports Ray itself only when a backend is made

        try:
            return RayHostBackend(hosts, run_id=run_id, lifetime_s=lifetime_s)
        except ImportError as exc:
            raise ValueError(f"the ray backend is not available ({exc})") from exc
    return make_machine_backend(name, run_id=run_id, lifetime_s=lifetime_s)
