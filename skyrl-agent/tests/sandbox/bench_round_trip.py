"""Command round trip through ``Sandbox.run`` on the Docker and local backends: p50 and p90 per command.

    .venv/bin/python skyrl-agent/tests/sandbox/bench_round_trip.py [--baseline REF] [--rounds 5] [-n 300]

Each round starts one sandbox per (code version, backend) in a fresh process, runs every command ``--warmup``
times untimed, then ``-n`` times timed, back to back. Rounds alternate versions and backends, so that the load
of a shared machine falls on all of them alike; the table gives the median over rounds of each round's p50 and
p90. ``--baseline REF`` also measures the ``skyrl_agent`` package of git revision REF (taken with ``git
archive``) beside the working tree. The table is printed and the results are written as JSON (``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the monorepo
COMMANDS = ("true", "echo hi")


async def measure(backend_kind: str, n: int, warmup: int) -> dict[str, list[float]]:
    """Milliseconds per ``Sandbox.run`` of each command, in one fresh sandbox of ``backend_kind``."""
    from skyrl_agent.sandbox.base import SandboxSpec

    if backend_kind == "docker":
        from skyrl_agent.sandbox.docker_backend import DockerBackend

        backend = DockerBackend(run_id="skyrl-bench-round-trip")
    else:
        from skyrl_agent.sandbox.local_backend import LocalBackend, export_rootfs

        backend = LocalBackend(export_rootfs())
    try:
        sandbox = await backend.create(SandboxSpec())
        try:
            samples = {}
            for command in COMMANDS:
                for _ in range(warmup):
                    await sandbox.run(command)
                samples[command] = []
                for _ in range(n):
                    start = time.perf_counter()
                    result = await sandbox.run(command)
                    samples[command].append((time.perf_counter() - start) * 1000)
                    assert result.exit_code == 0, result
            return samples
        finally:
            await sandbox.close()
    finally:
        await backend.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def run_worker(source: Path, backend_kind: str, n: int, warmup: int) -> dict[str, list[float]]:
    """One measurement in a fresh interpreter that imports ``skyrl_agent`` from ``source``."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    args = [sys.executable, __file__, "--worker", backend_kind, "-n", str(n), "--warmup", str(warmup)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(proc.stdout))


def baseline_source(ref: str, into: Path) -> Path:
    """The ``skyrl-agent`` directory of git revision ``ref``, extracted under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "skyrl-agent/skyrl_agent"], capture_output=True)
    archive.check_returncode()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "skyrl-agent"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="docker,local")
    parser.add_argument("--baseline", help="also measure the skyrl_agent package of this git revision")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", type=int, default=300, help="timed commands per round, per command")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--output", type=Path, default=Path(tempfile.gettempdir()) / "bench_round_trip.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(asyncio.run(measure(args.worker, args.n, args.warmup))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"working tree": ROOT / "skyrl-agent"}
        if args.baseline:
            versions = {args.baseline: baseline_source(args.baseline, Path(tmp)), **versions}
        rounds: dict[str, list[dict[str, list[float]]]] = {}
        for index in range(args.rounds):
            for backend_kind in args.backends.split(","):
                for version, source in versions.items():
                    samples = run_worker(source, backend_kind, args.n, args.warmup)
                    rounds.setdefault(f"{backend_kind} | {version}", []).append(samples)
            print(f"round {index + 1}/{args.rounds} done", file=sys.stderr)
    report = {}
    print(f"{'backend | code':32} {'command':10} {'p50 ms':>8} {'p90 ms':>8}   (median over {args.rounds} rounds)")
    for subject, per_round in rounds.items():
        for command in COMMANDS:
            p50 = statistics.median(percentile(r[command], 50) for r in per_round)
            p90 = statistics.median(percentile(r[command], 90) for r in per_round)
            report.setdefault(subject, {})[command] = {"p50_ms": p50, "p90_ms": p90}
            print(f"{subject:32} {command:10} {p50:8.2f} {p90:8.2f}")
    meta = {"loadavg": os.getloadavg(), "cpus": os.cpu_count(), "n": args.n, "rounds": args.rounds}
    args.output.write_text(json.dumps({"meta": meta, "results": report}, indent=2))
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
