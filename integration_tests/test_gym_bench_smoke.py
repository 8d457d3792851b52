"""``benchmarks/gym_bench.py`` runs end to end (ours only, a few episodes per row) and writes a complete report.

No timing is asserted: benchmark numbers belong in the report, not in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gym_bench.py"
ROWS = {"gsm8k", "lcb", "lcb_x8", "python_tool", "python_tool_x8", "text2sql"}


@pytest.mark.slow
def test_quick_run_reports_every_row(tmp_path: Path) -> None:
    output = tmp_path / "gym_bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--skip-upstream", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(output.read_text())
    assert set(report["rows"]) == ROWS
    for name, row in report["rows"].items():
        assert row["ours"]["median"] > 0, name
        assert row["upstream"] is None, name
        assert row["ratio"] is None, name
    assert report["machine"]["skyrl_gym_ours"].startswith(str(REPO / "skyrl-gym" / "skyrl_gym"))
    for label in ("gsm8k make+init+step", "searchcode python tool call", "n/a"):
        assert label in done.stdout
