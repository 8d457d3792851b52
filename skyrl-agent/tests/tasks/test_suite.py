import asyncio

import pytest

from skyrl_agent.tasks import load_suite, validate_tasks
from skyrl_agent.tasks.validate import format_table, make_backend


def test_whole_suite_is_valid(backend):
    reports = asyncio.run(validate_tasks(load_suite(), backend, concurrency=8))
    assert all(report.ok for report in reports), format_table(reports)


def test_static_checks_catch_a_broken_task(backend):
    from dataclasses import replace

    task = load_suite()[0]
    broken = replace(task, gold_patch="not a diff", fail_to_pass=(*task.fail_to_pass, "tests/nope.py::t"))
    report, _ = asyncio.run(validate_tasks([broken, broken], backend))
    text = "; ".join(report.problems)
    assert "not a unified diff" in text
    assert "tests/nope.py" in text
    assert "not unique" in text


def test_useless_hidden_test_is_reported(backend):
    from dataclasses import replace

    task = load_suite()[0]
    (report,) = asyncio.run(
        validate_tasks([replace(task, fail_to_pass=task.pass_to_pass[:1], pass_to_pass=())], backend)
    )
    assert any("pass without a fix" in problem for problem in report.problems)


def test_cli_process_backend(capsys):
    from skyrl_agent.cli import main

    assert main(["tasks", "validate", "--backend", "process", "--jobs", "8"]) == 0
    assert "tasks valid" in capsys.readouterr().out


@pytest.mark.docker
@pytest.mark.slow
def test_a_few_tasks_in_docker():
    tasks = [task for task in load_suite() if task.id.endswith(("bool-case", "to-utc-offset", "list-at-end"))]
    reports = asyncio.run(validate_tasks(tasks, make_backend("docker")))
    assert all(report.ok for report in reports), format_table(reports)


def test_cli_record_writes_reference_times(tmp_path, capsys):
    from skyrl_agent.cli import main
    from skyrl_agent.tasks import load_tasks, save_tasks

    path = tmp_path / "tasks.jsonl"
    save_tasks([task for task in load_suite() if task.id == "durations-format-exact-hour"], path)
    assert load_tasks(path)[0].reference_s is None
    assert main(["tasks", "validate", "--tasks", str(path), "--backend", "process", "--record"]) == 0
    assert "recorded the gold test-run times of 1 valid tasks" in capsys.readouterr().out
    (task,) = load_tasks(path)
    assert task.reference_s is not None
    assert task.reference_s > 0
