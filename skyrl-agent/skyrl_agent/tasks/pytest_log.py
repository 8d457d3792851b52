"""Parse the per-test results out of ``pytest -rA`` output.

``-rA`` ends the run with a "short test summary info" section of ``STATUS node_id[ - reason]`` lines (pytest ≥ 6;
older versions and some plugins print ``node_id STATUS``). Only that last section is trusted when present: output a
test prints to the terminal earlier (e.g. a forged ``PASSED x`` line) cannot then be taken for a result. When the
section is missing (a crash, a timeout) the whole log is scanned so that what finished still counts.
"""

from __future__ import annotations

import re

STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
# The closing tally: "==== 2 failed, 4 passed in 0.03s ====" (plain "2 failed, 4 passed in 0.03s" under -q).
_FINAL_LINE = re.compile(r"^=*\s*(\d+ \w+(, )?)+.* in [\d.]+s( \([\d:]+\))?\s*=*$|^=+ no tests ran")
_PREFIXED = re.compile(rf"^({'|'.join(STATUSES)}) (\S.*)$")
_SUFFIXED = re.compile(rf"^(\S+::\S.*?) ({'|'.join(STATUSES)})(?: .*)?$")
# pytest can report more than one status per test (a test that passes and errors in teardown): the worst
# one wins, as a test is only as good as its worst phase.
_RANK = {"ERROR": 5, "FAILED": 4, "XPASS": 3, "SKIPPED": 2, "XFAIL": 1, "PASSED": 0}


def parse_pytest_log(log: str) -> dict[str, str]:
    """Node id → status (one of :data:`STATUSES`) for every test the log reports.

    Parametrised ids keep their brackets (``test_x[a-b]``); an ``ERROR`` on a whole file (a collection error) is
    reported under the file path, so grading counts every test of that file as missing.
    """
    lines = [_ANSI.sub("", line).rstrip() for line in log.splitlines()]
    start = _last_summary_start(lines)
    results: dict[str, str] = {}
    for line in lines[start:]:
        if start and _FINAL_LINE.match(line):
            break
        parsed = _parse_line(line)
        if parsed is None:
            continue
        node_id, status = parsed
        if _RANK[status] >= _RANK.get(results.get(node_id, ""), -1):
            results[node_id] = status
    return results


def _last_summary_start(lines: list[str]) -> int:
    for index in range(len(lines) - 1, -1, -1):
        if _SUMMARY_HEADER.match(lines[index]):
            return index + 1
    return 0


def _parse_line(line: str) -> tuple[str, str] | None:
    match = _PREFIXED.match(line)
    if match:
        status, node_id = match.group(1), match.group(2)
        if status == "SKIPPED" and node_id.startswith("["):
            return None  # `SKIPPED [1] path:line: reason` names no test; run pytest with -v to get node ids
        return _strip_reason(node_id), status
    match = _SUFFIXED.match(line)
    if match:
        return match.group(1).strip(), match.group(2)
    return None


def _strip_reason(text: str) -> str:
    """``tests/x.py::t[a - b] - assert 1 == 2`` → ``tests/x.py::t[a - b]``.

    Cuts at the first `` - `` outside brackets.
    """
    depth = 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif depth == 0 and text.startswith(" - ", index):
            return text[:index].strip()
    return text.strip()
