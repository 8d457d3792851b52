import json
from pathlib import Path

import pytest

from skyrl_agent.tasks import SWETask, TaskFormatError, load_suite, load_swebench, load_tasks, save_tasks
from skyrl_agent.tasks.format import repo_files


def _task(**overrides):
    fields = {
        "id": "t-1",
        "repo": {"pkg/a.py": "x = 1\n"},
        "problem_statement": "bug",
        "fail_to_pass": ("tests/t.py::a",),
        "hidden_tests": {"tests/t.py": "def test_a(): pass\n"},
    }
    fields.update(overrides)
    return SWETask(**fields)


def test_round_trip_jsonl_and_json(tmp_path):
    tasks = [_task(), _task(id="t-2", pass_to_pass=("tests/t.py::b",), metadata={"k": 1})]
    for name in ("tasks.jsonl", "tasks.json"):
        save_tasks(tasks, tmp_path / name)
        assert load_tasks(tmp_path / name) == tasks


def test_repo_directory_is_relative_to_the_file(tmp_path):
    (tmp_path / "code" / "pkg").mkdir(parents=True)
    (tmp_path / "code" / "pkg" / "m.py").write_text("y = 2\n")
    save_tasks([_task(repo=tmp_path / "code")], tmp_path / "t.jsonl")
    assert json.loads((tmp_path / "t.jsonl").read_text())["repo"] == "code"
    (loaded,) = load_tasks(tmp_path / "t.jsonl")
    assert repo_files(loaded) == {"pkg/m.py": b"y = 2\n"}


def test_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"id": "a", "repo": {}, "problem_statement": "p", "FAIL_TO_PASS": ["x"], "test_patch": "d"})
    path.write_text(good + "\n" + json.dumps({"id": "b", "problem_statement": "p", "FAIL_TO_PASS": "x"}) + "\n")
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:2 .*'b'.*FAIL_TO_PASS"):
        load_tasks(path)
    path.write_text("{not json\n")
    with pytest.raises(TaskFormatError, match=r"bad\.jsonl:1: invalid JSON"):
        load_tasks(path)
    with pytest.raises(TaskFormatError, match="cannot read"):
        load_tasks(tmp_path / "missing.jsonl")


def test_requires_hidden_tests():
    from skyrl_agent.tasks.format import task_from_dict

    with pytest.raises(TaskFormatError, match="test_patch"):
        task_from_dict({"id": "a", "problem_statement": "p", "FAIL_TO_PASS": ["x"]})


def test_swebench_rows(tmp_path):
    row = {
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "base_commit": "abc",
        "patch": "diff",
        "test_patch": "tdiff",
        "problem_statement": "issue",
        "FAIL_TO_PASS": json.dumps(["t::a"]),
        "PASS_TO_PASS": "[]",
        "version": "4.3",
    }
    (tmp_path / "sb.jsonl").write_text(json.dumps(row) + "\n")
    (task,) = load_swebench(tmp_path / "sb.jsonl")
    assert task.base_image == "sweb.eval.x86_64.astropy_1776_astropy-12907"
    assert (task.fail_to_pass, task.pass_to_pass, task.workdir, task.repo) == (("t::a",), (), "/testbed", None)
    assert task.metadata["repo"] == "astropy/astropy"
    (custom,) = load_swebench(tmp_path / "sb.jsonl", image_template="swebench/sweb.eval.x86_64.{id}:latest")
    assert custom.base_image.startswith("swebench/")


def test_shipped_suite_shape():
    tasks = load_suite()
    assert len(tasks) >= 20
    assert len({task.id for task in tasks}) == len(tasks)
    assert len({task.metadata["codebase"] for task in tasks}) >= 5
    for task in tasks:
        assert isinstance(task.repo, Path)
        assert "tests/" not in task.gold_patch
