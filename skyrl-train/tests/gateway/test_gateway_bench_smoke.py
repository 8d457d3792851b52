"""Smoke run of ``benchmarks/gateway_bench.py --quick``: it runs as its own program and writes the JSON the docs
report. Timings are not asserted (benchmarks report, tests don't time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def test_gateway_bench_quick_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "gateway_bench.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gateway_bench.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "overhead p50" in done.stdout
    result = json.loads(out.read_text())
    assert result["benchmark"] == "gateway_bench"
    assert result["quick"] is True
    assert result["workload"]["gateway_errors"] == 0
    rows = {row["label"]: row for row in result["rows"]}
    assert set(rows) == {
        "chat, first turn",
        "chat, later turn",
        "chat, later turn, streamed",
        "completions, token ids",
        "HTTP floor (GET /v1/models)",
    }
    for label, row in rows.items():
        assert row["calls"] > 0
        assert row["gateway_p50_ms"] > 0
        if label.startswith("HTTP floor"):
            assert row["overhead_p50_ms"] is None
        else:
            assert row["direct_p50_ms"] is not None
            assert row["target_met"] in (True, False)
            assert len(result["samples_s"][label]["direct"]) == row["calls"]
