"""benchmarks/grading_overhead_bench.py runs both sides and writes its table's numbers."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "grading_overhead_bench.py"


def test_the_overhead_bench_runs_both_sides_and_writes_its_json(tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    args = [sys.executable, str(BENCH), "--tests", "40", "--rounds", "2", "--output", str(output)]
    done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ratio test_run / plain" in done.stdout
    result = json.loads(output.read_text())
    assert set(result["median_s"]) == {"plain", "test_run"}
    assert all(len(times) == 2 for times in result["times_s"].values())
    assert result["ratio"] > 0
