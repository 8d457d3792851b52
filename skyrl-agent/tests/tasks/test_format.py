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


def _row(**overrides):
    row = {
        "id": "t-1",
        "repo": {"pkg/a.py": "x = 1\n"},
        "problem_statement": "bug",
        "FAIL_TO_PASS": ["tests/t.py::a"],
        "hidden_tests": {"tests/t.py": "def test_a(): pass\n"},
    }
    row.update(overrides)
    return row


def _load_line(tmp_path, row):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n" + json.dumps(row) + "\n")
    return lambda: load_tasks(path)


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "0", "-5", "true", '"60"'])
def test_timeout_must_be_finite_and_positive(tmp_path, value):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(_row()).replace('"id"', f'"timeout_s": {value}, "id"', 1) + "\n")
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl:1 .*'timeout_s' must be a finite positive number"):
        load_tasks(path)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hidden_tests", {"../outside.py": "x"}),
        ("hidden_tests", {"/etc/passwd": "x"}),
        ("hidden_tests", {".git/hooks/pre-commit": "x"}),
        ("repo", {"../../escape.py": "x"}),
        ("repo", "/etc"),
        ("repo", "../elsewhere"),
        ("test_files", ["../x.py"]),
        ("FAIL_TO_PASS", ["../tests/t.py::a"]),
    ],
)
def test_paths_must_stay_inside_the_repository(tmp_path, field, value):
    load = _load_line(tmp_path, _row(**{field: value}))
    with pytest.raises(TaskFormatError, match=rf"tasks\.jsonl:2 .*field '{field}'.*relative path inside"):
        load()


def test_symlink_out_of_the_repo_directory_is_refused(tmp_path):
    (tmp_path / "repo" / "pkg").mkdir(parents=True)
    (tmp_path / "repo" / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "secret").write_text("host secret\n")
    (tmp_path / "repo" / "pkg" / "leak.py").symlink_to(tmp_path / "secret")
    load = _load_line(tmp_path, _row(repo="repo"))
    with pytest.raises(TaskFormatError, match=r"tasks\.jsonl:2 .*field 'repo'.*leak\.py is a symbolic link"):
        load()
    # Built in code, bypassing the loader: reading its files still refuses, so nothing reaches a sandbox.
    with pytest.raises(TaskFormatError, match="symbolic link"):
        repo_files(_task(repo=tmp_path / "repo"))


def test_symlink_inside_the_repo_directory_is_copied_as_a_file(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.py").write_text("x = 1\n")
    (tmp_path / "repo" / "b.py").symlink_to("a.py")
    assert repo_files(_task(repo=tmp_path / "repo")) == {"a.py": b"x = 1\n", "b.py": b"x = 1\n"}


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("make test", "is not 'PYTHON -m pytest"),
        ("python3 -m pytest -c other.ini", "-c is set by the grader"),
        ("python3 -m pytest --rootdir=/", "--rootdir is set by the grader"),
        ("python3 -m pytest -p", "-p needs a plugin module name"),
    ],
)
def test_test_command_must_be_a_plain_pytest_run(tmp_path, command, message):
    load = _load_line(tmp_path, _row(test_command=command))
    with pytest.raises(TaskFormatError, match=rf"tasks\.jsonl:2 .*'test_command'.*{message}"):
        load()


def test_test_command_plugins_are_declared():
    from skyrl_agent.tasks.format import parse_test_command

    command = parse_test_command("/opt/py/bin/python -m pytest -q -p xdist -pno:cacheprovider -p no:warnings -rA")
    assert command.python == "/opt/py/bin/python"
    assert command.plugins == ("xdist",)
    assert command.args == ("-q", "-p", "no:cacheprovider", "-p", "no:warnings", "-rA")
    assert parse_test_command("pytest -x").python == "python3"
