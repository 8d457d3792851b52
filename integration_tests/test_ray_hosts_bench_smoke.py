"""``benchmarks/ray_hosts_bench.py --parts scale`` runs end to end at a small size: two simulated hosts on a local
Ray cluster, one killed mid-run, both sides (bare loop and dispatcher), and a complete report.

No timing is asserted: benchmark numbers belong in the report, not in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "ray_hosts_bench.py"


@pytest.mark.ray
@pytest.mark.slow
def test_a_small_scale_run_loses_nothing_and_reports_both_sides(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install ray")
    output = tmp_path / "ray_hosts_bench.json"
    small = ["--episodes", "120", "--hosts", "2", "--concurrency", "16", "--max-per-host", "12"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--parts", "scale", *small, "--json", str(output)],
        cwd=SCRIPT.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    scale = json.loads(output.read_text())["scale"]
    assert [side["side"] for side in scale["sides"]] == ["bare", "dispatcher"]
    for side in scale["sides"]:
        assert (side["lost"], side["duplicated"], side["leaked"]) == (0, 0, 0)
        assert sum(side["outcomes"].values()) == 120
        assert side["kill"]["after_outcomes"] >= 30  # a host died a quarter of the way in
        assert (side["hosts"], side["hosts_live_at_end"]) == (2, 1)
    assert "dispatcher_overhead" in scale
    assert scale["wall_ratio"] > 0
