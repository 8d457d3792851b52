"""``benchmarks/agent_bench.py`` runs end to end (no Docker, 3 episodes per schedule) and writes a complete report.

No timing is asserted: benchmark numbers belong in the report, not in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "agent_bench.py"
OPS = {"warm_acquire", "cold_start", "round_trip", "snapshot", "fork"}


@pytest.mark.slow
def test_quick_run_reports_both_parts(tmp_path: Path) -> None:
    output = tmp_path / "agent_bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--skip-docker", "--backend", "process", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    report = json.loads(output.read_text())
    assert set(report["sandbox"]) == {"local"}  # no Docker subjects
    local = report["sandbox"]["local"]
    if local["error"] is None:  # the local backend needs bubblewrap; its rows need root and the image's rootfs
        for op in OPS:
            assert local["p50_ms"].get(op, 0) > 0 or op in local["op_errors"], op  # measured, or the reason why not
    dispatcher = report["dispatcher"]
    assert dispatcher["backend"] == "process"
    assert set(dispatcher["modes"]) == {"sequential", "naive", "dispatcher"}
    for name, mode in dispatcher["modes"].items():
        assert mode["makespan_s"] > 0, name
        assert mode["resolved"] == [mode["episodes"]], name
    assert dispatcher["bound"]["bound_s"] > 0
    assert dispatcher["bound"]["gpu_work_s"] > 0
    assert {t["target"] for t in report["targets"]} >= {"dispatcher makespan vs naive async batch"}
    assert report["cleanup"] is None
    for text in ("Sandbox latencies", "lower bound", "Targets", "load average"):
        assert text in done.stdout
