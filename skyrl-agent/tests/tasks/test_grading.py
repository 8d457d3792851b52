import asyncio
import difflib
from dataclasses import replace

import pytest

from skyrl_agent.sandbox.base import SandboxSpec
from skyrl_agent.tasks import grade, load_suite, prepare_workspace
from skyrl_agent.tasks.process_backend import ProcessBackend

TASK = next(task for task in load_suite() if task.id == "durations-format-exact-hour")
F2P_FILE = TASK.fail_to_pass[0].split("::")[0]  # tests/test_format.py, changed by the hidden test patch


def _grade(patch, backend):
    return asyncio.run(grade(TASK, patch, backend))


def _new_file(path, content):
    lines = content.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    header = f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
    return f"{header}@@ -0,0 +1,{len(lines)} @@\n{body}"


def _edit(task, path, old, new):
    """A unified diff replacing ``old`` with ``new`` in the task's copy of ``path``."""
    before = (task.repo / path).read_text()
    after = before.replace(old, new)
    assert after != before
    lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


FORCE_PASS = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
"""


def test_gold_patch_resolves(backend):
    result = _grade(TASK.gold_patch, backend)
    assert result.resolved, result.log
    assert result.status == "resolved"
    assert all(result.fail_to_pass.values())
    assert all(result.pass_to_pass.values())


def test_empty_patch_is_unresolved(backend):
    result = _grade("", backend)
    assert not result.resolved
    assert result.status == "unresolved"
    assert not any(result.fail_to_pass.values())
    assert all(result.pass_to_pass.values())


def test_patch_that_does_not_apply(backend):
    bad = TASK.gold_patch.replace("if remaining > size:", "if remaining is wrong:")
    result = _grade(bad, backend)
    assert (result.resolved, result.status, result.error) == (False, "patch_failed", "patch failed")


@pytest.mark.parametrize("place", ["conftest.py", "tests/conftest.py", "durations/conftest.py"])
def test_planted_conftest_forcing_passes_is_ignored(backend, place):
    result = _grade(_new_file(place, FORCE_PASS), backend)
    assert not result.resolved
    assert result.tests[TASK.fail_to_pass[0]] == "FAILED"


def test_planted_pytest_config_is_ignored(backend):
    ini = "[pytest]\naddopts = -p no:python\n"
    result = _grade(
        TASK.gold_patch + _new_file("pytest.ini", ini) + _new_file("sitecustomize.py", "import sys\n"), backend
    )
    assert result.resolved  # the config was removed, so the real tests ran and the fix counts


def test_patch_writing_the_hidden_test_file_is_overridden(backend):
    # The model defines the hidden test names with trivial bodies; the grader restores the file first.
    fake = "\n\ndef test_exact_units():\n    assert True\n"
    patch = _edit(
        TASK, F2P_FILE, 'assert format_duration(-61) == "-1m 1s"\n', 'assert format_duration(-61) == "-1m 1s"\n' + fake
    )
    result = _grade(patch, backend)
    assert result.status == "unresolved"
    assert result.tests[TASK.fail_to_pass[0]] == "FAILED"


def test_rewritten_visible_test_is_ignored(backend):
    # A visible P2P test is rewritten to pass trivially while the source is broken: the rewrite is dropped.
    task = next(task for task in load_suite() if task.id == "durations-parse-decimal")
    source = _edit(task, "durations/parse.py", "    return total\n", "    return -1.0\n")
    tests = _edit(task, "tests/test_parse.py", "def test_single_units():\n", "def test_single_units():\n    return\n")
    result = asyncio.run(grade(task, source + tests, backend))
    assert result.status == "unresolved"
    assert result.tests["tests/test_parse.py::test_single_units"] == "FAILED"


def test_missing_tests_count_as_failures(backend):
    # The source makes pytest exit at import time: no test is reported, so every test counts as failed.
    patch = _edit(TASK, "durations/format.py", "def format_duration", "raise SystemExit(0)\n\n\ndef format_duration")
    result = _grade(patch, backend)
    assert result.status == "unresolved"
    assert not any(result.pass_to_pass.values())


def test_prepare_workspace_has_one_commit_and_no_hidden_tests():
    async def scenario():
        sandbox = await ProcessBackend().create(SandboxSpec())
        try:
            await prepare_workspace(TASK, sandbox)
            log = await sandbox.run("git log --all --oneline | wc -l; git status --porcelain", workdir="/workspace")
            hidden = (await sandbox.read_file(f"/workspace/{F2P_FILE}")).decode()
            return log.output.split(), hidden
        finally:
            await sandbox.close()

    log, hidden = asyncio.run(scenario())
    assert log == ["1"]
    assert "test_exact_units" not in hidden


def test_timeout_is_reported(backend):
    task = replace(TASK, timeout_s=1)
    patch = _edit(
        TASK,
        "durations/format.py",
        "    remaining = int(seconds)\n",
        "    remaining = int(seconds)\n    __import__('time').sleep(30)\n",
    )
    result = asyncio.run(grade(task, patch, backend))
    assert (result.resolved, result.status) == (False, "timeout")
