"""Smoke run of ``benchmarks/async_bench.py --tiny``: every mode and the learning rows run, and the JSON holds what
``docs/train/benchmarks.md`` reports. Timings are not asserted (benchmarks report, tests don't time)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "async_bench.py"
MODES = ("sync", "one_step_off", "fully_async")


@pytest.mark.slow
def test_async_bench_tiny_runs_every_mode_and_reports_its_keys(tmp_path: Path) -> None:
    out = tmp_path / "async_bench.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    assert "fully_async trajectories/s vs sync" in done.stdout
    result = json.loads(out.read_text())
    assert result["benchmark"] == "async_bench"
    assert result["tiny"] is True
    assert {"cpu_count", "cpu_model", "loadavg_start", "loadavg_end"} <= result["machine"].keys()
    for key in ("throughput_ratio_fully_async_vs_sync", "throughput_ratio_one_step_off_vs_sync"):
        assert math.isfinite(result[key])
        assert result[key] > 0
    assert 0 < result["engine_busy_fraction_fully_async"] <= 1
    assert [row["mode"] for row in result["rows"]] == list(MODES)
    trajectories = result["workload"]["prompts_per_step"] * result["workload"]["samples"]
    for mode in MODES:
        row = result["modes"][mode]
        assert row["trajectories_per_s"] > 0
        assert len(row["step_s"]) == row["timed_steps"] == result["timed"]
        assert math.isclose(row["trajectories_per_s"], row["timed_steps"] * trajectories / row["window_s"])
        for fraction in ("engine_busy_fraction", "trainer_busy_fraction", "gpu_slot_occupancy"):
            assert 0 < row[fraction] <= 1, (mode, fraction)
        assert math.isclose(sum(row["staleness_hist"].values()), 1.0)
        assert 0 <= row["refilled"] <= row["evicted"]
    assert result["modes"]["sync"]["staleness_hist"] == {"0": 1.0}
    assert result["modes"]["one_step_off"]["staleness_hist"] == {"1": 1.0}
    assert set(result["modes"]["fully_async"]["staleness_hist"]) <= {"0", "1"}  # max_staleness 1
    swe = result["swe"]
    assert swe["run"] is True
    assert [*swe["modes"]] == list(MODES)
    episodes = swe["workload"]["prompts_per_step"] * swe["workload"]["samples"]
    for mode, row in swe["modes"].items():
        assert math.isclose(row["trajectories_per_s"], row["timed_steps"] * episodes / row["window_s"])
        assert 0 < row["engine_busy_fraction"] <= 1, mode  # the latency oracle's calls are engine spans
        assert 0 < row["trainer_busy_fraction"] <= 1, mode
        assert 0 < row["reward_mean"] < 1, mode  # one oracle sample per task resolves it, the others submit nothing
    assert math.isfinite(result["swe_throughput_ratio_fully_async_vs_sync"])
    assert 0 < result["swe_engine_busy_fraction_fully_async"] <= 1
    learning = result["learning"]
    assert learning["run"] is True
    assert learning["smoke"] is True
    assert set(learning["modes"]) == set(MODES)
    for row in learning["modes"].values():
        assert 0 <= row["before"] <= 1
        assert 0 <= row["after"] <= 1
        assert row["within"] == (abs(row["after"] - learning["modes"]["sync"]["after"]) <= 0.05)
    assert learning["seeds"] == len(learning["per_seed"]) == 1
    seed_run = learning["per_seed"][0]
    for mode, row in learning["modes"].items():  # one seed: the mean is that seed's run
        assert row["after"] == seed_run["modes"][mode]["after"]
        assert row["seed_gaps"] == [seed_run["modes"][mode]["after"] - seed_run["modes"]["sync"]["after"]]
    assert len(result["targets"]) == 6
    assert all(target["met"] in (True, False) for target in result["targets"])  # reported, whichever it is
