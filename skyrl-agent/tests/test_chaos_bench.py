"""``benchmarks/chaos_bench.py --quick`` under injected faults: every episode ends exactly once, no container stays.

The run kills sandboxes from the host, hangs commands, fails daemon API calls, restarts the Docker daemon and
SIGKILLs the dispatcher's process once (see docs/agent/benchmarks.md). No time is asserted: the numbers belong in
the report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "chaos_bench.py"


def test_quick_chaos_run_loses_duplicates_and_leaks_nothing(tmp_path: Path) -> None:
    output = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert output.exists(), done.stderr[-4000:] + done.stdout[-4000:]
    report = json.loads(output.read_text())
    docker = report["docker"]
    assert report["lost"] == 0, docker["lost_ids"]
    assert report["duplicated"] == 0, docker["duplicated_ids"]
    assert report["containers_left"] == 0
    assert docker["killed_run_containers_after_reap"] == 0
    assert done.returncode == 0, done.stderr[-4000:]

    # Every episode has its one outcome, and the faults really happened.
    assert docker["with_one_outcome"] == docker["episodes"] == 50
    assert sum(docker["outcomes"].values()) == docker["episodes"]
    assert docker["torn_lines"] == 0
    assert docker["first_run"]["killed_at_outcomes"] is not None  # the first run was SIGKILLed
    assert docker["containers_after_kill"] > 0  # and left containers for the restart's reaper
    injected = docker["injected_second_run"]  # the first run's counts died with it
    assert injected["hang"] > 0
    assert injected["daemon_error"] > 0
    assert docker["retries"] > 0  # crashed sandboxes (and the daemon restart's) re-ran their episodes
    daemon = docker["daemon"]
    assert daemon["restarted"] or daemon["reason"]  # a daemon that could not be restarted is said so

    scale = report["scale"]
    assert [r["episodes"] for r in scale["rows"] if r["backend"] == "modelled"] == [100, 1000]
    for row in scale["rows"]:
        assert sum(row["outcomes"].values()) == row["episodes"]
        assert row["live_idle"] == row["episodes"]  # every episode was live at once
        assert row["cpu_s"] > 0
        assert row["traced_bytes_per_idle_episode"] > 0
    assert scale["rate_limiter"]["cpu_s"] >= 0
    assert {"episodes lost", "episodes duplicated", "containers left after the run"} <= {
        t["target"] for t in report["targets"]
    }
    for text in ("Part 1", "Part 2", "Targets", "load average"):
        assert text in done.stdout
