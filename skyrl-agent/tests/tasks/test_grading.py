import asyncio
import difflib
from dataclasses import replace

import pytest

from skyrl_agent.sandbox.base import SandboxSpec
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import Grader, SWETask, grade, grading, load_suite, prepare_workspace
from skyrl_agent.tasks.format import repo_files

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


def test_a_patch_that_sleeps_through_the_limit_times_out_without_a_retry(backend):
    # The tests slept through the second half of the run: a busy machine slows tests down, it does not stop them.
    # 4 s: pytest's start-up (CPU) must be over before the second half, even on a loaded host.
    task = replace(TASK, timeout_s=4)
    patch = _edit(
        TASK,
        "durations/format.py",
        "    remaining = int(seconds)\n",
        "    remaining = int(seconds)\n    __import__('time').sleep(30)\n",
    )
    result = asyncio.run(grade(task, patch, backend))
    assert (result.resolved, result.status, result.attempts) == (False, "timeout", 1)
    assert result.slept, result.busy_share


SLOW_FIRST_RUN = """import os


def test_machine_load():
    # Stands for a machine busy with other work: only the first run is slow (working, not asleep), whatever the patch.
    if not os.path.exists({mark!r}):
        open({mark!r}, "w").close()
        while True:
            pass
"""


def _load_sensitive(tmp_path, **overrides):
    """TASK plus a hidden test that runs past any limit on its first run only (process backend: host paths)."""
    hidden = {**TASK.hidden_tests, "tests/test_zz_load.py": SLOW_FIRST_RUN.format(mark=str(tmp_path / "ran"))}
    p2p = (*TASK.pass_to_pass, "tests/test_zz_load.py::test_machine_load")
    return replace(TASK, hidden_tests=hidden, pass_to_pass=p2p, **overrides)


def test_a_run_that_timed_out_working_is_retried_and_counts(backend, tmp_path):
    # 4 s: the spin, not pytest's start-up, must fill the second half of the run, even on a loaded host.
    task = _load_sensitive(tmp_path, timeout_s=4, reference_s=0.5)
    result = asyncio.run(Grader(backend).grade(task, TASK.gold_patch))
    assert (result.resolved, result.status, result.attempts) == (True, "resolved", 2), result.error


def test_a_patch_that_hangs_the_tests_scores_zero_after_the_retry(backend, monkeypatch):
    monkeypatch.setattr(grading, "RETRY_MARGIN_S", 0.5)
    # The first limit leaves the test process time to reach the spin on a loaded host (a run whose second half is
    # spent starting pytest may read as asleep, and is not retried); the retry's: max(4, 3 × 1.2 + 0.5) = 4.1 s.
    task = replace(TASK, timeout_s=4, reference_s=1.2)
    hang = _edit(TASK, "durations/format.py", "    remaining = int(seconds)\n", "    while True:\n        pass\n")
    result = asyncio.run(Grader(backend).grade(task, TASK.gold_patch + hang))
    assert (result.resolved, result.status, result.attempts) == (False, "timeout", 2)
    assert result.error == "the tests ran past 4.1 s"
    assert result.busy_share is not None
    assert result.busy_share > grading.IDLE_SHARE


def test_retry_limit_comes_from_the_reference_time():
    assert grading.retry_limit(replace(TASK, timeout_s=120, reference_s=None)) == 120
    assert grading.retry_limit(replace(TASK, timeout_s=120, reference_s=20)) == 120
    assert grading.retry_limit(replace(TASK, timeout_s=60, reference_s=40)) == 3 * 40 + grading.RETRY_MARGIN_S


def test_a_hanging_patch_holds_up_no_other_grading(backend):
    # Its retry takes one slot like any grading: a grading that arrives meanwhile runs beside it, not after it.
    # The limit leaves the test process time to reach the spin: a timeout whose second half is spent starting
    # pytest on a loaded host may read as asleep, and a run that slept is not retried.
    hanging = replace(TASK, timeout_s=6, reference_s=1.0)
    spin = _edit(TASK, "durations/format.py", "    remaining = int(seconds)\n", "    while True:\n        pass\n")
    starts, finished = [], []
    retried = asyncio.Event()

    async def create(spec):
        starts.append(spec)
        if len(starts) == 2:  # the hanging patch's retry is starting
            retried.set()
        return await backend.create(spec)

    async def scenario():
        grader = Grader(create, concurrency=2)

        async def run(name, task, patch):
            result = await grader.grade(task, patch)
            finished.append(name)
            return result

        hang = asyncio.create_task(run("hang", hanging, TASK.gold_patch + spin))
        retry = asyncio.create_task(retried.wait())
        await asyncio.wait({hang, retry}, return_when=asyncio.FIRST_COMPLETED)
        if not retried.is_set():  # the hanging grading ended without a retry: say how, rather than wait forever
            retry.cancel()
            pytest.fail(f"the hanging patch's grading was not retried: {await hang}")
        gold = await run("gold", TASK, TASK.gold_patch)
        return await hang, gold

    hang, gold = asyncio.run(scenario())
    assert (hang.status, hang.attempts, gold.resolved) == ("timeout", 2, True)
    assert finished == ["gold", "hang"]


def test_concurrency_is_sized_to_the_machine(monkeypatch):
    monkeypatch.setattr(grading.os, "cpu_count", lambda: 16)
    assert grading.default_concurrency(SandboxSpec(cpus=1.0)) == 16
    assert grading.default_concurrency(SandboxSpec(cpus=4.0)) == 4
    monkeypatch.setattr(grading.os, "cpu_count", lambda: 2)
    assert grading.default_concurrency(SandboxSpec(cpus=4.0)) == 1
    with pytest.raises(ValueError, match="at least 1"):
        Grader(ProcessBackend(), concurrency=-1)


def _wide_task(n_tests):
    """A task whose hidden test file has ``n_tests`` parametrised tests with long ids (a -rA summary ≫ 64 KiB)."""
    ids = [f"case-{i:05d}-" + "x" * 60 for i in range(n_tests)]
    hidden = (
        "import pytest\nfrom pkg import double\n\n\n"
        f"@pytest.mark.parametrize('name', {ids!r})\ndef test_many(name):\n    assert double(2) == 4\n\n\n"
        "def test_fixed():\n    assert double(3) == 6\n"
    )
    return SWETask(
        id="wide",
        repo={"pkg/__init__.py": "def double(x):\n    return x * 2 if x != 3 else 5\n"},
        problem_statement="double(3) is 5",
        fail_to_pass=("tests/test_many.py::test_fixed",),
        pass_to_pass=tuple(f"tests/test_many.py::test_many[{name}]" for name in ids),
        hidden_tests={"tests/test_many.py": hidden},
        gold_patch=_diff("pkg/__init__.py", "    return x * 2 if x != 3 else 5\n", "    return x * 2\n"),
    )


def _diff(path, old, new):
    lines = difflib.unified_diff([old], [new], f"a/{path}", f"b/{path}", lineterm="\n", n=0)
    body = "".join(lines).replace("@@ -1 +1 @@", "@@ -2 +2 @@")
    return f"diff --git a/{path} b/{path}\n{body}"


def test_a_summary_far_over_64_kib_is_graded_whole(backend):
    task = _wide_task(1500)
    gold = asyncio.run(grade(task, task.gold_patch, backend))
    assert gold.resolved, gold.error
    assert gold.tests_run == 1501
    assert sum(status == "PASSED" for status in gold.tests.values()) == 1501
    base = asyncio.run(grade(task, "", backend))
    assert (base.status, base.tests[task.fail_to_pass[0]]) == ("unresolved", "FAILED")
    assert all(base.pass_to_pass.values())


def test_a_flood_of_output_is_capped_and_reported_without_changing_the_verdict(backend):
    flood = "import os\n\n\ndef test_flood():\n    for _ in range(300):\n        os.write(1, b'y' * 65536)\n"
    task = replace(
        TASK,
        hidden_tests={**TASK.hidden_tests, "tests/test_flood.py": flood},
        pass_to_pass=(*TASK.pass_to_pass, "tests/test_flood.py::test_flood"),
        test_command="python3 -m pytest -q -rA -s -p no:cacheprovider",  # -s: the 19 MiB reach the log
    )
    result = asyncio.run(Grader(backend, log_cap=1 << 20).grade(task, TASK.gold_patch))
    assert result.resolved, result.error
    assert result.log_truncated
    assert " passed in " in result.log  # the log's tail (the final tally) is kept past the cap


def test_a_task_config_at_the_base_commit_is_the_one_pytest_reads(backend):
    # The task's own pytest.ini (strict markers) is used; the patch's edit of it is discarded.
    ini = "[pytest]\nmarkers =\n    slowish: a marker the hidden tests use\naddopts = --strict-markers\n"
    marked = "import pytest\n\n\n@pytest.mark.slowish\ndef test_marked():\n    pass\n"
    task = replace(
        TASK,
        repo=None,
        hidden_tests={**TASK.hidden_tests, "tests/test_marked.py": marked},
        pass_to_pass=(*TASK.pass_to_pass, "tests/test_marked.py::test_marked"),
    )
    files = {**{p: c.decode() for p, c in repo_files(TASK).items()}, "pytest.ini": ini}
    task = replace(task, repo=files)
    loosen = _diff("pytest.ini", "addopts = --strict-markers\n", "addopts = -p no:python\n").replace(
        "@@ -2 +2 @@", "@@ -4 +4 @@"
    )
    result = asyncio.run(grade(task, TASK.gold_patch + loosen, backend))
    assert result.resolved, result.error
    assert result.tests["tests/test_marked.py::test_marked"] == "PASSED"
    strict = replace(
        task, hidden_tests={**task.hidden_tests, "tests/test_marked.py": marked.replace("slowish", "nope")}
    )
    result = asyncio.run(grade(strict, TASK.gold_patch, backend))
    assert not result.resolved  # --strict-markers from the task's config: an unknown marker errors


@pytest.mark.docker
def test_in_docker_a_wide_summary_grades_whole_and_a_hang_times_out_twice():
    from skyrl_agent.tasks.validate import make_backend

    wide = _wide_task(1200)
    hang = _edit(TASK, "durations/format.py", "    remaining = int(seconds)\n", "    while True:\n        pass\n")
    hanging = replace(TASK, timeout_s=4)  # the spin, not pytest's start-up, fills the second half on a loaded host
    backend = make_backend("docker")

    async def scenario():
        try:
            return await asyncio.gather(
                grade(wide, wide.gold_patch, backend), grade(hanging, TASK.gold_patch + hang, backend)
            )
        finally:
            await backend.close()

    gold, hung = asyncio.run(scenario())
    assert gold.resolved, gold.error
    assert gold.tests_run == 1201
    assert (hung.resolved, hung.status, hung.attempts) == (False, "timeout", 2)


def test_a_report_rewritten_behind_the_test_runs_back_is_tampered_even_when_it_does_not_parse():
    # A daemon left by the code under test can truncate and rewrite the report as the supervisor writes it.
    run = grading._Run(TASK, sandbox=None, limit=10.0, log_cap=1024)
    summary = {"report_sha256": "0" * 64, "exit_code": 0, "timed_out": False, "forged": 0}
    result = run._verdict(summary, b'n": "call"}\n{"t": "finish", "exit": 0, "collected": 16, "tampered": []}\n', "")
    assert (result.resolved, result.status) == (False, "tampered")
    assert "changed after the test run wrote it" in result.error


class _ClosingSandbox:
    """A process sandbox whose ``close`` first waits ``delay_s``, then closes it, then raises ``error`` if given."""

    def __init__(self, inner, *, delay_s=0.0, error=None):
        self.inner, self.id, self.delay_s, self.error = inner, inner.id, delay_s, error
        self.closing, self.closed = asyncio.Event(), False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def close(self):
        self.closing.set()
        await asyncio.sleep(self.delay_s)
        await self.inner.close()
        self.closed = True
        if self.error is not None:
            raise self.error


def _factory(made, **kwargs):
    async def create(spec):
        sandbox = _ClosingSandbox(await ProcessBackend().create(spec), **kwargs)
        made.append(sandbox)
        return sandbox

    return create


def test_a_close_failure_after_the_verdict_keeps_the_verdict(caplog):
    from skyrl_agent.sandbox.base import SandboxError

    made = []
    error = SandboxError("container c0ffee could not be removed; run `skyrl-agent reap`")
    with caplog.at_level("WARNING", logger=grading.__name__):
        result = asyncio.run(Grader(_factory(made, error=error)).grade(TASK, TASK.gold_patch))
    assert (result.resolved, result.status) == (True, "resolved"), result.error
    assert made[0].closed
    assert any("could not be removed" in record.getMessage() for record in caplog.records)


def test_the_grading_sandbox_is_closed_to_the_end_when_grading_is_cancelled():
    made = []
    grader = Grader(_factory(made, delay_s=0.3))

    async def scenario():
        grading_task = asyncio.create_task(grader.grade(TASK, TASK.gold_patch))
        while not made:
            await asyncio.sleep(0.01)
        await made[0].closing.wait()
        grading_task.cancel()  # while the sandbox is being closed
        with pytest.raises(asyncio.CancelledError):
            await grading_task
        return made[0].closed

    assert asyncio.run(scenario())


@pytest.mark.docker
def test_in_docker_a_patch_whose_code_kills_the_grading_sandbox_is_unresolved_not_an_error():
    # Masking this as an infrastructure failure would let a policy escape a bad reward by ending the grading.
    from skyrl_agent.tasks.validate import make_backend

    killer = _edit(
        TASK, "durations/format.py", "    remaining = int(seconds)\n",
        "    import os, signal\n    os.kill(-1, signal.SIGKILL)\n    remaining = int(seconds)\n",
    )  # fmt: skip
    backend = make_backend("docker")

    async def scenario():
        try:
            return await grade(TASK, TASK.gold_patch + killer, backend)
        finally:
            await backend.close()

    result = asyncio.run(scenario())
    assert (result.resolved, result.status) == (False, "broke_sandbox"), result.error
    assert "ended the grading sandbox" in (result.error or "")
