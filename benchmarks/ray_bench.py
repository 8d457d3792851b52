"""The quickstart's GRPO step through Ray (a one-rank FSDP2 worker group) against the in-process backend, side by side.

    .venv/bin/python benchmarks/ray_bench.py            # 1 warm-up + 6 timed steps per side, then the components
    .venv/bin/python benchmarks/ray_bench.py --quick    # smoke run: 4 prompts × 2 samples, 1 + 1 steps

Workload (both sides): the GRPO phase of ``make quickstart`` (``skyrl_train.quickstart.rl_config``: 32 prompts × 8
samples × at most 12 new tokens, temperature 1, PPO clip, zero-variance groups masked, one optimizer step per step),
run by the run's own outer loop (``skyrl_train.run._Session.train``, what ``skyrl_train.run.run`` calls). Changes to
the quickstart, on both sides: the policy is the untrained tiny model (``build_tiny_model(seed=0)``, fp32, not the
SFT warm start: the step's work is the same, its answers are longer), no evaluation, and the jsonl logger only.

Sides:

- in-process: ``trainer.backend=torch``; policy, local engine and trainer share one process and one compute thread.
- Ray: ``trainer.backend=fsdp trainer.num_training_workers=1 trainer.num_cpus_per_worker=C`` (``C`` = ``--cpus``,
  default every usable CPU, so the rank's torch gets as many threads as the in-process backend: Ray sets an actor's
  ``OMP_NUM_THREADS`` to its CPUs). The engine stays in the driver (``inference.num_engines=1`` keeps it there),
  so this side is 1 worker actor + 1 in-process engine; the engine behind an actor is measured in the components.

Ray: a head node of the benchmark's own (``PrivateCluster``: free ports, its own auth token), joined by the run
through ``RAY_ADDRESS`` as a run joins any cluster. Its workers run at ``--ray-niceness`` (default 0; Ray's own
default is 15, which on a shared machine hands the actor's CPU to every other process and measures the neighbours,
not Ray).

Schedule: the two runs are worker processes (``benchmarks/_ray_bench_worker.py``) driven in lockstep: one step of
one, one of the other, the order alternating per round, each waiting on stdin while the other computes. A step's
time is the run's own ``timing/step_s`` (generate + prepare + update + weight sync, as logged to ``metrics.jsonl``);
its CPU time is that of every process involved (the worker; on the Ray side also the head's GCS, raylet and the
worker actor), read from ``/proc``, which a shared machine's load moves much less than wall time. Every ratio is
Ray / in-process, the median over timed rounds of the two values of a round (target for the step: ≤ 1.15×,
reported, not asserted).

Weight sync per MB: ``timing/weight_sync_s`` divided by the model's parameter bytes (``model.safetensors``, tied
weights once; MB = 10⁶ bytes). On the Ray side it is the run's own sync: rank 0 gathers the full tensors and
broadcasts them over a gloo group to the driver's engine, which loads them (``skyrl_train.inference.broadcast_sync``).

Components (a third worker, after the runs; the head has ``2 × C`` CPUs so a rank and an engine actor each get
``C`` threads): weight syncs from each policy (in-process ``TorchBackend``, one-rank ``FSDPBackend``) into each
engine (``LocalEngine`` sharing the in-process backend's compute thread, as in a run; ``EngineGroup`` with one
engine actor). "Via driver" is ``sync_weights(policy.get_weights(), engine)``: from the rank to the driver and (for
the actor) on through Ray's object store. "By broadcast" is rank 0 straight to the engine actor. The five paths
alternate per round. Then one step's generation (the step's 256 prompts × 12 tokens) runs through the local engine
and through the engine actor, alternating.

Output: the table on stdout and ``benchmarks/results/ray_bench.json``. The machine is shared: load averages at the
start, per round and at the end are recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from _machine import host_info

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "benchmarks" / "_ray_bench_worker.py"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "ray_bench.json"
TARGET_RATIO = 1.15  # Ray / in-process median step time
MB = 1e6


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_env(python: Path, niceness: int) -> dict[str, str]:
    """The environment of a worker: the venv's interpreter first, nothing that changes imports or thread counts.

    ``niceness``: of the Ray worker processes (Ray's default is 15, below every other process of the machine).
    """
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "OMP_NUM_THREADS", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONHASHSEED"] = "0"
    env["RAY_worker_niceness"] = str(niceness)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def prepare_workload(work: Path) -> tuple[Path, Path]:
    """The tiny model directory and the quickstart's training prompts."""
    from skyrl_train.models.tiny import build_tiny_model
    from skyrl_train.quickstart import make_problems, write_rows

    model = build_tiny_model(work / "model", seed=0)
    train, _ = make_problems(0, 200)
    return Path(model), write_rows(train, work / "train.jsonl")


def parameter_bytes(model: Path) -> int:
    """Bytes of the parameters stored in ``model.safetensors`` (what a weight sync moves; tied weights once)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(model / "model.safetensors"), framework="pt") as file:
        for name in file.keys():  # noqa: SIM118 (safe_open is not a mapping)
            tensor = file.get_slice(name)
            count = 1
            for size in tensor.get_shape():
                count *= size
            total += count * _DTYPE_BYTES[tensor.get_dtype()]
    return total


_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1}


class PrivateCluster:
    """A Ray head node of this benchmark's own, on free ports, that the workers join through ``RAY_ADDRESS``.

    Why: a local cluster started by ``ray.init()`` binds Ray's default ports (dashboard agent, metrics); when a second
    local cluster starts on the same machine (a concurrent run or test), one of them loses its agent and its raylet
    dies with it, taking the run down. This head binds ports nobody else holds, and has an auth token of its own. It
    runs ``ray start --head --block`` in a session of its own and is stopped through that process group (its pid).
    """

    PORT_FLAGS = (
        "--port",
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
        "--ray-client-server-port",
    )

    def __init__(self, python: Path, cpus: int, env: dict[str, str]) -> None:
        self.python, self.cpus = python, cpus
        # The head and every driver read the token from the environment. No drain wait on SIGTERM: Ray would wait
        # 30 s for work to move off the node, and this node has none left when it is stopped.
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
        self.pid = 0  # of `ray start`, the root of the head's processes (GCS, raylet and the workers it starts)

    @contextlib.contextmanager
    def started(self, log: Path) -> Iterator[dict[str, str]]:
        """Start the head; yield the environment a driver joins it with; stop the head on the way out."""
        ports = free_ports(len(self.PORT_FLAGS))
        command = [str(self.python.parent / "ray"), "start", "--head", "--block"]
        command += [f"{flag}={port}" for flag, port in zip(self.PORT_FLAGS, ports, strict=True)]
        command += [f"--num-cpus={self.cpus}", "--include-dashboard=false", "--disable-usage-stats"]
        print(f"starting a Ray head on port {ports[0]} ({self.cpus} CPUs) ...", flush=True)
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=self.env, stdout=out, stderr=out, start_new_session=True)
        self.pid = process.pid
        try:
            deadline = time.monotonic() + 120
            while "--block" not in log.read_text(errors="replace"):  # printed once the node is up
                if process.poll() is not None or time.monotonic() > deadline:
                    raise WorkerError(f"the Ray head did not start:\n{log.read_text(errors='replace')[-3000:]}")
                time.sleep(0.5)
            yield {**self.env, "RAY_ADDRESS": f"127.0.0.1:{ports[0]}"}
        finally:
            stop_group(process)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``process``'s process group (ray start, GCS, raylet, agents); SIGKILL to what is left at 30 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + 30
        while live_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not live_members(process.pid):
            break
    process.wait()


def tree_cpu_seconds(roots: Sequence[int]) -> float:
    """CPU seconds (user + system, reaped children included) of the processes ``roots`` and their descendants."""
    stats: dict[int, tuple[int, int]] = {}  # pid → (parent pid, clock ticks)
    for path in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            fields = path.read_text().rsplit(")", 1)[1].split()  # state, ppid, …; utime stime cutime cstime at 11–14
            stats[int(path.parent.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    ticks, todo, seen = 0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        ticks += stats[pid][1]
        todo += children.get(pid, [])
    return ticks / os.sysconf("SC_CLK_TCK")


def live_members(group: int) -> list[int]:
    """Pids of the processes of process group ``group`` that are still running (not zombies), from ``/proc``."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
            if int(fields[2]) == group and fields[0] != "Z":
                pids.append(int(stat.parent.name))
    return pids


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on this machine right now (held open together while they are picked)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


# --- workers ------------------------------------------------------------------------------------------------------


class WorkerError(RuntimeError):
    """A worker exited before the protocol said it would; the message ends with its stderr."""


class Worker:
    """One ``_ray_bench_worker.py`` process, driven step by step (its module docstring: the protocol)."""

    def __init__(self, name: str, python: Path, env: dict[str, str], argv: list[str], scratch: Path) -> None:
        self.name, self.python, self.env, self.argv, self.scratch = name, python, env, argv, scratch
        self.steps: list[dict[str, Any]] = []
        self.report: dict[str, Any] | None = None
        self._stderr = scratch / f"{name}.stderr"
        self._process: subprocess.Popen[str] | None = None

    def start(self, wait_ready: bool = True) -> None:
        print(f"starting {self.name} ...", flush=True)
        with self._stderr.open("w") as stderr:
            self._process = subprocess.Popen(
                [str(self.python), "-s", str(WORKER), *self.argv],
                cwd=self.scratch,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                bufsize=1,
            )
        if wait_ready:
            self._read("@ready")

    @property
    def pid(self) -> int:
        return self._running().pid

    def step(self, cpu_roots: Sequence[int] = ()) -> dict[str, Any]:
        """One step; returns once the worker waits again (or has reported), so nothing of it overlaps the next.

        The record gets ``cpu_s``: CPU seconds of this worker and of ``cpu_roots``' process trees meanwhile.
        """
        process = self._running()
        roots = [process.pid, *cpu_roots]
        cpu = tree_cpu_seconds(roots)
        assert process.stdin is not None
        try:
            process.stdin.write("go\n")
            process.stdin.flush()
        except BrokenPipeError:
            self._died("@step")
        record: dict[str, Any] = json.loads(self._read("@step")[1])
        record["cpu_s"] = tree_cpu_seconds(roots) - cpu
        self.steps.append(record)
        marker, payload = self._read("@ready", "@report")
        if marker == "@report":
            self._finish(payload)
        return record

    def wait_report(self) -> dict[str, Any]:
        self._finish(self._read("@report")[1])
        assert self.report is not None
        return self.report

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def _finish(self, payload: str) -> None:
        self.report = json.loads(payload)
        self._running().wait()

    def _running(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._process

    def _read(self, *markers: str) -> tuple[str, str]:
        process = self._running()
        assert process.stdout is not None
        for line in process.stdout:
            for marker in markers:
                if line.startswith(marker):
                    return marker, line[len(marker) :].strip()
        self._died(*markers)

    def _died(self, *markers: str) -> NoReturn:
        process = self._running()
        process.wait()
        tail = self._stderr.read_text()[-4000:] if self._stderr.exists() else ""
        raise WorkerError(f"{self.name} exited (status {process.returncode}) before {'/'.join(markers)}:\n{tail}")


def common_argv(args: argparse.Namespace, model: Path, data: Path, run_dir: Path) -> list[str]:
    argv = ["--model", str(model), "--train-data", str(data), "--run-dir", str(run_dir)]
    argv += ["--prompts", str(args.prompts), "--samples", str(args.samples), "--warmup", str(args.warmup)]
    return [*argv, "--steps", str(args.steps), "--repeats", str(args.repeats), "--cpus-per-worker", str(args.cpus)]


def measure_runs(
    args: argparse.Namespace, env: dict[str, str], head: int, model: Path, data: Path, scratch: Path
) -> tuple[dict[str, Any], dict[str, Any], list[list[float]]]:
    """Both runs in lockstep, the order alternating per round: their reports and the load averages per round.

    CPU time per step: the in-process worker's; the Ray side's worker and every process of the Ray head ``head``
    (GCS, raylet, the worker actor).
    """
    sides = []
    for name, backend in (("in-process", "torch"), ("ray", "fsdp")):
        argv = [*common_argv(args, model, data, scratch / name), "--task", "run", "--backend", backend]
        sides.append(Worker(name, args.python, env, argv, scratch))
    loads = []
    try:
        for side in sides:
            side.start()
        for index in range(args.warmup + args.steps):
            for side in sides if index % 2 == 0 else sides[::-1]:
                record = side.step([head] if side.name == "ray" else [])
                print(f"  round {index + 1}/{args.warmup + args.steps} {side.name}: {record['timing/step_s']:.2f} s")
            loads.append([round(x, 2) for x in os.getloadavg()])
    finally:
        for side in sides:
            side.close()
    reports = []
    for side in sides:
        if side.report is None:
            raise WorkerError(f"{side.name} did not report after its last step")
        side.report["steps"] = side.steps  # the worker's records with the CPU seconds measured here
        side.report["median_cpu_s"] = statistics.median(r["cpu_s"] for r in side.steps[args.warmup :])
        reports.append(side.report)
    return reports[0], reports[1], loads


def measure_components(
    args: argparse.Namespace, env: dict[str, str], model: Path, data: Path, scratch: Path
) -> dict[str, Any]:
    argv = [*common_argv(args, model, data, scratch), "--task", "components"]
    worker = Worker("components", args.python, env, argv, scratch)
    try:
        worker.start(wait_ready=False)
        return worker.wait_report()
    finally:
        worker.close()


# --- report -------------------------------------------------------------------------------------------------------


def paired(local: Sequence[float], ray: Sequence[float]) -> float:
    """Median over rounds of Ray / in-process (one value of each side per round, measured back to back)."""
    return statistics.median(r / l_ for l_, r in zip(local, ray, strict=True))


def timed_steps(side: dict[str, Any], key: str, warmup: int) -> list[float]:
    return [float(record[key]) for record in side["steps"][warmup:]]


def _row(label: str, unit: str, local: Sequence[float], ray: Sequence[float], scale: float = 1.0) -> dict[str, Any]:
    """A table row: the medians of both sides (times ``scale``) and the paired ratio."""
    return {
        "label": label,
        "unit": unit,
        "in_process": statistics.median(local) * scale,
        "ray": statistics.median(ray) * scale,
        "ratio": paired(local, ray),
        "target": "",
        "target_met": None,
    }


def build_rows(
    local: dict[str, Any], ray: dict[str, Any], parts: dict[str, Any], nbytes: int, warmup: int
) -> list[dict[str, Any]]:
    """Table rows; every ratio is Ray / in-process, the median over rounds of the two sides' values in a round."""

    def steps(key: str) -> tuple[list[float], list[float]]:
        return timed_steps(local, key, warmup), timed_steps(ray, key, warmup)

    step = _row("GRPO step (quickstart)", "s/step (median)", *steps("timing/step_s"))
    step.update(target=f"≤{TARGET_RATIO}×", target_met=step["ratio"] <= TARGET_RATIO)
    rows = [step, _row("  CPU time of the step (all processes)", "CPU s (median)", *steps("cpu_s"))]
    for key in ("generate", "update", "weight_sync"):
        rows.append(_row(f"  {key.replace('_', ' ')}", "s (median)", *steps(f"timing/{key}_s")))
    per_mb = 1000 / (nbytes / MB)  # seconds → ms per MB
    rows.append(_row("weight sync per MB (in the run)", "ms/MB", *steps("timing/weight_sync_s"), scale=per_mb))
    sync = parts["sync_s"]
    rows += [
        _row("sync → local engine, via driver", "ms/MB", sync["torch_to_local"], sync["fsdp_to_local"], per_mb),
        _row("sync → engine actor, via driver", "ms/MB", sync["torch_to_actor"], sync["fsdp_to_actor"], per_mb),
        _row(
            "sync → engine actor, by broadcast",
            "ms/MB",
            sync["torch_to_actor"],
            sync["fsdp_broadcast_to_actor"],
            per_mb,
        ),
    ]
    rates = parts["generation_tokens_per_s"]
    rows.append(_row("step generation: local engine vs actor", "tokens/s", rates["local"], rates["actor"]))
    return rows


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["row", "unit", "in-process", "Ray", "Ray/in-process", "target", "met"]
    lines = [header]
    for row in rows:
        met = {None: "", True: "yes", False: "NO"}[row["target_met"]]
        ratio = f"{row['ratio']:.2f}×" if row["ratio"] is not None else "—"
        lines.append([row["label"], row["unit"], _num(row["in_process"]), _num(row["ray"]), ratio, row["target"], met])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        aligned = (
            c.rjust(w) if i in (2, 3, 4) else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return " | ".join(aligned)

    return "\n".join([fmt(header), "-|-".join("-" * w for w in widths), *(fmt(line) for line in lines[1:])])


def notes(local: dict[str, Any], ray: dict[str, Any], parts: dict[str, Any], nbytes: int, warmup: int) -> str:
    wall = timed_steps(local, "timing/step_s", warmup), timed_steps(ray, "timing/step_s", warmup)
    ratios = [r / l_ for l_, r in zip(*wall, strict=True)]
    tokens = [r["response_tokens"] for side in (local, ray) for r in side["steps"] if r.get("response_tokens")]
    of_medians = statistics.median(wall[1]) / statistics.median(wall[0])
    return "\n".join(
        [
            f"Ray/in-process step time per round: {', '.join(f'{r:.2f}' for r in ratios)}; ratio of the medians "
            f"{of_medians:.2f}×",
            f"set-up (tokenizer, data, models, actors): in-process {local['setup_s']:.1f} s, Ray "
            f"{ray['setup_s']:.1f} s; components {parts['setup_s']:.1f} s",
            f"model parameters: {nbytes / MB:.2f} MB; mean generated tokens per completion "
            f"{statistics.mean(tokens):.1f}; driver torch threads: in-process {local['torch_threads']}, Ray "
            f"{ray['torch_threads']}",
        ]
    )


# --- main ---------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per side (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (and untimed syncs/generates)")
    parser.add_argument("--repeats", type=int, default=5, help="timed syncs and generate calls per component row")
    parser.add_argument("--cpus", type=float, default=float(usable_cpus()), help="Ray CPUs of the rank (and engine)")
    parser.add_argument("--ray-niceness", type=int, default=0, help="of Ray's workers (Ray's default: 15)")
    parser.add_argument("--quick", action="store_true", help="4 prompts × 2 samples, 1 + 1 steps, 2 repeats (smoke)")
    parser.add_argument("--python", type=Path, default=Path(sys.executable), help="a venv with skyrl_train and ray")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    args.prompts, args.samples = 32, 8
    if args.quick:
        args.prompts, args.samples, args.steps, args.warmup, args.repeats = 4, 2, 1, 1, 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="ray-bench-") as tmp:
        model, data = prepare_workload(Path(tmp))
        nbytes = parameter_bytes(model)
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        head = PrivateCluster(args.python, math.ceil(2 * args.cpus), worker_env(args.python, args.ray_niceness))
        with head.started(scratch / "ray-head.log") as env:
            local, ray, loads = measure_runs(args, env, head.pid, model, data, scratch)
            parts = measure_components(args, env, model, data, scratch)
    info = {**host_info(), "loadavg_start": loadavg_start, "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
    info["loadavg_per_round"] = loads
    rows = build_rows(local, ray, parts, nbytes, args.warmup)

    print(f"\nmachine: {info['cpu_count']} CPUs ({info['cpus_usable']} usable), {info['cpu_model']}")
    print(f"load average: start {info['loadavg_start']}, end {info['loadavg_end']}")
    print(
        f"{args.prompts} prompts × {args.samples} samples per step; {args.steps} timed steps after {args.warmup} "
        f"warm-up per side, alternating step by step; components: {args.repeats} timed calls; Ray rank/engine CPUs "
        f"{args.cpus:g}\n"
    )
    print(table(rows))
    print()
    print(notes(local, ray, parts, nbytes, args.warmup))
    result = {
        "benchmark": "ray_bench",
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "cpus_per_worker": args.cpus,
        "ray_worker_niceness": args.ray_niceness,
        "schedule": "lockstep: one step of each side per round, order alternating per round",
        "workload": {
            "config": "skyrl_train.quickstart.rl_config, no evaluation, jsonl logger",
            "model": "build_tiny_model(seed=0), fp32 (not the SFT warm start)",
            "prompts": args.prompts,
            "samples_per_prompt": args.samples,
            "max_new_tokens": 12,
            "parameter_bytes": nbytes,
        },
        "target_ratio": TARGET_RATIO,
        "machine": info,
        "rows": rows,
        "in_process": local,
        "ray": ray,
        "components": parts,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
