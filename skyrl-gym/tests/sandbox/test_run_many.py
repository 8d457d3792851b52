"""``run_many``: one program, several standard inputs, each run in a fresh process forked from one sandboxed run."""

from __future__ import annotations

import asyncio
import signal
import uuid
from typing import Any

import pytest

from skyrl_gym.sandbox import CodeExecutor, SandboxLimits

ECHO = "import sys\ndata = sys.stdin.read()\nprint(data.upper(), end='')\nprint(len(data), file=sys.stderr)"


def test_one_result_per_input_in_order(launcher_executor: CodeExecutor) -> None:
    results = launcher_executor.run_many(ECHO, ["ab", b"c\xffd", ""])
    assert [r.stdout for r in results] == ["AB", "C\ufffdD", ""]
    assert [r.stderr for r in results] == ["2\n", "3\n", "0\n"]
    assert all(r.ok and r.isolation == launcher_executor.isolation for r in results)
    assert launcher_executor.run_many(ECHO, []) == []


def test_setup_runs_once_and_each_input_starts_from_its_namespace(launcher_executor: CodeExecutor) -> None:
    setup = "import itertools\ncounter = itertools.count()\nprint('setup output is discarded')"
    code = (
        "seen = next(counter)\nmutable.append(seen)\nprint(seen, mutable, sorted(k for k in globals() if k[0] != '_'))"
    )
    results = launcher_executor.run_many(code, ["", ""], setup=setup + "\nmutable = []")
    # Forked from the same parent: each input sees setup's state, never another input's changes.
    expected = "0 [0] ['counter', 'itertools', 'mutable', 'seen']\n"
    assert [r.stdout for r in results] == [expected, expected]


def test_a_failing_setup_is_the_first_result(launcher_executor: CodeExecutor) -> None:
    results = launcher_executor.run_many("print('never')", ["", ""], setup="print('so far')\n1/0")
    assert len(results) == 1
    assert results[0].exit_code == 1
    assert results[0].stdout == "so far\n"
    assert results[0].stderr.endswith('File "<setup>", line 2, in <module>\nZeroDivisionError: division by zero\n')


def test_errors_are_reported_per_input_as_python_c_would(launcher_executor: CodeExecutor) -> None:
    code = "import sys\nn = int(sys.stdin.read())\nprint(10 // n)\nsys.exit(n)"
    results = launcher_executor.run_many(code, ["5", "0", "x"])
    assert [r.stdout for r in results] == ["2\n", "", ""]
    assert [r.exit_code for r in results] == [5, 1, 1]
    assert results[1].stderr.endswith("ZeroDivisionError: integer division or modulo by zero\n")
    assert results[2].stderr.endswith("ValueError: invalid literal for int() with base 10: 'x'\n")
    syntax = launcher_executor.run_many("print(1 +", ["", ""])
    assert [r.exit_code for r in syntax] == [1, 1]
    assert all(r.stderr.startswith('  File "<string>", line 1\n') for r in syntax)


def test_stop_on_failure(launcher_executor: CodeExecutor) -> None:
    code = "import sys\nsys.exit(int(sys.stdin.read()))"
    assert len(launcher_executor.run_many(code, ["0", "3", "0"], stop_on_failure=True)) == 2
    assert len(launcher_executor.run_many(code, ["0", "3", "0"])) == 3


def test_each_input_has_its_own_timeout(launcher_executor: CodeExecutor) -> None:
    code = "import sys, time\ntime.sleep(float(sys.stdin.read()))\nprint('woke')"
    results = launcher_executor.run_many(code, ["0", "30", "0"], SandboxLimits(timeout_s=1.0))
    assert [r.timed_out for r in results] == [False, True, False]
    assert results[1].exit_code == -signal.SIGKILL
    assert 1.0 <= results[1].duration_s < 10
    assert [r.stdout for r in results] == ["woke\n", "", "woke\n"]


def test_output_caps_per_input_and_in_total(launcher_executor: CodeExecutor) -> None:
    code = "import sys\nprint('x' * int(sys.stdin.read()), end='')"
    limits = SandboxLimits(max_output_bytes=1000)
    flood = launcher_executor.run_many(code, ["10", "5000", "10"], limits)
    assert [len(r.stdout) for r in flood] == [10, 1000, 10]
    assert [r.stdout_truncated for r in flood] == [False, True, False]
    assert not flood[1].ok  # killed at the cap, unless it had exited before its output was read
    budget = launcher_executor.run_many(code, ["600"] * 3, limits, max_total_output_bytes=1000)
    assert [len(r.stdout) for r in budget] == [600, 400, 0]
    assert [r.truncated for r in budget] == [False, True, True]


def test_what_an_input_leaves_running_dies_before_the_next(launcher_executor: CodeExecutor, host: Any) -> None:
    tag = f"{uuid.uuid4().int % 10**6}.123"
    code = (
        "import os, sys\n"
        "if sys.stdin.read() == 'spawn':\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        for fd in (0, 1, 2):\n"
        "            os.close(fd)\n"
        f"        os.execvp('sleep', ['sleep', '{tag}'])\n"
        "else:\n"
        "    alive = []\n"
        "    for pid in os.listdir('/proc'):\n"
        "        try:\n"
        f"            alive += [pid] if b'{tag}' in open(f'/proc/{{pid}}/cmdline', 'rb').read() else []\n"
        "        except OSError:\n"
        "            pass\n"
        "    print(alive)\n"
    )
    results = launcher_executor.run_many(code, ["spawn", "look"])
    if "escaped_processes" in __import__("skyrl_gym.sandbox").sandbox.isolation_guarantees(launcher_executor.isolation):
        assert results[1].stdout == "[]\n"
    assert host.wait_until(lambda: not host.processes_with_argument(tag))


def test_an_input_that_kills_the_batch_ends_it(launcher_executor: CodeExecutor, host: Any) -> None:
    code = "import os, sys\nif sys.stdin.read() == 'kill':\n    os.kill(os.getppid(), 9)\nprint('fine')"
    results = launcher_executor.run_many(code, ["ok", "kill", "ok"])
    assert len(results) == 2
    assert results[0].stdout == "fine\n"
    assert results[1].exit_code == -signal.SIGKILL
    host.assert_healthy(launcher_executor)


def test_inputs_do_not_see_the_batch_report_stream(launcher_executor: CodeExecutor) -> None:
    # Only 0-2 are open in an input's process: it cannot forge the records the batch reports.
    code = "import os\nprint(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    assert [r.stdout for r in launcher_executor.run_many(code, ["", ""])] == ["[0, 1, 2, 3]\n"] * 2


def test_async_run_many(launcher_executor: CodeExecutor) -> None:
    async def main() -> list[list[str]]:
        batches = await asyncio.gather(*(launcher_executor.arun_many(ECHO, [str(n), "z"]) for n in range(4)))
        return [[r.stdout for r in batch] for batch in batches]

    assert asyncio.run(main()) == [[str(n), "Z"] for n in range(4)]


def test_arguments_are_checked(launcher_executor: CodeExecutor) -> None:
    with pytest.raises(TypeError, match="sequence"):
        launcher_executor.run_many("pass", "abc")
    with pytest.raises(TypeError, match="setup"):
        launcher_executor.run_many("pass", [""], setup=b"x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_total_output_bytes"):
        launcher_executor.run_many("pass", [""], max_total_output_bytes=-1)
