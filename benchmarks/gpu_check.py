"""The GPU acceptance check: the documented examples on the GPU by default, then the GPU benchmark, in one command.

    PYTHONPATH=skyrl-gym:skyrl-train python benchmarks/gpu_check.py --out "$OUT"      # a GPU machine, ≤ 8 min
    .venv/bin/python benchmarks/gpu_check.py --small --out /tmp/gpu-check              # CPU smoke, ≈1 min

Needs torch (CUDA build), transformers and the project's packages; Ray is optional (the FSDP2 run is skipped,
and says so, without it); no vLLM, nothing downloaded.

1. **Examples, default device.** In a scratch directory set up as ``docs/train/examples.md`` says (a tiny model
   where the quickstart puts its SFT model, ``skyrl-gym make-dataset``), each example in ``--examples`` runs as
   documented (``skyrl-train --config skyrl-train/examples/NAME.yaml``) for 2 steps, with no device key given, in
   a process of its own; then ``gsm8k_multi_turn`` once more with ``trainer.backend=fsdp`` (one FSDP2 rank as a Ray
   actor). Each run must log ``system/device_is_cuda = 1`` and a positive ``system/peak_memory_gib/policy`` on
   every step (``--small``: the CPU, no peak) and only finite losses, gradient norms and rewards.
2. **Benchmark.** ``benchmarks/gpu_bench.py`` with the budget left (the training step beside the plain loop at
   the 0.5B and 1.5B shapes, weight extraction, the optimizer's offload, decoding).

Output under ``--out``: ``gpu_check.json`` (each run: its command, seconds, verdict, the checked metrics) and
``gpu_bench.json``; the exit status is 1 when any example run failed its checks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = ("gsm8k_multi_turn", "text2sql", "lcb")  # search needs its retrieval service; swe_* need Docker
STEPS = ["trainer.max_training_steps=2", "trainer.eval_before_train=false", "trainer.eval_interval=0"]
FSDP = ["trainer.backend=fsdp", "trainer.num_training_workers=1", "trainer.num_cpus_per_worker=1"]
# --small (CPU): the untrained tiny model never stops by itself, so the smoke run keeps its rollouts short.
SMALL = [
    "trainer.device=cpu",
    "trainer.train_batch_size=2",
    "trainer.policy_mini_batch_size=2",
    "generator.n_samples_per_prompt=2",
    "generator.max_generate_length=8",
    "trainer.micro_train_batch_size=4",
    "trainer.micro_forward_batch_size=4",
]
CHECKED = ("loss", "grad_norm", "reward/mean")  # metric names containing these must be finite


MODEL_DIR = Path("runs") / "quickstart" / "sft-model"  # where the quickstart leaves its model, as the examples expect


def set_up(root: Path) -> None:
    """The examples page's setup in ``root``: the model where the quickstart leaves it, and the demo data."""
    from skyrl_gym import cli as gym_cli
    from skyrl_train.models.tiny import build_tiny_model

    build_tiny_model(root / MODEL_DIR, seed=0)
    cwd = Path.cwd()
    os.chdir(root)
    try:
        if gym_cli.main(["make-dataset", "--out", "data/demo"]) != 0:
            raise RuntimeError("skyrl-gym make-dataset failed")
    finally:
        os.chdir(cwd)


def run_example(
    root: Path, name: str, label: str, extra: Sequence[str], timeout_s: float, on_gpu: bool
) -> dict[str, Any]:
    """One documented example for 2 steps in its own process; its verdict and the metrics checked."""
    config = REPO / "skyrl-train" / "examples" / f"{name}.yaml"
    run_dir = f"runs/check-{label.replace('/', '-')}"
    argv = ["--config", str(config), *STEPS, f"trainer.run_dir={run_dir}", *extra]
    command = [sys.executable, "-m", "skyrl_train.cli", *argv]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        stderr = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"command": argv, "ok": False, "why": f"timed out after {timeout_s:.0f} s", "stderr": stderr}
    out: dict[str, Any] = {"command": argv, "seconds": round(time.perf_counter() - started, 1)}
    if done.returncode != 0:
        return {**out, "ok": False, "why": f"exit {done.returncode}", "stderr": done.stderr[-3000:]}
    steps = _step_lines(root / run_dir / "metrics.jsonl")
    problems = check_steps(steps, on_gpu)
    return {**out, "ok": not problems, "why": "; ".join(problems), "steps": [_summary(s) for s in steps]}


def _step_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if "reward/mean" in line]


def check_steps(steps: list[dict[str, Any]], on_gpu: bool) -> list[str]:
    """What is wrong with a run's step metrics (nothing: ``[]``)."""
    if len(steps) != 2:
        return [f"expected 2 logged steps, found {len(steps)}"]
    problems = []
    for line in steps:
        step = line.get("step")
        if line.get("system/device_is_cuda") != float(on_gpu):
            problems.append(f"step {step}: system/device_is_cuda={line.get('system/device_is_cuda')}")
        peak = line.get("system/peak_memory_gib/policy")
        if on_gpu and not (isinstance(peak, int | float) and peak > 0):
            problems.append(f"step {step}: no GPU memory used by the policy (system/peak_memory_gib/policy={peak})")
        for key, value in line.items():
            if any(part in key for part in CHECKED) and isinstance(value, float) and not math.isfinite(value):
                problems.append(f"step {step}: {key}={value}")
    return problems


def _summary(line: dict[str, Any]) -> dict[str, Any]:
    keys = ("step", "reward/mean", "policy/grad_norm", "timing/step_s", "system/device_is_cuda")
    picked = {k: line[k] for k in keys if k in line}
    picked.update({k: v for k, v in line.items() if k.startswith("system/peak_memory_gib/")})
    return picked


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for gpu_check.json and gpu_bench.json")
    parser.add_argument("--small", action="store_true", help="CPU smoke run: one example, the small benchmark")
    parser.add_argument("--examples", help=f"comma list (default: {','.join(EXAMPLES)})")
    parser.add_argument("--budget-s", type=float, default=450.0, help="seconds for everything (default 450)")
    parser.add_argument("--no-bench", action="store_true", help="the examples only")
    parser.add_argument("--no-fsdp", action="store_true", help="skip the FSDP2 run through Ray")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    import torch

    on_gpu = torch.cuda.is_available() and not args.small
    names = args.examples.split(",") if args.examples else (["gsm8k_multi_turn"] if args.small else list(EXAMPLES))
    extra = SMALL if args.small else []
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"on_gpu": on_gpu, "runs": {}}
    runs = [(name, name, extra, 150.0) for name in names]
    if args.no_fsdp:
        report["runs"]["gsm8k_multi_turn/fsdp"] = {"ok": None, "why": "skipped: --no-fsdp"}
    elif ray_available():
        runs.append(("gsm8k_multi_turn", "gsm8k_multi_turn/fsdp", [*FSDP, *extra], 180.0))
    else:
        report["runs"]["gsm8k_multi_turn/fsdp"] = {"ok": None, "why": "skipped: Ray is not installed"}
        print("gsm8k_multi_turn/fsdp: skipped (Ray is not installed)")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = Path(tmp)
        set_up(root)
        for name, label, overrides, timeout_s in runs:
            run = report["runs"][label] = run_example(root, name, label, overrides, timeout_s, on_gpu)
            print(f"{label}: {'ok' if run['ok'] else 'FAILED ' + run['why']} ({run.get('seconds', '?')} s)")
        if on_gpu:
            from _gpu_sleep_check import check_pinned_sleep

            sleep = report["runs"]["local_engine/pinned_sleep"] = check_pinned_sleep(root / MODEL_DIR)
            print(f"local_engine/pinned_sleep: {'ok' if sleep['ok'] else 'FAILED ' + sleep['why']}")
    report["examples_s"] = round(time.perf_counter() - started, 1)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.no_bench:
        left = args.budget_s - (time.perf_counter() - started) - 30  # the bench's own start and model builds
        script, output = REPO / "benchmarks" / "gpu_bench.py", args.out / "gpu_bench.json"
        bench = [sys.executable, str(script), "--output", str(output)]
        bench += ["--small"] if args.small else ["--budget-s", str(max(int(left), 60))]
        subprocess.run(bench, check=False)
    failed = [name for name, run in report["runs"].items() if run["ok"] is False]
    print(f"gpu_check: {len(report['runs']) - len(failed)} of {len(report['runs'])} runs passed; wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
