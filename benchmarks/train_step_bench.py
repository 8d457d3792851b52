"""The framework's training step beside a plain PyTorch loop on the CPU: what the framework itself costs.

    .venv/bin/python benchmarks/train_step_bench.py            # ≈1 minute on 2 cores
    .venv/bin/python benchmarks/train_step_bench.py --quick    # smoke run, seconds

Workload: the project's tiny model shape (``skyrl_train.models.tiny``: hidden 256, 4 layers, vocabulary 1,024,
≈3 M parameters, fp32), randomly initialised; ``--rows`` rows × ``--seq-len`` random tokens per step, the last
``seq_len − 32`` positions the response; micro-batches of ``--micro-batch`` rows; cross-entropy on the response
positions, AdamW, clipping at 1.0. Sides (``benchmarks/gpu_bench.py`` builds them; the same code times them on a
GPU at the 0.5B and 1.5B shapes):

- ``plain``: :class:`_plain_loop.PlainLoop`, a Hugging Face model and AdamW with no framework (the baseline);
- ``torch``: ``TorchBackend`` (``forward_backward`` with the ``cross_entropy`` loss, then ``optim_step``);
- ``torch_mixed`` (only with ``--mixed``): float32 master weights and bfloat16 autocast, the GPU policy (CPU bf16
  matmuls are many times slower than fp32 ones here, which is why the CPU computes in fp32);
- ``fsdp2``: one FSDP2 rank (gloo, world size 1) in this process.

Rounds alternate the order of the sides; ``--warmup`` untimed rounds first. Target (reported, never asserted):
TorchBackend's median step time ≤ 1.1× the plain loop's. Output: the table on stdout and ``--output`` (default
``benchmarks/results/train_step_bench.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gpu_bench

DEFAULT_OUTPUT = gpu_bench.REPO / "benchmarks" / "results" / "train_step_bench.json"
TARGET = 1.1  # TorchBackend step time / plain loop step time


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few small steps (smoke test)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mixed", action="store_true", help="also time fp32 master weights with bf16 autocast")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return parser.parse_args(argv)


def workload(args: argparse.Namespace) -> gpu_bench.Workload:
    if args.quick:
        args.rows, args.seq_len, args.micro_batch, args.warmup, args.steps = 4, 48, 2, 1, 2
    return gpu_bench.Workload(
        ("tiny",),
        "cpu",
        "float32",
        "gloo",
        rows=args.rows,
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        warmup=args.warmup,
        steps=args.steps,
        peak_tflops=1.0,  # no meaningful peak on a CPU: MFU is not reported
        budget_s=3600.0,
        sides=("plain", "torch", "torch_mixed", "fsdp2") if args.mixed else ("plain", "torch", "fsdp2"),
    )


def summary(training: dict[str, Any]) -> dict[str, Any]:
    """Median step seconds per side and each side's ratio to the plain loop."""
    sides = next(iter(training["micro_batches"].values()))
    plain = sides["plain"]["median_step_s"]
    out: dict[str, Any] = {}
    for name, side in sides.items():
        median = side["median_step_s"]
        out[name] = {"median_step_s": median, "vs_plain": median / plain if median and plain else None}
    return out


def table(rows: dict[str, Any], work: gpu_bench.Workload) -> str:
    lines = [f"training step, tiny model, {work.rows}×{work.seq_len} tokens, micro-batch {work.micro_batch} (CPU)"]
    lines += ["side        | median step s | vs plain loop", "------------|---------------|--------------"]
    for name, row in rows.items():
        median = f"{row['median_step_s']:.4f}" if row["median_step_s"] else "—"
        ratio = f"{row['vs_plain']:.2f}×" if row["vs_plain"] else "—"
        lines.append(f"{name:<11} | {median:>13} | {ratio:>13}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work = workload(args)
    import torch.distributed as dist

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="train-step-bench-") as tmp:
        model, params = gpu_bench.build_model(work, "tiny", Path(tmp) / "tiny")
        gpu_bench.init_process_group(work)  # the FSDP2 side's world of one
        try:
            training = gpu_bench.measure_training(work, "tiny", model, params, gpu_bench.Budget(work.budget_s))
        finally:
            dist.destroy_process_group()
    rows = summary(training)
    result = {
        "benchmark": "train_step_bench",
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "workload": asdict(work),
        "environment": gpu_bench.environment(work),
        "parameters": params,
        "training": training,
        "summary": rows,
        "target": {"torch_vs_plain_at_most": TARGET},
        "wall_s": time.perf_counter() - started,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows, work))
    print(f"\ntarget: TorchBackend ≤ {TARGET}× the plain loop's step time; wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
