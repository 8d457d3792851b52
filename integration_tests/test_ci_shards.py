"""CI's two test shards (scripts/run-tests.sh) cover every test file of the configured test paths exactly once."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run-tests.sh"
# What a test that starts Docker sandboxes says: a backend made for Docker, or the reaper cleaning up after a run.
DOCKER_SANDBOXES = re.compile(r"DockerBackend\(|make_backend\(.docker.\)|--backend.{1,4}docker|reaper\.reap\(")


def _shard(name: str) -> list[str]:
    """The paths of ``NAME_SHARD=(...)`` in the script."""
    match = re.search(rf"^{name}_SHARD=\(([^)]*)\)", SCRIPT.read_text(), flags=re.MULTILINE)
    assert match, f"{name}_SHARD is not defined in {SCRIPT}"
    return match.group(1).split()


def _test_files(paths: list[str]) -> set[Path]:
    found: set[Path] = set()
    for path in map(ROOT.joinpath, paths):
        found |= {path} if path.is_file() else set(path.rglob("test_*.py"))
    return found


def test_the_shards_cover_every_test_file_exactly_once() -> None:
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    agent, train_paths = _test_files(_shard("AGENT")), _shard("TRAIN")
    ignored = {ROOT / path for path in _shard("AGENT") if not path.startswith(("skyrl-gym/", "skyrl-agent/"))}
    train = _test_files(train_paths) - ignored
    every = _test_files(testpaths)
    assert agent | train == every, f"in no shard: {sorted(map(str, every - agent - train))}"
    assert not agent & train, f"in both shards: {sorted(map(str, agent & train))}"
    assert {ROOT / path for path in _shard("AGENT")} - agent <= {
        ROOT / p for p in _shard("AGENT") if (ROOT / p).is_dir()
    }, "a shard names a test file that does not exist"


def test_every_test_that_starts_docker_sandboxes_outside_the_agent_packages_is_in_the_agent_shard() -> None:
    # A run's start-up reaper removes sandboxes without a live lease; the agent shard's tests make some on purpose.
    agent = _test_files(_shard("AGENT"))
    outside = [ROOT / "integration_tests", ROOT / "skyrl-train" / "tests"]
    users = {path for root in outside for path in root.rglob("test_*.py") if DOCKER_SANDBOXES.search(path.read_text())}
    assert users <= agent, f"Docker sandbox tests outside the agent shard: {sorted(map(str, users - agent))}"
