"""Grading time beside a plain container: how much the grader adds to running a task's tests.

    .venv/bin/python benchmarks/grading_bench.py --tasks .cache/real-suite/tasks.jsonl          # every task
    .venv/bin/python benchmarks/grading_bench.py --tasks .cache/real-suite/tasks.jsonl --only inflection

Per task and repeat, alternating the two subjects so slow drifts in the machine's load hit both alike:

* **plain**: the repository at the fixed state (gold patch and hidden tests applied on the host) mounted into a
  ``docker run --rm --network none`` of the task's image, running ``python3 -m pytest`` with the grader's
  arguments on the task's test files, timed end to end (container start and removal included);
* **grader**: ``skyrl_agent.tasks.grade`` of the gold patch in Docker, timed end to end (a fresh sandbox, the
  repository written and committed, the patch applied, files restored, the harness run, the report read).

Reported: the medians, the grader's test run alone (``test_s``) and the ratio grader ÷ plain (target ≤ 1.5× on a
≈600-test suite). Output: the table on stdout and ``benchmarks/results/grading_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import host_info

from skyrl_agent.tasks import grade, load_tasks
from skyrl_agent.tasks.format import SWETask, parse_test_command, repo_files
from skyrl_agent.tasks.grading import test_targets, without_summary
from skyrl_agent.tasks.validate import make_backend

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "grading_bench.json"


def _fixed_tree(task: SWETask, root: Path) -> None:
    """The repository with the gold patch and the hidden tests, as the tests see it when grading."""
    for path, content in repo_files(task).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)
    for patch in (task.gold_patch, task.test_patch):
        if patch:
            subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=root, check=True)
    for path, text in task.hidden_tests.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def _plain(task: SWETask, root: Path) -> float:
    command = parse_test_command(task.test_command)
    # The same pytest arguments the grader runs (its -r summary options included), so both do the same test work.
    argv = [command.python, "-m", "pytest", *without_summary(command.args), *test_targets(task)]
    start = time.monotonic()
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{root}:/w", "-w", "/w", task.base_image, *argv],
        capture_output=True,
        check=False,
    )
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{task.id}: the plain run failed: {shlex.join(argv)}\n{proc.stdout[-2000:].decode()}")
    return elapsed


def _bench(task: SWETask, repeats: int) -> dict[str, Any]:
    backend = make_backend("docker")
    plain, graded, test_s, tests = [], [], [], 0
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        _fixed_tree(task, Path(tmp))
        for _ in range(repeats):
            plain.append(_plain(task, Path(tmp)))
            start = time.monotonic()
            result = asyncio.run(grade(task, task.gold_patch, backend))
            graded.append(time.monotonic() - start)
            if not result.resolved:
                raise RuntimeError(f"{task.id}: the gold patch did not resolve ({result.status}: {result.error})")
            test_s.append(result.test_s)
            tests = result.tests_run
    row = {"task": task.id, "tests": tests, "plain_s": statistics.median(plain)}
    row.update(grader_s=statistics.median(graded), grader_test_s=statistics.median(test_s))
    row["ratio"] = row["grader_s"] / row["plain_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", required=True, help="a .jsonl task file")
    parser.add_argument("--only", default="", help="comma-separated substrings of task ids to keep")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    tasks = load_tasks(args.tasks)
    keep = [word for word in args.only.split(",") if word]
    tasks = [task for task in tasks if not keep or any(word in task.id for word in keep)]
    rows = []
    print(f"{'task':<40} {'tests':>6} {'plain s':>8} {'grader s':>9} {'tests s':>8} {'ratio':>6}")
    for task in tasks:
        row = _bench(task, args.repeats)
        rows.append(row)
        print(
            f"{row['task']:<40} {row['tests']:>6} {row['plain_s']:>8.2f} {row['grader_s']:>9.2f}"
            f" {row['grader_test_s']:>8.2f} {row['ratio']:>5.2f}×",
            flush=True,
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"host": host_info(), "repeats": args.repeats, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
