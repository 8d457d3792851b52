"""The grader's test process beside plain pytest: what the tripwire and the reporter cost per test.

    .venv/bin/python benchmarks/grading_overhead_bench.py        # 5,000 tests, 3 rounds (≈1 minute on 2 cores)
    .venv/bin/python benchmarks/grading_overhead_bench.py --tests 200 --rounds 1   # smoke run

Workload: one test file of ``--tests`` parametrised tests that each assert one product. Sides, alternating per
round so drifts in the machine's load hit both alike:

- ``plain``: ``python -I -m pytest -q -p no:cacheprovider`` on the file;
- ``test_run``: the grading test process (``skyrl_agent/tasks/testrun.py child``: the tripwire armed over the
  runner, the reporter sending a line per phase) on the same file, its report lines to ``/dev/null``.

Reported (never asserted): each side's median wall time and the ratio test_run ÷ plain. Output: the table on
stdout and ``--output`` (default ``benchmarks/results/grading_overhead_bench.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import host_info

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "skyrl-agent" / "skyrl_agent" / "tasks"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "grading_overhead_bench.json"


def _workdir(tests: int) -> Path:
    """A directory with the test file, the test process's files and an empty pytest config."""
    root = Path(tempfile.mkdtemp(prefix="skyrl-test-run-bench-"))
    (root / "tests").mkdir()
    ids = [f"case-{index:05d}" for index in range(tests)]
    body = (
        f"import pytest\n\n\n@pytest.mark.parametrize('name', {ids!r})\ndef test_many(name):\n    assert 2 * 2 == 4\n"
    )
    (root / "tests" / "test_many.py").write_text(body)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "guard").write_text("tests/test_many.py\n")
    for name in ("testrun.py", "tripwire.py"):
        shutil.copy(TASKS / name, root / name)
    return root


def _time(argv: list[str], root: Path, stdin: bytes) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=root, input=stdin, capture_output=True, check=False, pass_fds=())
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{argv[2]} failed (exit {done.returncode}): {done.stdout.decode()[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    root = _workdir(args.tests)
    pytest_args = ["-q", "-p", "no:cacheprovider", "tests"]
    plain = [sys.executable, "-I", "-m", "pytest", "-c", "pytest.ini", *pytest_args]
    child = [sys.executable, "-I", "testrun.py", "child", "--report-fd", "1", "--workdir", ".", "--config",
             "pytest.ini", "--plugins", "", "--guard", "guard", "--", *pytest_args]  # fmt: skip
    times: dict[str, list[float]] = {"plain": [], "test_run": []}
    try:
        for round_index in range(args.rounds):
            sides = [("plain", plain, b""), ("test_run", child, b"token\n")]
            for name, argv, stdin in sides if round_index % 2 == 0 else reversed(sides):
                times[name].append(_time(argv, root, stdin))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["test_run"] / medians["plain"]
    print(f"{'side':<10} {'median s':>9}  ({args.tests} tests, {args.rounds} rounds)")
    for name, value in medians.items():
        print(f"{name:<10} {value:>9.2f}")
    print(f"ratio test_run / plain: {ratio:.2f}x")
    result = {"tests": args.tests, "rounds": args.rounds, "times_s": times, "median_s": medians, "ratio": ratio,
              "host": host_info()}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
