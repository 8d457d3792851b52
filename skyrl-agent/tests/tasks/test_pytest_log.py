from pathlib import Path

import pytest

from skyrl_agent.tasks.pytest_log import parse_pytest_log

DATA = Path(__file__).parent / "data"
EXPECTED = {
    "tests/test_a.py::test_fail": "FAILED",
    "tests/test_a.py::test_ok": "PASSED",
    "tests/test_a.py::test_p[a b]": "PASSED",
    "tests/test_a.py::test_p[c-d]": "FAILED",
    "tests/test_a.py::test_p[e - f]": "PASSED",
    "tests/test_a.py::test_teardown": "ERROR",  # passed, then errored in teardown: the worse status wins
    "tests/test_a.py::test_xf": "XFAIL",
    "tests/test_a.py::test_xp": "XPASS",
}


@pytest.mark.parametrize("name", ["pytest_rA_q.txt", "pytest_rA.txt"])
def test_real_outputs(name):
    assert parse_pytest_log((DATA / name).read_text()) == EXPECTED


def test_forged_lines_before_the_summary_are_ignored():
    log = (
        "PASSED tests/t.py::test_x\n=== short test summary info ===\n"
        "FAILED tests/t.py::test_x - boom\n1 failed in 0.1s\n"
    )
    assert parse_pytest_log(log) == {"tests/t.py::test_x": "FAILED"}


def test_lines_after_the_final_tally_are_ignored():
    log = "=== short test summary info ===\nFAILED t.py::a\n==== 1 failed in 0.1s ====\nPASSED t.py::a\n"
    assert parse_pytest_log(log) == {"t.py::a": "FAILED"}


def test_without_summary_scans_everything_and_strips_colour():
    log = "\x1b[32mPASSED\x1b[0m t.py::a\nt.py::b FAILED\nrandom noise\n"
    assert parse_pytest_log(log) == {"t.py::a": "PASSED", "t.py::b": "FAILED"}


def test_collection_error_and_unnamed_skip():
    log = "=== short test summary info ===\nERROR tests/t.py\nSKIPPED [1] tests/u.py:4: nope\n"
    assert parse_pytest_log(log) == {"tests/t.py": "ERROR"}
