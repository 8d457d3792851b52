"""SWE-style tasks: the task format, the shipped suite, grading and validation.

The suite (``suite/``) holds small Python codebases, each at a buggy state, and ``suite/tasks.jsonl`` with one task
per bug: an issue, hidden tests and the reference fix.
"""

from __future__ import annotations

from pathlib import Path

from skyrl_agent.tasks.format import SWETask, TaskFormatError, load_swebench, load_tasks, save_tasks
from skyrl_agent.tasks.grading import Grader, GradeResult, grade
from skyrl_agent.tasks.validate import ValidationReport, validate_task, validate_tasks
from skyrl_agent.tasks.workspace import WorkspaceError, prepare_workspace, submission_diff

SUITE_PATH = Path(__file__).parent / "suite" / "tasks.jsonl"


def load_suite() -> list[SWETask]:
    """The shipped task suite (its repositories are directories next to ``tasks.jsonl``)."""
    return load_tasks(SUITE_PATH)


__all__ = [
    "SUITE_PATH",
    "GradeResult",
    "Grader",
    "SWETask",
    "TaskFormatError",
    "ValidationReport",
    "WorkspaceError",
    "grade",
    "load_suite",
    "load_swebench",
    "load_tasks",
    "prepare_workspace",
    "save_tasks",
    "submission_diff",
    "validate_task",
    "validate_tasks",
]
