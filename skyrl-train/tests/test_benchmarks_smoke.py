"""Smoke runs of the benchmark scripts (``benchmarks/gpu_bench.py``, ``benchmarks/ray_bench.py``) at tiny budgets.

Each script runs as its own program, as it would on the machine it is meant for, and the JSON it writes is checked
for the fields ``docs/train/benchmarks.md`` reports. Timings are not asserted (benchmarks report, tests don't time).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# What a lent GPU machine lacks (it has torch and transformers, with their own dependencies, and nothing else):
# gpu_bench.py must not import any of these, not even through skyrl_train.
ABSENT_ON_GPU_MACHINE = ("ray", "vllm", "peft", "aiohttp", "pyarrow", "rich", "tensorboard", "matplotlib", "skyrl_gym")
# A None entry in sys.modules makes `import name` fail and importlib.util.find_spec(name) answer None, as for a
# package that is not installed (transformers probes optional packages that way).
WITHOUT_MODULES = """
import runpy, sys
sys.modules.update(dict.fromkeys({absent!r}))
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""


def run_gpu_bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "gpu_bench.json"
    script = str(BENCHMARKS / "gpu_bench.py")
    program = WITHOUT_MODULES.format(absent=ABSENT_ON_GPU_MACHINE, script=script)
    done = subprocess.run(
        [sys.executable, "-c", program, "--small", "--output", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.slow
def test_gpu_bench_small_runs_every_phase_without_ray_or_vllm(tmp_path: Path) -> None:
    result = run_gpu_bench(tmp_path)
    assert result["benchmark"] == "gpu_bench"
    assert result["small"] is True
    assert result["partial"] is False
    assert result["budget"]["stopped_early"] == []
    assert {"torch", "transformers", "cuda"} <= result["environment"].keys()
    work = result["workload"]
    training = result["training"]["small"]
    assert training["tokens_per_step"] == work["rows"] * work["seq_len"]
    sides = training["micro_batches"]["2"]
    assert set(sides) == {"plain", "torch", "torch_mixed", "fsdp2"}
    for backend, side in sides.items():
        assert side["error"] is None, backend
        assert len(side["step_s"]) == work["steps"]
        assert side["median_step_s"] > 0
        assert side["tokens_per_s"] > 0
        assert 0 < side["mfu"] < 1
    weights = result["weights"]
    assert weights["bytes"] == result["models"]["small"]["parameters"] * 4  # fp32, tied embeddings once
    assert weights["fsdp2"]["gb_per_s"] > 0
    assert weights["torch"]["gb_per_s"] > 0
    decoding = result["decoding"]
    assert decoding["engine_load_s"] > 0
    assert decoding["local_tokens"] == decoding["hf_tokens"] == work["prompts"] * work["new_tokens"]
    assert decoding["local"]["tokens_per_s"] > 0
    assert decoding["hf"]["tokens_per_s"] > 0
    # The hand-over phases ran; on the CPU nothing moves, so there is no device memory to report.
    assert result["offload"]["offload_s"] >= 0
    assert result["offload"]["allocated_gb"] is None
    assert decoding["sleep"]["wake_up_s"] >= 0
    labels = [row["label"] for row in result["rows"]]
    assert labels[0].startswith("TorchBackend step (small")
    assert all(row["baseline"] == sides["plain"]["tokens_per_s"] for row in result["rows"][:3])  # vs the plain loop
    assert all(row["ours"] is not None for row in result["rows"] if "GB/s" not in row["unit"])


def test_train_step_bench_puts_the_backend_beside_the_plain_loop(tmp_path: Path) -> None:
    out = tmp_path / "train_step_bench.json"
    script = str(BENCHMARKS / "train_step_bench.py")
    argv = [sys.executable, script, "--quick", "--mixed", "--output", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["summary"]["plain"]["vs_plain"] == 1.0
    for side in ("torch", "torch_mixed", "fsdp2"):
        assert result["summary"][side]["vs_plain"] > 0, side
    assert "vs plain loop" in done.stdout


@pytest.mark.slow
def test_gpu_check_runs_an_example_and_checks_its_metrics(tmp_path: Path) -> None:
    script = str(BENCHMARKS / "gpu_check.py")
    argv = [sys.executable, script, "--small", "--no-bench", "--no-fsdp", "--out", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    run = report["runs"]["gsm8k_multi_turn"]
    assert run["ok"], run
    assert [step["step"] for step in run["steps"]] == [1, 2]
    assert all(step["system/device_is_cuda"] == 0.0 for step in run["steps"])


@pytest.mark.slow
def test_gpu_bench_budget_cuts_the_run_short_and_still_writes_its_json(tmp_path: Path) -> None:
    result = run_gpu_bench(tmp_path, "--budget-s", "1")
    assert result["partial"] is False
    notes = result["budget"]["stopped_early"]
    assert any(note.startswith("training small mb2: 0 of") for note in notes), notes
    assert any(note.startswith("decoding skipped") for note in notes), notes
    fsdp = result["training"]["small"]["micro_batches"]["2"]["fsdp2"]
    assert fsdp["step_s"] == []
    assert fsdp["mfu"] is None
    assert "decoding" not in result


@pytest.mark.ray
@pytest.mark.slow
def test_ray_bench_quick_runs_both_backends_through_the_run_loop(tmp_path: Path) -> None:
    out = tmp_path / "ray_bench.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "ray_bench.py"), "--quick", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    assert "GRPO step (quickstart)" in done.stdout
    result = json.loads(out.read_text())
    assert result["benchmark"] == "ray_bench"
    steps = result["warmup"] + result["steps"]
    for side, policy in (("in_process", "TorchBackend"), ("ray", "FSDPBackend")):
        report = result[side]
        assert report["policy_class"] == policy
        assert report["global_step"] == steps
        assert len(report["steps"]) == steps
        assert all(record["cpu_s"] > 0 for record in report["steps"])
        logged = report["metrics_jsonl"]  # what the run's own jsonl logger wrote, step by step
        assert [row["timing/step_s"] for row in logged] == [r["timing/step_s"] for r in report["steps"]]
        assert all(row["system/num_policy_workers"] == 1.0 for row in logged)
    rows = {row["label"]: row for row in result["rows"]}
    step = rows["GRPO step (quickstart)"]
    assert step["ratio"] > 0
    assert step["target_met"] in (True, False)
    assert result["workload"]["parameter_bytes"] > 0
    parts = result["components"]
    paths = {"torch_to_local", "fsdp_to_local", "fsdp_to_actor", "fsdp_broadcast_to_actor", "torch_to_actor"}
    assert set(parts["sync_s"]) == paths
    assert all(len(v) == result["repeats"] for v in parts["sync_s"].values())
    assert all(len(v) == result["repeats"] for v in parts["generation_tokens_per_s"].values())
