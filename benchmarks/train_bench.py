"""Side-by-side GRPO step time of skyrl-train and TRL's ``GRPOTrainer`` on the same tiny workload, plus engine rows.

    .venv/bin/python benchmarks/train_bench.py                      # all rows, 10 timed steps per side
    .venv/bin/python benchmarks/train_bench.py --quick --skip-trl   # smoke run, ours only

Workload (both sides): the deterministic tiny Qwen2 model (``build_tiny_model(seed=0)``, ≈3 M parameters, fp32)
saved once to a directory both read; 16 addition prompts (the quickstart's, chat template applied) × 4 samples ×
at most 64 new tokens at temperature 1; the gsm8k rule reward (``#### N`` exact match; the TRL worker carries a
copy of skyrl-gym's function); one optimizer step per training step, no KL term, lr 1e-6. Neither side forces a
minimum length: generation stops at EOS or 64 tokens, and the mean completion length of each side is reported so
the work can be compared (the untrained model rarely samples EOS).

Schedule: both sides run at once as worker processes (``benchmarks/_train_bench_worker.py``) driven in lockstep:
one step of ours, one of TRL's, the order alternating per round (ours TRL, TRL ours, …), each worker waiting on
its stdin while the other computes. A shared machine's load then hits both sides alike, and the per-round ratio is
reported next to the ratio of medians. ``--warmup`` untimed rounds come first, then ``--steps`` timed ones; the
table shows medians of wall time, and the process CPU time per step is recorded as well.

TRL is installed from PyPI into its own venv (``.cache/bench/trl-venv`` by default, reused when complete) with
``constraints/cpu.txt`` (torch 2.13.0 CPU, transformers < 5.20), then torchvision/torchaudio/torchcodec are removed
(they break the CPU torch). Every worker is a fresh interpreter of the venv under test in a scratch directory, with
no ``PYTHONPATH`` and ``-s``.

Rows:

- GRPO step (16×4×64): median wall time of ``trainer.train_step`` (ours, built through ``skyrl_train.run._Session``
  as the CLI does) and of one ``GRPOTrainer`` optimizer step (TRL, timed by a callback); ratio ours / TRL: the
  median over rounds of the two steps' ratio (target ≤ 0.5, reported, not asserted); the ratio of the medians is
  recorded too.
- Generation inside the step: generated tokens / generation seconds, both sides.
- Local engine vs vLLM engine (ours): one ``generate`` of 64 sequences × 64 tokens (the step's prompts) per round,
  tokens/s, the two engines in lockstep like the training steps (``--repeats`` timed rounds); vLLM is the
  in-process CPU engine (row skipped with a note when vLLM is unavailable or fails).
- Weight sync: ``sync_weights`` of a policy backend into the local engine and into vLLM (``direct`` transport),
  after each generate call.

Output: the table on stdout and ``benchmarks/results/train_bench.json`` (every step's record included). The machine
is shared: load averages at start, per training round and at the end are recorded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _machine import host_info

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "benchmarks" / "_train_bench_worker.py"
CONSTRAINTS = REPO / "constraints" / "cpu.txt"
DEFAULT_TRL_VENV = REPO / ".cache" / "bench" / "trl-venv"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "train_bench.json"
TRL_PROBE = "import importlib.metadata as m, trl, torch, transformers, datasets; print(m.version('trl'))"
TARGET_RATIO = 0.5  # ours / TRL median step time


# --- environments -------------------------------------------------------------------------------------------------


def worker_env(python: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONHASHSEED"] = "0"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _trl_version(python: Path) -> str | None:
    with tempfile.TemporaryDirectory(prefix="train-bench-cwd-") as cwd:
        done = subprocess.run(
            [str(python), "-s", "-c", TRL_PROBE], cwd=cwd, env=worker_env(python), capture_output=True, text=True
        )
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_trl_venv(venv: Path, spec: str) -> tuple[Path, str]:
    """The TRL venv's interpreter and TRL version; creates the venv and installs TRL into it if needed."""
    python = venv / "bin" / "python"
    if python.exists() and (version := _trl_version(python)):
        return python, version
    print(f"installing {spec} into {venv} ...", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="train-bench-cwd-") as cwd:
        env = worker_env(python)
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(CONSTRAINTS), spec],
            [str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
        ]
        for step in steps:
            done = subprocess.run(step, cwd=cwd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(
                    f"could not set up TRL ({' '.join(step)}):\n{done.stderr[-4000:]}\n"
                    "Without access to PyPI, run with --skip-trl."
                )
    version = _trl_version(python)
    if version is None:
        raise SystemExit(f"{venv}: trl does not import after installing")
    return python, version


def prepare_workload(work: Path, prompts: int) -> tuple[Path, Path]:
    """The tiny model directory and the prompt file (our dataset format; the TRL worker converts it)."""
    from skyrl_train.models.tiny import build_tiny_model
    from skyrl_train.quickstart import make_problems, write_rows

    model = build_tiny_model(work / "model", seed=0)
    train, _ = make_problems(0, 200)
    data = write_rows(train[:prompts], work / "prompts.jsonl")
    return Path(model), data


class WorkerError(RuntimeError):
    """A worker exited before the protocol said it would; the message ends with its stderr."""

    def __init__(self, worker: str, message: str) -> None:
        super().__init__(message)
        self.worker = worker


class Worker:
    """One worker process (``_train_bench_worker.py``) driven step by step (its module docstring: the protocol)."""

    def __init__(self, name: str, python: Path, argv: list[str], scratch: Path) -> None:
        self.name, self.python, self.argv, self.scratch = name, python, argv, scratch
        self.steps: list[dict[str, Any]] = []
        self.report: dict[str, Any] | None = None
        self._process: subprocess.Popen[str] | None = None
        self._stderr_path = scratch / f"{name}.stderr"

    def start(self) -> None:
        """Start the process and wait until it is set up (its first ``@ready``)."""
        print(f"starting {self.name} ...", flush=True)
        command = [str(self.python), "-s", str(WORKER), *self.argv, "--run-dir", str(self.scratch / f"{self.name}-run")]
        stderr = self._stderr_path.open("w")
        self._process = subprocess.Popen(
            command,
            cwd=self.scratch,
            env=worker_env(self.python),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            bufsize=1,
        )
        stderr.close()
        self._read_until("@ready")

    def step(self) -> dict[str, Any]:
        """Run one step; return once the worker waits again (or has reported), so nothing of it overlaps the next."""
        stdin = self._running().stdin
        assert stdin is not None
        stdin.write("go\n")
        stdin.flush()
        record: dict[str, Any] = json.loads(self._read_until("@step"))
        self.steps.append(record)
        kind, payload = self._read_either("@ready", "@report")
        if kind == "@report":
            self.report = json.loads(payload)
            self._running().wait()
        return record

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def _running(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._process

    def _read_until(self, marker: str) -> str:
        return self._read_either(marker)[1]

    def _read_either(self, *markers: str) -> tuple[str, str]:
        process = self._running()
        assert process.stdout is not None
        for line in process.stdout:
            for marker in markers:
                if line.startswith(marker):
                    return marker, line[len(marker) :].strip()
        process.wait()
        tail = self._stderr_path.read_text()[-4000:] if self._stderr_path.exists() else ""
        status = process.returncode
        raise WorkerError(self.name, f"{self.name} exited (status {status}) before {'/'.join(markers)}:\n{tail}")


def alternate(workers: list[Worker], rounds: int, describe: Callable[[dict[str, Any]], str]) -> list[list[float]]:
    """Run ``rounds`` steps of each started worker, alternating their order per round (A B, B A, A B, …).

    Only one worker computes at any time; the others wait on stdin. Returns the load averages seen per round.
    """
    loads = []
    for index in range(rounds):
        for worker in workers if index % 2 == 0 else workers[::-1]:
            record = worker.step()
            print(f"  round {index + 1}/{rounds} {worker.name}: {describe(record)}", flush=True)
        loads.append([round(x, 2) for x in os.getloadavg()])
    return loads


def worker_argv(impl: str, task: str, args: argparse.Namespace, model: Path, data: Path, steps: int) -> list[str]:
    argv = ["--impl", impl, "--task", task, "--model", str(model), "--data", str(data), "--prompts", str(args.prompts)]
    argv += ["--samples", str(args.samples), "--max-new-tokens", str(args.max_new_tokens)]
    return [*argv, "--steps", str(steps), "--warmup", str(args.warmup)]


def measure_training(
    args: argparse.Namespace, trl_python: Path | None, model: Path, data: Path, scratch: Path
) -> tuple[dict[str, Any], dict[str, Any] | None, list[list[float]]]:
    """Our step and TRL's in lockstep: their reports and the load averages per round."""
    ours = Worker("ours", args.ours_python, worker_argv("ours", "train", args, model, data, args.steps), scratch)
    workers = [ours]
    if trl_python is not None:
        workers.append(Worker("trl", trl_python, worker_argv("trl", "train", args, model, data, args.steps), scratch))
    try:
        for worker in workers:
            worker.start()
        loads = alternate(workers, args.warmup + args.steps, lambda r: f"{r['wall_s']:.2f} s")
    finally:
        for worker in workers:
            worker.close()
    for worker in workers:
        if worker.report is None:
            raise WorkerError(worker.name, f"{worker.name} did not report after its last step")
    assert ours.report is not None
    return ours.report, workers[1].report if len(workers) > 1 else None, loads


def measure_engines(args: argparse.Namespace, model: Path, data: Path, scratch: Path) -> dict[str, Any]:
    """The local engine and the vLLM engine on the same prompts, in lockstep (vLLM skipped with a note on failure)."""
    engines: dict[str, Any] = {"vllm": None}

    def worker(engine: str) -> Worker:
        argv = [*worker_argv("ours", "engine", args, model, data, args.repeats), "--engine", engine]
        return Worker(f"engine-{engine}", args.ours_python, argv, scratch)

    def rate(record: dict[str, Any]) -> str:
        return f"{record['tokens'] / record['wall_s']:,.0f} tokens/s, sync {record['sync_s'] * 1000:.0f} ms"

    local, vllm = worker("local"), worker("vllm")
    try:
        local.start()
        try:
            vllm.start()
        except WorkerError as exc:
            engines["vllm_note"] = f"vLLM engine failed to start: {_last_line(exc)}"
            vllm.close()
            workers = [local]
        else:
            workers = [local, vllm]
        try:
            alternate(workers, args.warmup + args.repeats, rate)
        except WorkerError as exc:
            if exc.worker != vllm.name:
                raise
            engines["vllm_note"] = f"vLLM engine failed: {_last_line(exc)}"  # the local engine's rows still count
            vllm.close()
            alternate([local], args.warmup + args.repeats - len(local.steps), rate)
    finally:
        local.close()
        vllm.close()
    engines["local"] = local.report
    engines["vllm"] = vllm.report
    return engines


def _last_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1][:200] if lines else type(exc).__name__


# --- report -------------------------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}f}"


def build_rows(ours: dict[str, Any], trl: dict[str, Any] | None, engines: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    # The steps ran in lockstep, so a round's two steps saw about the same load: the median of the per-round ratios
    # is the ratio reported (a load burst during a few steps of one side moves the ratio of medians much more).
    ratio = statistics.median(paired_ratios(ours, trl)) if trl else None
    rows["grpo_step"] = {
        "label": "GRPO step (16 prompts × 4 × 64 tok)",
        "unit": "s/step (median)",
        "ours": ours["median_step_s"],
        "trl": trl["median_step_s"] if trl else None,
        "ratio": ratio,
        "target": f"≤{TARGET_RATIO}×",
        "target_met": None if ratio is None else ratio <= TARGET_RATIO,
        "ratio_basis": "median over rounds of ours/TRL (each round: one step of each side, back to back)",
        "ratio_of_medians": ours["median_step_s"] / trl["median_step_s"] if trl else None,
        "cpu_s_ours": ours["median_cpu_s"],
        "cpu_s_trl": trl["median_cpu_s"] if trl else None,
    }
    trl_gen = trl.get("gen_tokens_per_s") if trl else None
    rows["step_generation"] = {
        "label": "generation inside the step",
        "unit": "tokens/s",
        "ours": ours["gen_tokens_per_s"],
        "trl": trl_gen,
        "ratio": ours["gen_tokens_per_s"] / trl_gen if trl_gen else None,
        "target": "",
        "target_met": None,
    }
    rows["completion_length"] = {
        "label": "mean completion length",
        "unit": "tokens",
        "ours": ours["mean_completion_tokens"],
        "trl": trl["mean_completion_tokens"] if trl else None,
        "ratio": None,
        "target": "",
        "target_met": None,
    }
    local, vllm = engines["local"], engines.get("vllm")
    rows["engine_local"] = {
        "label": "local engine, 64 seq × 64 tok",
        "unit": "tokens/s",
        "ours": local["gen_tokens_per_s"],
        "trl": None,
        "ratio": None,
        "target": "",
        "target_met": None,
    }
    rows["engine_vllm"] = {
        "label": "vLLM engine (in-process CPU), same",
        "unit": "tokens/s",
        "ours": vllm["gen_tokens_per_s"] if vllm else None,
        "trl": None,
        "ratio": None,
        "target": "",
        "target_met": None,
        "note": None if vllm else engines.get("vllm_note", "vLLM unavailable"),
    }
    rows["sync_local"] = {
        "label": "weight sync → local engine",
        "unit": "ms",
        "ours": local["weight_sync_s"] * 1000,
        "trl": None,
        "ratio": None,
        "target": "",
        "target_met": None,
    }
    rows["sync_vllm"] = {
        "label": "weight sync → vLLM (direct)",
        "unit": "ms",
        "ours": vllm["weight_sync_s"] * 1000 if vllm else None,
        "trl": None,
        "ratio": None,
        "target": "",
        "target_met": None,
        "note": None if vllm else engines.get("vllm_note", "vLLM unavailable"),
    }
    return rows


def paired_ratios(ours: dict[str, Any], trl: dict[str, Any]) -> list[float]:
    """ours / TRL step time of each timed round (same index: the two steps ran back to back)."""
    return [o / t for o, t in zip(ours["step_s"], trl["step_s"], strict=True)]


def table(rows: dict[str, dict[str, Any]]) -> str:
    header = ["row", "unit", "ours", "TRL", "ours/TRL", "target", "met"]
    lines = []
    for row in rows.values():
        met = {None: "", True: "yes", False: "NO"}[row["target_met"]]
        ours = _num(row["ours"]) if row["ours"] is not None else f"skipped ({row.get('note') or 'n/a'})"[:60]
        trl = _num(row["trl"]) if row["trl"] is not None else "—"
        ratio = f"{row['ratio']:.2f}×" if row["ratio"] is not None else "—"
        lines.append([row["label"], row["unit"], ours, trl, ratio, row["target"], met])
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=True)]
    right = {2, 3, 4}

    def fmt(cells: list[str]) -> str:
        return " | ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-|-".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def breakdown(ours: dict[str, Any], trl: dict[str, Any] | None, engines: dict[str, Any]) -> str:
    parts = [f"{k.removeprefix('timing/')} {v:.2f} s" for k, v in ours["breakdown_median_s"].items()]
    lines = ["ours, median per step: " + ", ".join(parts) + f"; process CPU {ours['median_cpu_s']:.2f} s"]
    if trl:
        text = f"TRL, median per step: process CPU {trl['median_cpu_s']:.2f} s"
        if trl.get("breakdown_median_s"):
            gen = trl["breakdown_median_s"]["timing/generate_s"]
            text += f", generate {gen:.2f} s, rest {trl['median_step_s'] - gen:.2f} s"
        lines.append(text)
        ratios = paired_ratios(ours, trl)
        lines.append(
            f"ours/TRL per round (the table's ratio): median {statistics.median(ratios):.2f}×, range "
            f"{min(ratios):.2f}–{max(ratios):.2f}×; ratio of the medians "
            f"{ours['median_step_s'] / trl['median_step_s']:.2f}×; process-CPU ratio "
            f"{ours['median_cpu_s'] / trl['median_cpu_s']:.2f}×"
        )
    for name in ("local", "vllm"):
        engine = engines.get(name)
        if engine:
            lines.append(
                f"{name} engine: {engine['gen_tokens_per_s']:,.0f} tokens/s wall, "
                f"{engine['gen_tokens_per_cpu_s']:,.0f} tokens per process-CPU second; start {engine['start_s']:.1f} s"
            )
    return "\n".join(lines)


machine_info = host_info


# --- main ---------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per side (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (and engine calls) first")
    parser.add_argument("--repeats", type=int, default=5, help="timed generate calls per engine")
    parser.add_argument("--quick", action="store_true", help="2 timed steps, 1 warm-up, 2 engine repeats (smoke)")
    parser.add_argument("--skip-trl", action="store_true", help="measure ours only (no PyPI access needed)")
    parser.add_argument("--trl-venv", type=Path, default=DEFAULT_TRL_VENV)
    parser.add_argument("--trl-spec", default="trl", help="pip requirement for TRL (e.g. 'trl==1.16.0')")
    parser.add_argument("--ours-python", type=Path, default=Path(sys.executable), help="a venv with skyrl_train")
    parser.add_argument("--work-dir", type=Path, default=None, help="model and prompts (default: a temp dir)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    args.prompts, args.samples, args.max_new_tokens = 16, 4, 64
    if args.quick:
        args.steps, args.warmup, args.repeats = 2, 1, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trl_python, trl_version = (None, None) if args.skip_trl else ensure_trl_venv(args.trl_venv, args.trl_spec)
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        model, data = prepare_workload(work, args.prompts)
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        ours, trl, step_loads = measure_training(args, trl_python, model, data, scratch)
        print(f"  ours: median {ours['median_step_s']:.2f} s/step", flush=True)
        if trl is not None:
            print(f"  TRL:  median {trl['median_step_s']:.2f} s/step", flush=True)
        engines = measure_engines(args, model, data, scratch)
    loadavg_end = [round(x, 2) for x in os.getloadavg()]
    info = {**machine_info(), "loadavg_start": loadavg_start, "loadavg_end": loadavg_end}
    info["loadavg_per_training_round"] = step_loads
    rows = build_rows(ours, trl, engines)

    print()
    print(f"machine: {info['cpu_count']} CPUs ({info['cpus_usable']} usable), {info['cpu_model']}, {info['platform']}")
    print(f"load average: start {loadavg_start}, end {loadavg_end}")
    print(
        f"timed steps: {args.steps} after {args.warmup} warm-up (median), ours and TRL alternating step by step; "
        f"engines: {args.repeats} generate calls after {args.warmup}; TRL {trl_version or 'skipped'}\n"
    )
    print(table(rows))
    print()
    print(breakdown(ours, trl, engines))

    result = {
        "benchmark": "train_bench",
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "steps": args.steps,
        "warmup": args.warmup,
        "engine_repeats": args.repeats,
        "schedule": "lockstep: one step of each side per round, order alternating per round",
        "workload": {
            "model": "build_tiny_model(seed=0), fp32",
            "prompts": args.prompts,
            "samples_per_prompt": args.samples,
            "max_new_tokens": args.max_new_tokens,
            "reward": "gsm8k strict '#### N' match",
            "updates_per_step": 1,
        },
        "trl_version": trl_version,
        "target_ratio": TARGET_RATIO,
        "machine": info,
        "rows": rows,
        "ours": ours,
        "trl": trl,
        "engines": engines,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
