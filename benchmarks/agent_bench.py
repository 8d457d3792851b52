"""skyrl-agent benchmarks: sandbox latencies beside plain docker-py, and the dispatcher beside simpler schedules.

    .venv/bin/python benchmarks/agent_bench.py                  # both parts, 3 repeats (about 15 minutes)
    .venv/bin/python benchmarks/agent_bench.py --quick --skip-docker --backend process   # smoke run

Part 1, sandbox latencies (``_agent_bench_sandbox.py``): warm acquire, cold create+start, command round trip,
snapshot and fork, p50/p90 per subject: our ``DockerBackend``, our ``LocalBackend`` (bubblewrap over overlayfs)
and the docker SDK used directly (``containers.run`` + one ``exec_run`` per command). Repeats alternate the
subjects, so slow drifts in the load of a shared machine hit all alike; the samples of all repeats are pooled.
Every container and image carries this run's labels; at the end whatever is left under them is removed and
reported, and the script exits with status 1 if anything survives.

Part 2, dispatcher (``_agent_bench_worker.py``, one fresh interpreter per run, each in a cgroup of its own when
the machine allows it): the shipped suite, ``--samples`` episodes per task, the oracle policy behind one shared
modelled GPU, run sequentially (first repeat only: one episode at a time is the plain sum of the work), as a naive
async batch, and through the dispatcher with stage limits. Reported: makespan, how busy the GPU was, CPU seconds,
and the lower bound on the makespan set by the busiest resource:

    bound = max(GPU work / GPU slots, CPU work / usable cores, longest single episode)

GPU work is the modelled generation time summed over calls (the same in every run: each episode's noise is seeded
by its id). CPU work is the least CPU time any run of the workload used, counted by the run's cgroup: the worker
and every process it starts, sandboxes included; not kernel threads, not the Docker daemon. Without cgroups it is
the whole machine's busy time during the run (``/proc/stat``), which also counts other people's work.

The machines these run on are shared, and other processes slow some runs down: each run's "rest of host" CPU
(the machine's busy time minus the run's own) is reported, and so is each run's distance to the bound with the CPU
term taken from the machine's whole busy time during that run ("host load"). Targets are judged on the medians
against the strict bound.

Output: the tables on stdout and a JSON report (default ``benchmarks/results/agent_bench.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _agent_bench_sandbox import OPS, Subject, leftovers, make_subject
from _machine import host_info
from gym_bench import CpuAccounting

from skyrl_agent.sandbox import reaper
from skyrl_agent.sandbox.base import SandboxError
from skyrl_agent.tasks import load_suite

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "benchmarks" / "_agent_bench_worker.py"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "agent_bench.json"
MODES = {"sequential": "sequential", "naive": "naive async batch", "dispatcher": "dispatcher"}
BACKENDS = {
    "local": "local backend (bubblewrap over overlayfs: Docker's ≈0.3 s starts, two per episode, would dominate)",
    "process": "process backend (plain subprocesses, no isolation)",
    "docker": "Docker backend",
}
QUICK_TASKS = 3

# Targets. Latencies: p50 in milliseconds, per subject of ours. Dispatcher: speed-up over the naive batch, and
# makespan over the lower bound.
WARM_ACQUIRE_MS = 10.0
ROUND_TRIP_MS = 2.0
FORK_MS = {"docker (ours)": 200.0, "local (ours)": 20.0}
SPEEDUP_OVER_NAIVE = 1.55
WITHIN_BOUND = 1.15


# --- Statistics and formatting --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation between the closest ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if value < 1 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _yes(met: bool | None) -> str:
    return {None: "n/a", True: "yes", False: "NO"}[met]


def render(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    """A plain-text table; columns in ``right`` are right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def fmt(cells: list[str]) -> str:
        return " | ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([fmt(header), "-|-".join("-" * w for w in widths), *(fmt(row) for row in rows)])


# --- Part 1: sandbox latencies --------------------------------------------------------------------------------------


async def measure_sandboxes(names: list[str], run_id: str, repeats: int, quick: bool) -> dict[str, Any]:
    """Samples (ms) of every operation per subject, repeats alternating subjects; errors recorded per subject/op."""
    subjects: dict[str, Subject] = {}
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            subject = make_subject(name, run_id, quick)
        except SandboxError as exc:
            results[name] = {"label": name, "error": str(exc), "samples_ms": {}}
            print(f"  {name}: unavailable ({exc})", flush=True)
            continue
        subjects[name] = subject
        results[name] = {"label": subject.name, "error": None, "samples_ms": {}, "op_errors": {}}
    try:
        for repeat in range(repeats):
            for name, subject in subjects.items():
                await _measure_subject(subject, results[name], f"repeat {repeat + 1}/{repeats}")
    finally:
        for subject in subjects.values():
            await subject.close()
    return results


async def _measure_subject(subject: Subject, result: dict[str, Any], where: str) -> None:
    for op in OPS:
        if op in result["op_errors"]:
            continue  # failed in an earlier repeat: do not pay for it again
        try:
            samples = await subject.measure(op, getattr(subject.counts, op))
        except (SandboxError, OSError) as exc:
            result["op_errors"][op] = f"{type(exc).__name__}: {exc}"
            print(f"  {where} {subject.name:18} {op:13} FAILED: {exc}", flush=True)
            continue
        if samples is None:
            continue
        result["samples_ms"].setdefault(op, []).extend(1000 * s for s in samples)
        p50 = statistics.median(samples) * 1000
        print(f"  {where} {subject.name:18} {op:13} n={len(samples):<4} p50 {_ms(p50):>7} ms", flush=True)


def summarise_latencies(results: dict[str, Any]) -> None:
    """Add p50/p90 (ms) per operation to each subject's result."""
    for result in results.values():
        result["p50_ms"] = {op: statistics.median(v) for op, v in result["samples_ms"].items()}
        result["p90_ms"] = {op: percentile(v, 90) for op, v in result["samples_ms"].items()}


def latency_table(results: dict[str, Any]) -> str:
    labels = [r["label"] for r in results.values()]
    header = ["operation", *(f"{label} p50 / p90 ms" for label in labels)]
    ratio = "plain" in results and "docker" in results  # how much faster ours is than the SDK used directly
    if ratio:
        header.append("plain ÷ ours (Docker, p50)")
    rows = []
    for op, text in OPS.items():
        row = [text]
        for result in results.values():
            p50, p90 = result.get("p50_ms", {}).get(op), result.get("p90_ms", {}).get(op)
            row.append("n/a" if p50 is None else f"{_ms(p50)} / {_ms(p90)}")
        if ratio:
            ours, plain = results["docker"].get("p50_ms", {}).get(op), results["plain"].get("p50_ms", {}).get(op)
            row.append(f"{plain / ours:.1f}×" if ours and plain else "n/a")
        rows.append(row)
    return render(header, rows, set(range(1, len(header))))


def latency_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per (target, subject of ours): the p50 measured and whether it meets the target."""
    targets = []
    for result in results.values():
        label = result["label"]
        if "(ours)" not in label:
            continue
        limits = {"warm_acquire": WARM_ACQUIRE_MS, "round_trip": ROUND_TRIP_MS, "fork": FORK_MS.get(label)}
        for op, limit in limits.items():
            if limit is None:
                continue
            value = result.get("p50_ms", {}).get(op)
            targets.append(
                {
                    "target": f"{OPS[op]} p50, {label}",
                    "limit": f"≤ {limit:g} ms",
                    "value": None if value is None else f"{_ms(value)} ms",
                    "met": None if value is None else value <= limit,
                }
            )
    return targets


# --- Part 2: dispatcher ---------------------------------------------------------------------------------------------


def run_worker(mode: str, args: argparse.Namespace, run_id: str, cpu: CpuAccounting | None) -> dict[str, Any]:
    """One run of the workload under ``mode`` in a fresh interpreter; the worker's JSON report."""
    command = [sys.executable, "-s", str(WORKER), "--mode", mode, "--backend", args.backend, "--json"]
    command += ["--samples", str(args.samples), "--tasks", str(args.tasks), "--run-id", run_id]
    command += ["--gpu", args.gpu, "--limits", args.limits]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if cpu is None:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    else:
        with cpu.group() as (prefix, usage_file):
            command = [*prefix, *command, "--cpu-file", usage_file]
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"the {mode} worker failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def measure_dispatch(args: argparse.Namespace, run_id: str, cpu: CpuAccounting | None) -> dict[str, list[Any]]:
    """Reports by mode: sequential in the first repeat, then naive and dispatcher alternately in every repeat."""
    reports: dict[str, list[Any]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode in (m for m in MODES if m in args.schedules and (repeat == 0 or m != "sequential")):
            report = run_worker(mode, args, f"{run_id}-{mode}-{repeat}", cpu)
            reports[mode].append(report)
            resolved = f"{report['resolved']}/{report['episodes']} resolved"
            print(
                f"  repeat {repeat + 1}/{args.repeats} {mode:10} {report['makespan_s']:7.1f} s  {resolved}", flush=True
            )
    return reports


def lower_bound(reports: dict[str, list[Any]], slots: int, cores: int) -> dict[str, Any]:
    """The makespan no schedule can beat: the busiest resource's work over its capacity (see the module doc)."""
    every = [r for runs in reports.values() for r in runs]
    gpu_work = statistics.median(r["gpu"]["work_s"] for r in every)
    cgroup = [r["cpu_s"] for r in every if r["cpu_s"] is not None]
    cpu_work, cpu_source = (min(cgroup), "cgroup") if cgroup else (min(r["host_cpu_s"] for r in every), "host")
    longest = max((s for r in reports["sequential"] for s in r["episode_s"]), default=0.0)
    terms = {"GPU": gpu_work / slots, "CPU": cpu_work / cores, "one episode": longest}
    binding = max(terms, key=lambda name: terms[name])
    return {
        "bound_s": terms[binding],
        "binding": binding,
        "terms_s": terms,
        "gpu_work_s": gpu_work,
        "gpu_slots": slots,
        "cpu_work_s": cpu_work,
        "cpu_source": cpu_source,
        "cores": cores,
    }


def loaded_bound(report: dict[str, Any], bound: dict[str, Any]) -> float:
    """The bound with the CPU term taken from the whole host's busy time during this run (others' work included).

    Not a strict bound (other people's demand may bend around ours), but on a shared machine it separates what
    the schedule lost from what other processes took: the CPU term is what the cores actually had to do.
    """
    terms: dict[str, float] = bound["terms_s"]
    host_cpu_s: float = report["host_cpu_s"]
    cores: int = bound["cores"]
    return max(terms["GPU"], host_cpu_s / cores, terms["one episode"])


def summarise_dispatch(reports: dict[str, list[Any]], bound: dict[str, Any]) -> dict[str, Any]:
    """Medians per mode, each mode's ratio to the naive batch and to the bound."""
    modes: dict[str, Any] = {}
    for mode, runs in reports.items():
        if not runs:
            continue
        makespan = statistics.median(r["makespan_s"] for r in runs)
        cpu = [r["cpu_s"] for r in runs if r["cpu_s"] is not None]
        modes[mode] = {
            "runs": len(runs),
            "makespan_s": makespan,
            "makespans_s": [r["makespan_s"] for r in runs],
            "gpu_busy_fraction": statistics.median(r["gpu_busy_fraction"] for r in runs),
            "gpu_slot_utilisation": statistics.median(r["gpu"]["utilisation"] for r in runs),
            "cpu_s": statistics.median(cpu) if cpu else None,
            "others_cpu_s": statistics.median(r["host_cpu_s"] - (r["cpu_s"] or 0.0) for r in runs) if cpu else None,
            "host_cpu_s": statistics.median(r["host_cpu_s"] for r in runs),
            "resolved": [r["resolved"] for r in runs],
            "episodes": runs[0]["episodes"],
            "span_totals_s": runs[len(runs) // 2]["span_totals_s"],
            "vs_bound": makespan / bound["bound_s"],
            "vs_loaded_bound": statistics.median(r["makespan_s"] / loaded_bound(r, bound) for r in runs),
        }
    naive = modes.get("naive", {}).get("makespan_s")
    for summary in modes.values():
        summary["naive_over_this"] = naive / summary["makespan_s"] if naive else None
    return modes


def dispatch_table(modes: dict[str, Any]) -> str:
    header = ["schedule", "makespan s", "each run s", "naive ÷ this", "GPU busy", "GPU slots used", "CPU s (ours)"]
    header += ["CPU s (rest of host)", "÷ bound", "÷ bound (host load)"]
    rows = []
    for mode, s in modes.items():
        others = "n/a" if s["others_cpu_s"] is None else f"{s['others_cpu_s']:.1f}"
        rows.append(
            [
                MODES[mode],
                f"{s['makespan_s']:.1f}",
                ", ".join(f"{x:.1f}" for x in s["makespans_s"]),
                f"{s['naive_over_this']:.2f}×" if s["naive_over_this"] else "n/a",
                f"{100 * s['gpu_busy_fraction']:.0f}%",
                f"{100 * s['gpu_slot_utilisation']:.0f}%",
                "n/a" if s["cpu_s"] is None else f"{s['cpu_s']:.1f}",
                others,
                f"{s['vs_bound']:.2f}×",
                f"{s['vs_loaded_bound']:.2f}×",
            ]
        )
    return render(header, rows, set(range(1, len(header))))


def bound_line(bound: dict[str, Any]) -> str:
    t = bound["terms_s"]
    cpu = "cgroup CPU" if bound["cpu_source"] == "cgroup" else "host busy CPU (includes other load)"
    episode = f"longest single episode {t['one episode']:.1f} s" if t["one episode"] else "no sequential run"
    return (
        f"lower bound {bound['bound_s']:.1f} s, set by {bound['binding']}: "
        f"GPU {bound['gpu_work_s']:.1f} s of work / {bound['gpu_slots']} slots = {t['GPU']:.1f} s; "
        f"CPU {bound['cpu_work_s']:.1f} s ({cpu}, least of all runs) / {bound['cores']} cores = {t['CPU']:.1f} s; "
        f"{episode}"
    )


def dispatch_targets(modes: dict[str, Any]) -> list[dict[str, Any]]:
    dispatcher = modes.get("dispatcher")
    if dispatcher is None:
        return []
    speedup, within = dispatcher["naive_over_this"], dispatcher["vs_bound"]
    return [
        {
            "target": "dispatcher makespan vs naive async batch",
            "limit": f"≥ {SPEEDUP_OVER_NAIVE:g}× faster",
            "value": None if speedup is None else f"{speedup:.2f}×",
            "met": None if speedup is None else speedup >= SPEEDUP_OVER_NAIVE,
        },
        {
            "target": "dispatcher makespan vs lower bound",
            "limit": f"≤ {WITHIN_BOUND:g}× bound",
            "value": f"{within:.2f}×",
            "met": within <= WITHIN_BOUND,
        },
    ]


def targets_table(targets: list[dict[str, Any]]) -> str:
    rows = [[t["target"], t["limit"], t["value"] or "n/a", _yes(t["met"])] for t in targets]
    return render(["target", "limit", "measured", "met"], rows, {2})


# --- Main -----------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="sandbox,dispatcher", help="comma-separated subset of sandbox,dispatcher")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each part (latency samples are pooled)")
    parser.add_argument("--quick", action="store_true", help="a few samples, 3 tasks × 1 sample, 1 repeat (smoke)")
    parser.add_argument("--skip-docker", action="store_true", help="no Docker subjects (the local backend still runs)")
    parser.add_argument("--backend", choices=("docker", "local", "process"), default="local", help="dispatcher part")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task in the dispatcher part")
    parser.add_argument("--schedules", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--tasks", type=int, default=0, help="the first N tasks of the suite only (0: all 21)")
    parser.add_argument("--gpu-slots", type=int, default=8, help="sequences the modelled GPU generates at once")
    parser.add_argument("--decode-ms", type=float, default=3.5, help="modelled ms per generated token per sequence")
    parser.add_argument("--prefill-ms", type=float, default=0.05, help="modelled ms per prompt token")
    parser.add_argument("--call-overhead-ms", type=float, default=20.0, help="modelled ms per LLM call")
    parser.add_argument("--jitter", type=float, default=0.2, help="sigma of the log-normal noise per call")
    parser.add_argument("--limits", help="dispatcher acquire,run,grade,prefetch (default: from cores and slots)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON report")
    args = parser.parse_args(argv)
    args.parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    if not args.parts or args.parts - {"sandbox", "dispatcher"}:
        parser.error("--parts takes sandbox and/or dispatcher")
    args.schedules = {name.strip() for name in args.schedules.split(",") if name.strip()}
    if not args.schedules or args.schedules - set(MODES):
        parser.error(f"--schedules takes a subset of {','.join(MODES)}")
    if args.skip_docker and args.backend == "docker" and "dispatcher" in args.parts:
        parser.error("--skip-docker with --backend docker: choose --backend local or process")
    if args.quick:
        args.repeats, args.samples, args.tasks = 1, 1, args.tasks or QUICK_TASKS
    args.cores = len(os.sched_getaffinity(0))
    # Sandbox starts and gradings are CPU work: one per core. The agent stage mostly waits for the GPU, with short
    # tool calls in between; a few more episodes than slots keep every slot busy while some run their tools.
    limits = (args.cores, args.gpu_slots + args.cores, args.cores, args.cores)
    args.limits = args.limits or ",".join(map(str, limits))
    args.gpu = f"{args.gpu_slots},{args.decode_ms},{args.prefill_ms},{args.call_overhead_ms},{args.jitter}"
    return args


def machine_info(args: argparse.Namespace, load_start: list[float]) -> dict[str, Any]:
    info = {**host_info(), "python": sys.version.split()[0], "loadavg_start": load_start}
    info["bwrap"] = _version(["bwrap", "--version"])
    try:
        info["docker_py"] = importlib.metadata.version("docker")
    except importlib.metadata.PackageNotFoundError:
        info["docker_py"] = None
    info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if not args.skip_docker:
        try:
            from skyrl_agent.sandbox.docker_backend import connect

            client = connect()
            info["docker"] = client.version().get("Version")
            client.close()
        except SandboxError as exc:
            info["docker"] = f"unavailable ({exc})"
    return info


def _version(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def print_machine(info: dict[str, Any]) -> None:
    print(f"machine: {info['cpu_count']} CPUs ({info['cpus_usable']} usable), {info['cpu_model']}, {info['platform']}")
    print(f"python {info['python']}; docker {info.get('docker', 'not used')}, docker-py {info['docker_py']}; ", end="")
    print(f"{info['bwrap'] or 'no bubblewrap'}")
    print(f"load average: start {info['loadavg_start']}, end {info['loadavg_end']}")


def sandbox_part(args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    names = ["local"] if args.skip_docker else ["docker", "plain", "local"]
    print(f"sandbox latencies ({', '.join(names)}), repeats: {args.repeats}", flush=True)
    results = asyncio.run(measure_sandboxes(names, run_id, args.repeats, args.quick))
    summarise_latencies(results)
    return results


def dispatcher_part(args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    cpu, reason = CpuAccounting.detect()
    if cpu is None:
        print(f"note: no cgroup CPU accounting ({reason}); CPU work is the host's busy time", file=sys.stderr)
    episodes = len(load_suite()[: args.tasks or None]) * args.samples
    print(f"dispatcher: {episodes} episodes on the {args.backend} backend, GPU {args.gpu}, limits {args.limits}")
    reports = measure_dispatch(args, run_id, cpu)
    bound = lower_bound(reports, args.gpu_slots, args.cores)
    modes = summarise_dispatch(reports, bound)
    return {"backend": args.backend, "episodes": episodes, "gpu": args.gpu, "limits": args.limits, "bound": bound,
            "modes": modes, "reports": reports}  # fmt: skip


def cleanup(args: argparse.Namespace, run_id: str) -> dict[str, Any] | None:
    """Remove and report whatever this run left in Docker; None when Docker was not used."""
    if args.skip_docker:
        return None
    try:
        return leftovers(run_id, remove=True)
    except SandboxError as exc:
        return {"containers": [], "images": [], "removed": [], "error": str(exc)}


def print_report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    print()
    print_machine(result["machine"])
    if args.quick:
        print("QUICK RUN: a smoke test with a few samples; the numbers below measure nothing")
    if "sandbox" in result:
        print(f"\nSandbox latencies (ms; samples of {args.repeats} repeat(s) pooled)\n")
        print(latency_table(result["sandbox"]))
        for name, r in result["sandbox"].items():
            for op, error in ({"create": r["error"]} if r["error"] else r.get("op_errors", {})).items():
                print(f"  {name} {op}: {error}")
    if "dispatcher" in result:
        d = result["dispatcher"]
        print(f"\nDispatcher: {d['episodes']} episodes on the {BACKENDS[args.backend]}")
        print(f"modelled GPU (slots,decode_ms,prefill_ms,overhead_ms,jitter) {d['gpu']}; stage limits", end=" ")
        print(f"(acquire,run,grade,prefetch) {d['limits']}; medians of the runs\n")
        print(dispatch_table(d["modes"]))
        print(bound_line(d["bound"]))
    print("\nTargets\n")
    print(targets_table(result["targets"]))
    if result["cleanup"] is not None:
        c = result["cleanup"]
        print(f"\ncleanup: {len(c['removed'])} removed at the end; left: {len(c['containers'])} containers, "
              f"{len(c['images'])} images")  # fmt: skip


def failures(result: dict[str, Any]) -> list[str]:
    """What makes the run fail (exit 1): leftovers, unresolved episodes."""
    problems = []
    c = result["cleanup"]
    if c is not None and (c["containers"] or c["images"] or c.get("error")):
        problems.append(f"Docker resources left behind: {c}")
    for mode, s in result.get("dispatcher", {}).get("modes", {}).items():
        if any(resolved != s["episodes"] for resolved in s["resolved"]):
            problems.append(f"{mode}: not every episode was resolved ({s['resolved']} of {s['episodes']})")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_id = f"agent-bench-{reaper.default_run_id()}"
    if not args.skip_docker:
        reaper.install_reaper(run_id)  # this process's containers go at exit and on SIGTERM/SIGINT, too
    load_start = [round(x, 2) for x in os.getloadavg()]
    started = datetime.datetime.now(datetime.UTC)
    result: dict[str, Any] = {"benchmark": "agent_bench", "started_utc": started.isoformat(timespec="seconds")}
    result.update(command=" ".join([Path(sys.executable).name, *sys.argv]), quick=args.quick, repeats=args.repeats)
    result["targets"] = []
    if "sandbox" in args.parts:
        result["sandbox"] = sandbox_part(args, run_id)
        result["targets"] += latency_targets(result["sandbox"])
    if "dispatcher" in args.parts:
        result["dispatcher"] = dispatcher_part(args, run_id)
        result["targets"] += dispatch_targets(result["dispatcher"]["modes"])
    result["cleanup"] = cleanup(args, run_id)
    result["machine"] = machine_info(args, load_start)
    print_report(args, result)
    problems = failures(result)
    for problem in problems:
        print(f"\n!!! {problem}", file=sys.stderr)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
