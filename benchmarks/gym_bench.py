"""Side-by-side throughput of this repository's skyrl-gym and upstream skyrl-gym 0.4.0 on the same episodes.

    .venv/bin/python benchmarks/gym_bench.py                 # all rows, 5 repeats (a few minutes)
    .venv/bin/python benchmarks/gym_bench.py --quick --skip-upstream   # smoke run, ours only

Upstream is installed from PyPI into its own venv (``.cache/bench/upstream-venv`` by default, reused when it is
already complete), because both distributions are called ``skyrl-gym`` and import as ``skyrl_gym``: in one venv one
would shadow the other. Every measurement runs ``benchmarks/_gym_bench_worker.py`` in a fresh interpreter of the
venv under test, from a scratch working directory, with no ``PYTHONPATH`` and ``-s -P`` (no user site, no script
directory on ``sys.path``); the worker refuses to run if the ``skyrl_gym`` it imported is not the expected one.

Repeats alternate between the two implementations (row by row, ours then upstream), so slow drifts in the load of
a shared machine hit both alike; each repeat runs untimed warm-up episodes first. The table shows the median rate
of the repeats. Both implementations must give every episode the same rewards (and the same observations, up to
the order of lines, since SQL rows without ORDER BY come back in no defined order): a difference is printed loudly
and recorded, never hidden, and the script then exits with status 1.

Upstream's ``python`` tool runs ``python -c`` found on ``PATH``; by default the upstream venv's ``bin`` comes first
on ``PATH``, as if it were activated (its own interpreter, the fastest choice for upstream). ``--upstream-path
inherit`` keeps this process's ``PATH`` instead (on the development machines a pyenv shim, ≈85 ms per start).

``--cpu`` also measures the CPU time each episode costs, counting every process it starts (sandboxes, forked test
runners, ``python -c`` children): each worker runs in its own temporary cgroup (root and a cgroup v1 ``cpuacct`` or
cgroup v2 hierarchy needed), read before and after the timed episodes. CPU per episode hardly depends on what else the
machine is doing, unlike the rates, and on a machine with few cores it is what bounds throughput. Kernel work done on
behalf of a process in kernel threads (e.g. tearing down a network namespace) is not charged to its cgroup.

Output: the table on stdout and a JSON report (default ``benchmarks/results/gym_bench.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _machine import host_info

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "benchmarks" / "_gym_bench_worker.py"
OURS_ROOT = REPO / "skyrl-gym" / "skyrl_gym"
SQL_DATA = OURS_ROOT / "envs" / "sql" / "data" / "databases"
DEFAULT_UPSTREAM_VENV = REPO / ".cache" / "bench" / "upstream-venv"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "gym_bench.json"
UPSTREAM_VERSION = "0.4.0"
# What upstream's envs import at run time besides its declared dependencies: numpy and pandas for the lcb
# preamble and the SQL tool; func_timeout, requests and omegaconf are its declared ones.
UPSTREAM_REQUIREMENTS = [f"skyrl-gym=={UPSTREAM_VERSION}", "numpy", "pandas", "func_timeout", "requests", "omegaconf"]
UPSTREAM_PROBE = (
    "import importlib.metadata as m, skyrl_gym, numpy, pandas, func_timeout, requests, omegaconf; "
    "print(m.version('skyrl-gym'))"
)


@dataclass(frozen=True)
class RowInfo:
    """A benchmark row as the table shows it, with its episode counts and its target ratio (ours / upstream)."""

    label: str
    unit: str
    n: int  # timed episodes per repeat
    quick_n: int
    target: float


ROWS: dict[str, RowInfo] = {
    "gsm8k": RowInfo("gsm8k make+init+step", "episodes/s", 20000, 50, 2.0),
    "lcb": RowInfo("lcb, 3 stdin tests, correct solution", "episodes/s", 40, 3, 10.0),
    "lcb_x8": RowInfo("lcb, same, 8 episodes at once (threads)", "episodes/s", 48, 8, 10.0),
    "python_tool": RowInfo("searchcode python tool call", "calls/s", 40, 3, 10.0),
    "python_tool_x8": RowInfo("searchcode python tool, 8 at once (threads)", "calls/s", 48, 8, 10.0),
    "text2sql": RowInfo("text2sql <sql> step, bundled sqlite", "steps/s", 1000, 20, 1.0),
}
"""Targets: code execution ≥ 10× upstream, gsm8k ≥ 2×, and never slower (≥ 1×) on any row."""


# --- CPU accounting ---------------------------------------------------------------------------------------------


class CpuAccounting:
    """Puts each worker into a fresh cgroup of its own, so the CPU time of all it starts can be read from one file.

    Args:
        root: The cgroup hierarchy's mount point (v1 ``cpuacct`` or v2).
        usage_file: ``cpuacct.usage`` (v1, nanoseconds) or ``cpu.stat`` (v2, its ``usage_usec`` line).
    """

    _ids = itertools.count()

    def __init__(self, root: Path, usage_file: str) -> None:
        self.root = root
        self.usage_file = usage_file

    @classmethod
    def detect(cls) -> tuple[CpuAccounting | None, str]:
        """A working accounting on this machine, or None and the reason there is none."""
        try:
            mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
        except OSError as exc:
            return None, f"cannot read /proc/self/mounts ({exc})"
        candidates = [cls(Path(m[1]), "cpuacct.usage") for m in mounts if m[2] == "cgroup" and "cpuacct" in m[3]]
        candidates += [cls(Path(m[1]), "cpu.stat") for m in mounts if m[2] == "cgroup2"]
        reason = "no cgroup v1 cpuacct or cgroup v2 hierarchy is mounted"
        for candidate in candidates:
            try:
                with candidate.group():
                    return candidate, ""
            except OSError as exc:
                reason = f"cannot create a cgroup under {candidate.root} ({exc})"
        return None, reason

    @contextlib.contextmanager
    def group(self) -> Iterator[tuple[list[str], str]]:
        """A new cgroup: the command prefix that runs a program inside it, and its usage file. Removed afterwards."""
        path = self.root / f"gym-bench-{os.getpid()}-{next(self._ids)}"
        path.mkdir()
        try:
            prefix = ["/bin/sh", "-c", f'echo $$ > "{path}/cgroup.procs" && exec "$@"', "sh"]
            yield prefix, str(path / self.usage_file)
        finally:
            self._remove(path)

    @staticmethod
    def _remove(path: Path) -> None:
        deadline = time.monotonic() + 5
        while True:
            try:
                path.rmdir()
                return
            except OSError:  # busy while the worker's last processes exit
                if time.monotonic() > deadline:
                    print(f"warning: could not remove cgroup {path}", file=sys.stderr)
                    return
                time.sleep(0.05)


# --- Running the worker -------------------------------------------------------------------------------------------


def worker_env(python: Path, prepend_bin: bool) -> dict[str, str]:
    """This process's environment, without anything that could put another ``skyrl_gym`` on ``sys.path``."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.pop("VIRTUAL_ENV", None)
    env["PYTHONHASHSEED"] = "0"  # same set and dict order in every run, so repeated runs print alike
    if prepend_bin:
        env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_worker(
    python: Path,
    impl: str,
    row: str,
    n: int,
    warmup: int,
    *,
    expect_root: Path,
    env: dict[str, str],
    profile: int = 0,
    cpu: CpuAccounting | None = None,
) -> dict[str, Any]:
    """One measurement: ``n`` timed episodes of ``row`` in a fresh interpreter; the worker's JSON report."""
    command = [str(python), "-s", "-P", str(WORKER), "--impl", impl, "--row", row, "--n", str(n)]
    command += ["--warmup", str(warmup), "--expect-root", str(expect_root), "--sql-data", str(SQL_DATA), "--json"]
    if profile:
        command += ["--profile", str(profile)]
    with contextlib.ExitStack() as stack:
        cwd = stack.enter_context(tempfile.TemporaryDirectory(prefix="gym-bench-cwd-"))
        if cpu is not None:
            prefix, usage_file = stack.enter_context(cpu.group())
            command = [*prefix, *command, "--cpu-file", usage_file]
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{impl} worker failed on row {row!r} (exit {done.returncode}):\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def ensure_upstream_venv(venv: Path) -> Path:
    """The upstream venv's interpreter; creates the venv and installs skyrl-gym 0.4.0 into it if needed."""
    python = venv / "bin" / "python"
    if python.exists() and _upstream_version(python) == UPSTREAM_VERSION:
        return python
    print(f"installing skyrl-gym=={UPSTREAM_VERSION} into {venv} ...", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gym-bench-cwd-") as cwd:
        _check(subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], cwd=cwd, capture_output=True))
        install = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *UPSTREAM_REQUIREMENTS]
        _check(subprocess.run(install, cwd=cwd, env=worker_env(python, True), capture_output=True))
    version = _upstream_version(python)
    if version != UPSTREAM_VERSION:
        raise SystemExit(f"{venv} holds skyrl-gym {version!r} after installing, not {UPSTREAM_VERSION}")
    return python


def _upstream_version(python: Path) -> str | None:
    with tempfile.TemporaryDirectory(prefix="gym-bench-cwd-") as cwd:
        probe = [str(python), "-s", "-P", "-c", UPSTREAM_PROBE]
        done = subprocess.run(probe, cwd=cwd, env=worker_env(python, True), capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _check(done: subprocess.CompletedProcess[bytes]) -> None:
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace")[-4000:]
        raise SystemExit(
            f"could not set up upstream skyrl-gym ({' '.join(map(str, done.args))}):\n{message}\n"
            "Without access to PyPI, run with --skip-upstream."
        )


# --- Comparing ----------------------------------------------------------------------------------------------------


def _normalise(signature: list[list[Any]]) -> tuple[tuple[float, ...], tuple[tuple[str, ...], ...]]:
    """(rewards of the steps, observation lines of each step, sorted)."""
    rewards = tuple(float(step[0]) for step in signature)
    observations = tuple(tuple(sorted(str(step[2]).split("\n"))) for step in signature)
    return rewards, observations


def compare(ours: list[dict[str, Any]], upstream: list[dict[str, Any]]) -> dict[str, Any]:
    """Episode-by-episode agreement of two implementations: the timed episodes of all repeats, and the finished ones."""
    episodes = reward_diffs = observation_diffs = 0
    examples: list[dict[str, Any]] = []
    for our_run, their_run in zip(ours, upstream, strict=True):
        pairs = [
            *zip(our_run["signatures"], their_run["signatures"], strict=True),
            (our_run["finished"], their_run["finished"]),
        ]
        for our_sigs, their_sigs in pairs:
            for index, (mine, theirs) in enumerate(zip(our_sigs, their_sigs, strict=True)):
                episodes += 1
                (my_rewards, my_obs), (their_rewards, their_obs) = _normalise(mine), _normalise(theirs)
                reward_diffs += my_rewards != their_rewards
                observation_diffs += my_obs != their_obs
                if (my_rewards != their_rewards or my_obs != their_obs) and len(examples) < 3:
                    examples.append({"episode": index, "ours": mine, "upstream": theirs})
    return {
        "episodes": episodes,
        "reward_disagreements": reward_diffs,
        "observation_disagreements": observation_diffs,
        "examples": examples,
    }


def _cpu_summary(cpu_ms: list[float]) -> dict[str, Any]:
    if not cpu_ms:
        return {}
    return {"cpu_ms_per_episode": statistics.median(cpu_ms), "cpu_ms_per_episode_all": cpu_ms}


def summarise(row: str, info: RowInfo, ours: list[dict[str, Any]], upstream: list[dict[str, Any]]) -> dict[str, Any]:
    our_rates = [rate for run in ours for rate in run["rates"]]
    our_cpu = [ms for run in ours for ms in run.get("cpu_ms_per_episode", [])]
    summary: dict[str, Any] = {
        "row": row,
        "label": info.label,
        "unit": info.unit,
        "n": ours[0]["n"],
        "concurrency": ours[0]["concurrency"],
        "target_ratio": info.target,
        "ours": {"median": statistics.median(our_rates), "rates": our_rates, **_cpu_summary(our_cpu)},
        "upstream": None,
        "ratio": None,
        "target_met": None,
        "agreement": None,
    }
    if upstream:
        their_rates = [rate for run in upstream for rate in run["rates"]]
        their_cpu = [ms for run in upstream for ms in run.get("cpu_ms_per_episode", [])]
        ratio = summary["ours"]["median"] / statistics.median(their_rates)
        summary.update(
            upstream={"median": statistics.median(their_rates), "rates": their_rates, **_cpu_summary(their_cpu)},
            ratio=ratio,
            target_met=ratio >= info.target,
            agreement=compare(ours, upstream),
        )
    return summary


# --- Reporting ----------------------------------------------------------------------------------------------------


def _rate(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _agree(agreement: dict[str, Any] | None, key: str) -> str:
    if agreement is None:
        return "n/a"
    diffs = agreement[key]
    return "yes" if diffs == 0 else f"NO ({diffs}/{agreement['episodes']})"


def _cpu(side: dict[str, Any] | None) -> str:
    if not side or "cpu_ms_per_episode" not in side:
        return "n/a"
    return f"{side['cpu_ms_per_episode']:.3g}"


def table(summaries: list[dict[str, Any]], with_cpu: bool) -> str:
    header = ["row", "unit", "ours", "upstream", "ours/up", "target", "met", "rewards agree", "obs agree"]
    if with_cpu:
        header += ["ours CPU ms/ep", "up CPU ms/ep"]
    lines = []
    for s in summaries:
        upstream = s["upstream"]["median"] if s["upstream"] else None
        ratio = f"{s['ratio']:.1f}×" if s["ratio"] is not None else "n/a"
        met = {None: "n/a", True: "yes", False: "NO"}[s["target_met"]]
        lines.append(
            [
                s["label"],
                s["unit"],
                _rate(s["ours"]["median"]),
                _rate(upstream),
                ratio,
                f"≥{s['target_ratio']:g}×",
                met,
                _agree(s["agreement"], "reward_disagreements"),
                _agree(s["agreement"], "observation_disagreements"),
            ]
        )
        if with_cpu:
            lines[-1] += [_cpu(s["ours"]), _cpu(s["upstream"])]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=True)]
    right = {2, 3, 4, 5, 9, 10}

    def fmt(cells: list[str]) -> str:
        return " | ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-|-".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def machine_info(reports: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """The machine, the interpreters and our sandbox's settings (from the workers' reports)."""
    ours = [report for by_impl in reports.values() for report in by_impl["ours"]]
    upstream = [report for by_impl in reports.values() for report in by_impl.get("upstream", [])]
    executors = [report["executor"] for report in ours if "executor" in report]
    return {
        **host_info(),
        "python_ours": ours[0]["python"],
        "python_upstream": upstream[0]["python"] if upstream else None,
        "skyrl_gym_ours": ours[0]["skyrl_gym_file"],
        "skyrl_gym_upstream": upstream[0]["skyrl_gym_file"] if upstream else None,
        "sandbox_isolation_ours": ours[0].get("isolation"),
        "sandbox_executor_ours": executors[0] if executors else None,
    }


def print_machine(info: dict[str, Any]) -> None:
    print(f"machine: {info['cpu_count']} CPUs ({info['cpus_usable']} usable), {info['cpu_model']}, {info['platform']}")
    print(f"python: ours {info['python_ours']}, upstream {info['python_upstream']}")
    print(f"our sandbox: isolation {info['sandbox_isolation_ours']}; {info['sandbox_executor_ours']}")
    print(f"load average: start {info['loadavg_start']}, end {info['loadavg_end']}")


def print_disagreements(summaries: list[dict[str, Any]]) -> None:
    for s in summaries:
        agreement = s["agreement"]
        if agreement and (agreement["reward_disagreements"] or agreement["observation_disagreements"]):
            print(f"\n!!! {s['row']}: the implementations DISAGREE on {s['label']}:", file=sys.stderr)
            for example in agreement["examples"]:
                print(f"!!!   {json.dumps(example)[:1500]}", file=sys.stderr)


# --- Main ---------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per row and implementation (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed episodes before each measurement")
    parser.add_argument("--quick", action="store_true", help="a few episodes per row, one repeat (smoke test)")
    parser.add_argument("--skip-upstream", action="store_true", help="measure ours only (no PyPI access needed)")
    parser.add_argument("--upstream-venv", type=Path, default=DEFAULT_UPSTREAM_VENV)
    parser.add_argument("--upstream-path", choices=("venv", "inherit"), default="venv", help="see the module doc")
    parser.add_argument("--ours-python", type=Path, default=Path(sys.executable), help="a venv with our skyrl_gym")
    parser.add_argument("--cpu", action="store_true", help="also measure CPU ms per episode (needs cgroups, root)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON report")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="afterwards, cProfile ours on each row, print N lines"
    )
    args = parser.parse_args(argv)
    args.rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    unknown = sorted(set(args.rows) - set(ROWS))
    if not args.rows:
        parser.error("--rows names no row")
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    if args.quick:
        args.repeats, args.warmup = 1, 1
    return args


def measure_all(
    args: argparse.Namespace, impls: dict[str, tuple[Path, Path, dict[str, str]]], cpu: CpuAccounting | None
) -> dict[str, Any]:
    """Run every (repeat, row, implementation), alternating implementations; the reports by row and impl."""
    reports: dict[str, dict[str, list[dict[str, Any]]]] = {row: {impl: [] for impl in impls} for row in args.rows}
    for repeat in range(args.repeats):
        for row in args.rows:
            n = ROWS[row].quick_n if args.quick else ROWS[row].n
            for impl, (python, root, env) in impls.items():
                report = run_worker(python, impl, row, n, args.warmup, expect_root=root, env=env, cpu=cpu)
                reports[row][impl].append(report)
                rate = _rate(report["rates"][0])
                print(f"  repeat {repeat + 1}/{args.repeats} {row:15} {impl:8} {rate:>9} {ROWS[row].unit}", flush=True)
    return reports


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    impls: dict[str, tuple[Path, Path, dict[str, str]]] = {
        "ours": (args.ours_python, OURS_ROOT, worker_env(args.ours_python, True)),
    }
    if not args.skip_upstream:
        upstream_python = ensure_upstream_venv(args.upstream_venv)
        env = worker_env(upstream_python, args.upstream_path == "venv")
        impls["upstream"] = (upstream_python, args.upstream_venv, env)
    cpu = None
    if args.cpu:
        cpu, reason = CpuAccounting.detect()
        if cpu is None:
            print(f"note: no CPU accounting ({reason}); CPU columns are n/a", file=sys.stderr)
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    started = datetime.datetime.now(datetime.UTC)
    reports = measure_all(args, impls, cpu)
    info = machine_info(reports)
    info["loadavg_start"], info["loadavg_end"] = loadavg_start, [round(x, 2) for x in os.getloadavg()]
    summaries = [summarise(row, ROWS[row], reports[row]["ours"], reports[row].get("upstream", [])) for row in args.rows]

    print()
    print_machine(info)
    print(f"repeats: {args.repeats} (median shown); upstream python tool PATH: {args.upstream_path}\n")
    print(table(summaries, with_cpu=cpu is not None))
    print_disagreements(summaries)

    profiles = {}
    if args.profile:
        python, root, env = impls["ours"]
        for row in args.rows:
            n = ROWS[row].quick_n if args.quick else ROWS[row].n
            report = run_worker(python, "ours", row, n, args.warmup, expect_root=root, env=env, profile=args.profile)
            profiles[row] = report["profile"]
            print(f"\n=== cProfile of ours, row {row} ({n} episodes) ===\n{report['profile']}")

    result = {
        "benchmark": "gym_bench",
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "upstream_version": None if args.skip_upstream else UPSTREAM_VERSION,
        "upstream_path": None if args.skip_upstream else args.upstream_path,
        "cpu_accounting": None if cpu is None else f"{cpu.root}/*/{cpu.usage_file}",
        "machine": info,
        "rows": {s["row"]: s for s in summaries},
        "profiles": profiles,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    agreements = [s["agreement"] for s in summaries if s["agreement"]]
    disagree = any(a["reward_disagreements"] or a["observation_disagreements"] for a in agreements)
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
