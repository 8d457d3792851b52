"""``benchmarks/train_bench.py`` runs end to end (ours only, two timed steps) and writes a complete report.

No timing is asserted: benchmark numbers belong in the report, not in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "train_bench.py"
ROWS = {
    "grpo_step",
    "step_generation",
    "completion_length",
    "engine_local",
    "engine_vllm",
    "sync_local",
    "sync_vllm",
}


@pytest.mark.slow
def test_quick_run_reports_every_row(tmp_path: Path) -> None:
    output = tmp_path / "train_bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--skip-trl", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    report = json.loads(output.read_text())
    assert set(report["rows"]) == ROWS
    assert report["trl"] is None
    for name in ("grpo_step", "step_generation", "completion_length", "engine_local", "sync_local"):
        assert report["rows"][name]["ours"] > 0, name
        assert report["rows"][name]["trl"] is None or name == "completion_length", name
    assert report["rows"]["grpo_step"]["ratio"] is None
    for name in ("engine_vllm", "sync_vllm"):  # measured, or skipped with the reason
        row = report["rows"][name]
        assert row["ours"] is not None or row["note"], name
    assert 0 < report["rows"]["completion_length"]["ours"] <= 64
    assert "GRPO step" in done.stdout
    assert "load average" in done.stdout
