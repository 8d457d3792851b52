"""CI's test shards: ``scripts/run-tests.sh`` runs the shards of ``scripts/test-shards.txt`` so that every test file
of the configured test paths runs exactly once, and every test that starts Docker sandboxes runs in the docker shard.

The script runs here with a stand-in Python that records each pytest command line instead of running it, so these
tests check the commands CI runs, not a second reading of the shard file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a test that starts Docker sandboxes says: the docker marker, a backend made for Docker, or the reaper
# cleaning up after a run.
DOCKER_SANDBOXES = re.compile(
    r"mark\.docker|DockerBackend\(|make_backend\(.docker.\)|--backend.{1,4}docker|reaper\.reap\("
)
# Records its pytest arguments next to the JUnit report it is asked for and writes a one-test report; exits with
# 0 for the shards named in FAKE_RAN (every shard when unset) and 5 ("no tests collected") for the others.
FAKE_PYTHON = f"""#!{sys.executable}
import os, sys
from pathlib import Path
if sys.argv[1:3] != ["-m", "pytest"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
report = Path(next(a for a in sys.argv if a.startswith("--junitxml=")).split("=", 1)[1])
report.with_suffix(".args").write_text("\\n".join(sys.argv[3:]))
report.write_text('<testsuite><testcase classname="fake" name="%s" time="1"/></testsuite>' % report.stem)
ran = os.environ.get("FAKE_RAN")
sys.exit(0 if ran is None or report.stem.removeprefix("junit-") in ran.split() else 5)
"""


def _run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``run-tests.sh`` in ``tmp_path`` (its ``scripts/`` linked to the repository's) with the stand-in Python."""
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("SKYRL_TEST_", "FAKE_"))}
    command = ["bash", "scripts/run-tests.sh", str(python), "-q"]
    return subprocess.run(command, cwd=tmp_path, env=environ | env, capture_output=True, text=True, timeout=120)


def _test_files(path: Path) -> set[Path]:
    return {path} if path.is_file() else set(path.rglob("test_*.py"))


def _shard_files(arguments: list[str]) -> set[Path]:
    """The test files one pytest command line collects: its paths less its ``--ignore`` paths."""
    paths = [ROOT / arg for arg in arguments if not arg.startswith("-")]
    ignored = [ROOT / arg.removeprefix("--ignore=") for arg in arguments if arg.startswith("--ignore=")]
    assert all(path.exists() for path in paths + ignored), f"a shard names a path that does not exist: {arguments}"
    # pytest's answer to a path both given and ignored depends on the order of the arguments: name a path once.
    assert not set(paths) & set(ignored), f"a path named in two shards: {sorted(map(str, set(paths) & set(ignored)))}"
    return set().union(*map(_test_files, paths)) - set().union(set(), *map(_test_files, ignored))


def _starts_docker_sandboxes(path: Path) -> bool:
    """Whether the test file, or a conftest.py of its test directories, says it starts Docker sandboxes."""
    conftests = [parent / "conftest.py" for parent in path.parents if parent.is_relative_to(ROOT) and parent != ROOT]
    sources = [path, *(conftest for conftest in conftests if conftest.is_file())]
    return any(DOCKER_SANDBOXES.search(source.read_text()) for source in sources)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[Path]]:
    """Shard name -> the test files its pytest process collects, from the script's default run."""
    tmp_path = tmp_path_factory.mktemp("run-tests")
    result = _run_script(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = sorted((tmp_path / ".cache").glob("junit-*.args"))
    return {path.stem.removeprefix("junit-"): _shard_files(path.read_text().split("\n")) for path in recorded}


def test_the_default_run_is_three_shards_each_with_tests(shards: dict[str, set[Path]]) -> None:
    assert sorted(shards) == ["docker", "ray", "rest"]
    assert all(shards.values()), f"a shard with no test files: {[name for name, files in shards.items() if not files]}"


def test_the_shards_cover_every_test_file_exactly_once(shards: dict[str, set[Path]]) -> None:
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    every = set().union(*(_test_files(ROOT / path) for path in testpaths))
    covered = set().union(*shards.values())
    assert covered == every, f"in no shard: {sorted(map(str, every - covered))}"
    twice = {path for path in every if sum(path in files for files in shards.values()) > 1}
    assert not twice, f"in more than one shard: {sorted(map(str, twice))}"


def test_every_test_that_starts_docker_sandboxes_is_in_the_docker_shard(shards: dict[str, set[Path]]) -> None:
    # A run's start-up reaper removes sandboxes without a live lease; some Docker tests make such sandboxes on purpose.
    users = {path for files in shards.values() for path in files if _starts_docker_sandboxes(path)}
    assert users, "no test file was recognised as starting Docker sandboxes; the pattern has gone stale"
    outside = sorted(map(str, users - shards["docker"]))
    assert not outside, f"Docker sandbox tests outside the docker shard: {outside}"


@pytest.mark.parametrize(("ran", "expected"), [("ray", 0), ("", 5)])
def test_exit_code_5_only_when_no_shard_ran_a_test(tmp_path: Path, ran: str, expected: int) -> None:
    result = _run_script(tmp_path, FAKE_RAN=ran)
    assert result.returncode == expected, result.stdout + result.stderr
    assert "ten slowest tests across the shards" in result.stdout


def test_one_process_when_asked(tmp_path: Path) -> None:
    result = _run_script(tmp_path, SKYRL_TEST_SHARDS="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [path.name for path in (tmp_path / ".cache").glob("*.args")] == ["junit.args"]
