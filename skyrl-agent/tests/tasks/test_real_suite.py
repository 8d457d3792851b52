import asyncio
import datetime
import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from skyrl_agent.tasks import load_tasks, validate_tasks
from skyrl_agent.tasks.grading import GradeResult
from skyrl_agent.tasks.real import Edit, RecipeError, build, load_recipe, recipe_from_dict
from skyrl_agent.tasks.real.build import (
    SdistHashError,
    UnsafeArchiveError,
    apply_edits,
    build_suite,
    check_fail_to_pass,
    check_gradings,
    classify,
    fetch_sdist,
    safe_extract,
    unified_patch,
)
from skyrl_agent.tasks.validate import format_table, make_backend

REPO_ROOT = Path(__file__).resolve().parents[3]
SDIST_CACHE = REPO_ROOT / ".cache" / "sdists"  # shared by every run, so a rerun downloads nothing

# --- a tiny package, packed as an sdist, for builds that need no network ---------------------------------------

MINI_SOURCE = '''\
def clamp(value, low, high):
    """Limit value to [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
'''
MINI_TESTS = """\
import pytest

from mini import clamp


@pytest.mark.parametrize("value", range(5, 10))
def test_inside(value):
    assert clamp(value, 0, 10) == value


def test_above():
    assert clamp(11, 0, 10) == 10


def test_below():
    assert clamp(-1, 0, 10) == 0
"""


def _tar(path: Path, members: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mini_recipe(cache: Path, *, fail_to_pass=("tests/test_mini.py::test_above",)) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    members = {
        "mini-1.0/mini/__init__.py": MINI_SOURCE.encode(),
        "mini-1.0/tests/test_mini.py": MINI_TESTS.encode(),
        "mini-1.0/README": b"mini\n",
    }
    sha = _tar(cache / "mini-1.0.tar.gz", members)
    return {
        "packages": {
            "mini": {
                "version": "1.0",
                "sha256": sha,
                "files": {"mini": "mini", "tests/test_mini.py": "tests/test_mini.py", "README": "README"},
                "hidden_tests": ["tests/test_mini.py"],
                "timeout_s": 60,
            }
        },
        "tasks": [
            {
                "id": "mini-clamp-high",
                "package": "mini",
                "bug": [{"path": "mini/__init__.py", "old": "value > high", "new": "value > high + 1"}],
                "problem_statement": "clamp(11, 0, 10) returns 11\n",
                "FAIL_TO_PASS": list(fail_to_pass),
            }
        ],
    }


# --- the shipped recipe -----------------------------------------------------------------------------------------


def test_shipped_recipe_is_well_formed():
    recipe = load_recipe()
    assert len(recipe.tasks) >= 10
    assert len({task.package for task in recipe.tasks}) >= 3
    for task in recipe.tasks:
        package = recipe.packages[task.package]
        assert task.problem_statement.strip()
        assert all(path in package.hidden_tests for path in recipe.test_files(task))
        assert not any(edit.path in package.hidden_tests for edit in task.bug)
    for package in recipe.packages.values():
        assert len(package.sdist.sha256) == 64
        assert all(len(dep.sha256) == 64 for dep in package.test_deps)


def test_problem_statements_do_not_quote_the_fix():
    for task in load_recipe().tasks:
        for edit in task.bug:
            changed = [line.strip() for line in edit.old.splitlines() if line.strip() not in edit.new]
            assert not any(line and line in task.problem_statement for line in changed), task.id


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r["tasks"].append(dict(r["tasks"][0])), "used twice"),
        (lambda r: r["tasks"][0].update(package="nope"), "unknown package"),
        (lambda r: r["tasks"][0].update(FAIL_TO_PASS=["tests/other.py::t"]), "outside its test files"),
        (lambda r: r["tasks"][0].update(bug=[]), "'bug'"),
        (lambda r: r["tasks"][0]["bug"][0].update(new=r["tasks"][0]["bug"][0]["old"]), "differs from 'old'"),
        (lambda r: r["packages"]["mini"].update(sha256="abc"), "sha256"),
        (lambda r: r["packages"]["mini"].update(hidden_tests=[]), "hidden_tests"),
    ],
)
def test_malformed_recipe_is_refused(tmp_path, mutate, message):
    raw = _mini_recipe(tmp_path)
    mutate(raw)
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict(raw)


# --- bugs and patches -------------------------------------------------------------------------------------------


def test_edit_must_occur_exactly_once():
    files = {"pkg/a.py": "x = 1\ny = 1\n"}
    assert apply_edits(files, [Edit("pkg/a.py", "x = 1", "x = 2")], task_id="t") == {"pkg/a.py": "x = 2\ny = 1\n"}
    with pytest.raises(RecipeError, match=r"task 't'.*pkg/a.py.*occurs 2 times"):
        apply_edits(files, [Edit("pkg/a.py", "= 1", "= 2")], task_id="t")
    with pytest.raises(RecipeError, match="occurs 0 times"):
        apply_edits(files, [Edit("pkg/a.py", "z = 1", "z = 2")], task_id="t")
    with pytest.raises(RecipeError, match="not in the repository"):
        apply_edits(files, [Edit("pkg/b.py", "x", "y")], task_id="t")


def test_edits_apply_in_order_on_the_same_file():
    edits = [Edit("a.py", "x = 1", "x = 2"), Edit("a.py", "x = 2\ny", "x = 3\ny")]
    assert apply_edits({"a.py": "x = 1\ny = 1\n"}, edits, task_id="t") == {"a.py": "x = 3\ny = 1\n"}


def test_gold_patch_applies_with_git(tmp_path):
    buggy = {"pkg/a.py": "a\nb\nc\n", "pkg/b.py": "no newline at end"}
    fixed = {"pkg/a.py": "a\nB\nc\n", "pkg/b.py": "no newline at the end"}
    for path, text in buggy.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    patch = unified_patch(buggy, fixed)
    assert patch.startswith("diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ ")
    assert "\\ No newline at end of file" in patch
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=patch, text=True, check=True)
    assert {path: (tmp_path / path).read_text() for path in fixed} == fixed


def test_unchanged_files_make_no_hunks():
    assert unified_patch({"a.py": "x\n"}, {"a.py": "x\n"}) == ""


# --- sdists -----------------------------------------------------------------------------------------------------


def test_hash_mismatch_of_a_download_is_a_clear_error(tmp_path, monkeypatch):
    recipe = recipe_from_dict(_mini_recipe(tmp_path / "seed"))
    sdist = recipe.packages["mini"].sdist

    def fake_download(requirement, dest):
        path = dest / "mini-1.0.tar.gz"
        path.write_bytes(b"something else")
        return path

    monkeypatch.setattr(build, "pip_download", fake_download)
    with pytest.raises(SdistHashError, match=r"mini==1\.0: .* has sha256 [0-9a-f]{64}, but the recipe pins"):
        fetch_sdist(sdist, tmp_path / "cache")
    assert not (tmp_path / "cache" / "mini-1.0.tar.gz").exists()


def test_a_cached_sdist_with_the_pinned_hash_is_not_downloaded(tmp_path, monkeypatch):
    recipe = recipe_from_dict(_mini_recipe(tmp_path))
    monkeypatch.setattr(build, "pip_download", lambda *args: pytest.fail("downloaded although cached"))
    assert fetch_sdist(recipe.packages["mini"].sdist, tmp_path) == tmp_path / "mini-1.0.tar.gz"


def test_a_corrupt_cached_sdist_is_downloaded_again(tmp_path, monkeypatch):
    seed = tmp_path / "seed"
    recipe = recipe_from_dict(_mini_recipe(seed))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "mini-1.0.tar.gz").write_bytes(b"truncated")

    def fake_download(requirement, dest):
        return Path(shutil.copy(seed / "mini-1.0.tar.gz", dest))

    monkeypatch.setattr(build, "pip_download", fake_download)
    path = fetch_sdist(recipe.packages["mini"].sdist, cache)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recipe.packages["mini"].sdist.sha256


@pytest.mark.parametrize("name", ["pkg-1.0/../../evil.txt", "/tmp/evil.txt", "../evil.txt"])
def test_extraction_refuses_members_outside_the_target(tmp_path, name):
    archive = tmp_path / "bad.tar.gz"
    _tar(archive, {"pkg-1.0/ok.py": b"x = 1\n", name: b"pwned\n"})
    target = tmp_path / "out" / "x"
    with pytest.raises(UnsafeArchiveError, match="outside"):
        safe_extract(archive, target)
    written = [path for path in (tmp_path / "out").rglob("*") if not path.is_dir()]
    assert not written  # refused as a whole, before anything is written
    assert not (tmp_path / "evil.txt").exists()


def test_extraction_refuses_a_link_leading_out(tmp_path):
    archive = tmp_path / "link.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("pkg-1.0/escape")
        info.type, info.linkname = tarfile.SYMTYPE, "../../etc/passwd"
        tar.addfile(info)
    with pytest.raises(UnsafeArchiveError):
        safe_extract(archive, tmp_path / "out")


def test_extraction_returns_the_top_directory(tmp_path):
    archive = tmp_path / "ok.tar.gz"
    _tar(archive, {"pkg-1.0/a.py": b"x = 1\n", "pkg-1.0/sub/b.py": b"y = 2\n"})
    top = safe_extract(archive, tmp_path / "out")
    assert top == tmp_path / "out" / "pkg-1.0"
    assert (top / "sub" / "b.py").read_text() == "y = 2\n"


# --- measuring the tests ----------------------------------------------------------------------------------------


def test_classify_and_the_fail_to_pass_check():
    base = {"t::a": "FAILED", "t::b": "PASSED", "t::c": "PASSED", "t::s": "SKIPPED"}
    gold = {"t::a": "PASSED", "t::b": "PASSED", "t::c": "PASSED", "t::s": "SKIPPED", "t::new": "PASSED"}
    measured = classify(base, gold)
    assert measured.fail_to_pass == ("t::a", "t::new")  # missing on the bug counts as not passing
    assert measured.pass_to_pass == ("t::b", "t::c")
    check_fail_to_pass("task-x", ["t::a", "t::new"], measured)
    with pytest.raises(RecipeError, match=r"task 'task-x'.*listed but not.*t::b.*not listed: t::new"):
        check_fail_to_pass("task-x", ["t::a", "t::b"], measured)


def test_a_bug_that_breaks_what_the_fix_does_not_repair_is_refused():
    base = GradeResult("t", False, "unresolved", tests={"x::a": "PASSED", "x::b": "FAILED"})
    gold = GradeResult("t", True, "resolved", tests={"x::a": "FAILED", "x::b": "PASSED"})
    with pytest.raises(build.BuildError, match="pass on the bug but not with the gold patch: x::a"):
        check_gradings("t", base, gold)
    with pytest.raises(build.BuildError, match="gold grading ended in error"):
        check_gradings("t", base, GradeResult("t", False, "error", error="no test run report"))


def test_a_bug_in_a_test_file_is_refused(tmp_path, backend):
    raw = _mini_recipe(tmp_path)
    raw["tasks"][0]["bug"] = [{"path": "tests/test_mini.py", "old": "== 10", "new": "== 11"}]
    with pytest.raises(RecipeError, match="must be in the package source"):
        build_suite(tmp_path / "out", cache_dir=tmp_path, backend=backend, recipe=recipe_from_dict(raw))


# --- a whole build, without network (the process backend runs the tests) ----------------------------------------


def test_build_measures_pass_to_pass_and_is_idempotent(tmp_path, backend):
    recipe = recipe_from_dict(_mini_recipe(tmp_path / "cache"))
    out = tmp_path / "out"
    path = build_suite(out, cache_dir=tmp_path / "cache", backend=backend, recipe=recipe)
    (task,) = load_tasks(path)
    assert task.fail_to_pass == ("tests/test_mini.py::test_above",)
    assert set(task.pass_to_pass) == {"tests/test_mini.py::test_below"} | {
        f"tests/test_mini.py::test_inside[{value}]" for value in range(5, 10)
    }
    assert not (out / "repos" / task.id / "tests" / "test_mini.py").exists()  # hidden from the agent
    assert "value > high + 1" in (out / "repos" / task.id / "mini" / "__init__.py").read_text()
    assert task.hidden_tests == {"tests/test_mini.py": MINI_TESTS}
    assert task.metadata["tests"] == 7
    assert task.metadata["version"] == "1.0"
    (report,) = asyncio.run(validate_tasks([task], backend))
    assert report.ok, format_table([report])

    first = path.read_bytes()
    build_suite(out, cache_dir=tmp_path / "cache", backend=backend, recipe=recipe)
    assert path.read_bytes() == first


def test_build_refuses_a_wrong_fail_to_pass(tmp_path, backend):
    raw = _mini_recipe(tmp_path, fail_to_pass=["tests/test_mini.py::test_below"])
    with pytest.raises(RecipeError, match=r"mini-clamp-high.*not listed: tests/test_mini.py::test_above"):
        build_suite(tmp_path / "out", cache_dir=tmp_path, backend=backend, recipe=recipe_from_dict(raw))


def test_cli_rejects_an_unknown_package(capsys, tmp_path):
    from skyrl_agent.cli import main

    assert main(["tasks", "build-real", "--out", str(tmp_path), "--packages", "nope"]) == 2
    assert "unknown package" in capsys.readouterr().err


# --- the real suite, in Docker (downloads from PyPI once into .cache/sdists) ------------------------------------


@pytest.fixture(scope="module")
def real_suite(tmp_path_factory):
    return load_tasks(build_suite(tmp_path_factory.mktemp("real-suite"), cache_dir=SDIST_CACHE))


@pytest.mark.docker
@pytest.mark.slow
def test_real_suite_validates_in_docker(real_suite):
    largest = max(real_suite, key=lambda task: task.metadata["tests"])
    others = [task for task in real_suite if task is not largest]
    day = datetime.date.today().toordinal()
    chosen = [largest, *(others[(day + i) % len(others)] for i in range(2))]
    reports = asyncio.run(validate_tasks(chosen, make_backend("docker"), concurrency=1))
    assert all(report.ok for report in reports), format_table(reports)
    assert reports[0].base is not None
    assert reports[0].base.tests_run > 1000
    assert len(reports[0].base.tests) > 1000


@pytest.mark.docker
@pytest.mark.slow
def test_real_suite_shape(real_suite):
    assert len(real_suite) >= 10
    assert len({task.metadata["package"] for task in real_suite}) >= 3
    assert max(task.metadata["tests"] for task in real_suite) > 1000
    for task in real_suite:
        assert task.metadata["fail_to_pass"] == len(task.fail_to_pass)
        assert isinstance(task.repo, Path)
        assert not any((task.repo / path).exists() for path in task.hidden_tests)
