"""Chaos benchmark: episodes through the dispatcher under injected faults, and the dispatcher's cost at scale.

    .venv/bin/python benchmarks/chaos_bench.py                      # 1,000 Docker episodes; 10², 10³, 10⁴ at scale
    .venv/bin/python benchmarks/chaos_bench.py --quick --json OUT   # 50 Docker episodes; 10², 10³ (CI)

Part 1, faults on the Docker backend. ``--episodes`` episodes (a scripted policy running four shell commands, a
cheap grade) go through the dispatcher on the Docker backend wrapped by the fault injector
(:mod:`skyrl_agent.sandbox.faults`): 20% of sandboxes are killed from the host mid-episode, 10% of commands
sleep past their timeout, 5% of the backend's daemon API calls raise the daemon's error. The dispatcher runs in
a child process (``_chaos_worker.py docker``) that appends each episode's outcome to a JSONL file. When a quarter
of the outcomes are in, the child is SIGKILLed; once the killed run's sandbox lease has expired (``--lease-ttl-s``,
given to the children as ``SKYRL_LEASE_TTL_S``) a new child starts on the episodes without an outcome, and its
start-up reaper must remove the killed run's containers. When half of the outcomes are in, the Docker daemon is
restarted (stopped with SIGTERM, started again the way ``scripts/install-docker.sh`` starts it, waited for until
it answers).

The daemon is one of the benchmark's own: ``dockerd`` with its own socket, data and exec roots, so restarting
it stops nobody else's containers (the machine's daemon is shared). It needs root; without it the run goes to
the daemon ``DOCKER_HOST`` names, without a restart, and the report says so (``daemon.restarted``). Its data
root, holding a copy of the sandbox base image, is kept under ``$SKYRL_CACHE_DIR/chaos-dockerd``.

Reported: ``lost`` (episodes without an outcome), ``duplicated`` (with more than one), the outcome counts,
``containers_left`` after the run, the containers of the killed run after the restarted run's reap, the retries,
what was injected, wall time.

Part 2, scale (``_chaos_worker.py sim``): ``--sizes`` episodes at once through the dispatcher, all started while
it is paused (as during a weight sync) so that every one is live and idle at once, then resumed. Sandboxes are
modelled: a 5/s start limit, then a log-normal start (mean ≈350 ms, p99 ≈1.1 s), log-normal commands; 1% of
commands hang (the injector's sleep, timed out at the command's timeout). LLM calls queue for one shared
modelled GPU. These runs use an accelerated event loop: CPU work takes real time, idle waits are skipped, and
every wait (deadlines, the GPU, the start model) reads the loop's clock, which the dispatcher takes as its
``PausableClock``. Each size runs twice, in fresh interpreters: once for CPU time, once with tracemalloc for
the memory per live idle episode. One more pair runs the in-memory backend (two real processes per sandbox, so
real time and fewer episodes) behind the same start model. Reported: CPU ms per episode (process CPU: the
modelled work costs none), CPU over the run's wall time, traced bytes and RSS per idle episode, growth across
sizes. The dispatcher's own start-rate limiter (asyncio-throttle) reads ``time.monotonic`` and cannot be
accelerated: the model puts the 5/s limit in the modelled daemon, and a separate real-time run measures the CPU
the limiter burns while starts wait.

Output: the tables on stdout and a JSON report (``--json``, default ``benchmarks/results/chaos_bench.json``). The
script exits with status 1 when an episode was lost or duplicated or a container was left. No target on time is
asserted anywhere.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _machine import host_info
from agent_bench import render, targets_table

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "benchmarks" / "_chaos_worker.py"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "chaos_bench.json"
IMAGE = "skyrl-sandbox:base"
# The scripted policy never breaks its sandbox nor raises: these outcomes would be injected faults misclassified.
AGENT_OUTCOMES = ("agent_broke_sandbox", "agent_error")

# Targets of the scale part (reported, never asserted).
OVERHEAD_FRACTION = 0.02  # dispatcher CPU over the run's wall time
IDLE_EPISODE_BYTES = 50 * 1024  # memory per live idle episode
LINEAR_GROWTH = 1.5  # per-episode cost at the largest size over the smallest, at most


# --- The benchmark's own Docker daemon --------------------------------------------------------------------------------


def _docker(host: str | None, *argv: str, timeout_s: float = 30.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    command = ["docker", *(["--host", host] if host else []), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False, **kwargs)


def _answers(host: str | None) -> bool:
    try:
        return _docker(host, "info", "--format", "{{.ServerVersion}}", timeout_s=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _image_id(host: str | None) -> str | None:
    done = _docker(host, "image", "inspect", "--format", "{{.Id}}", IMAGE)
    return done.stdout.strip() if done.returncode == 0 else None


class PrivateDaemon:
    """A ``dockerd`` of this benchmark's own: its socket and exec root in a temporary directory, its data root kept.

    Started as ``scripts/install-docker.sh`` starts the machine's (``dockerd`` in the background, then ``docker
    info`` until it answers), with no bridge and no iptables rules (sandboxes have no network).
    """

    def __init__(self, exec_root: Path, data_root: Path, log_path: Path) -> None:
        self.exec_root, self.data_root, self.log_path = exec_root, data_root, log_path
        self.host = f"unix://{exec_root}/docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def problem() -> str | None:
        """Why no private daemon can run here, or None."""
        if os.geteuid() != 0:
            return "starting a dockerd needs root"
        for program in ("dockerd", "docker"):
            if shutil.which(program) is None:
                return f"no {program} on PATH"
        return None

    def start(self, timeout_s: float = 60.0) -> float:
        """Start dockerd and wait until it answers; the seconds that took."""
        argv = [
            "dockerd",
            "--host",
            self.host,
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root / "exec"),
            "--pidfile",
            str(self.exec_root / "dockerd.pid"),
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
        ]
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while not _answers(self.host):
            if self.proc.poll() is not None or time.monotonic() - started > timeout_s:
                tail = self.log_path.read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError(f"dockerd did not come up ({self.proc.returncode}); log:\n" + "\n".join(tail))
            time.sleep(0.25)
        return time.monotonic() - started

    def stop(self, timeout_s: float = 60.0) -> float:
        """SIGTERM dockerd (it stops its containers) and wait for it to exit; the seconds that took."""
        started = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.monotonic() - started

    def restart(self) -> dict[str, float]:
        """Stop and start again; how long each took."""
        stop_s = self.stop()
        return {"stop_s": stop_s, "start_s": self.start()}

    def ensure_image(self) -> float:
        """Copy the base image from the machine's daemon unless this one has the same; the seconds that took.

        Without an answer from the machine's daemon, the copy kept from an earlier run is used.
        """
        started = time.monotonic()
        ours, theirs = _image_id(self.host), _image_id(None) if _answers(None) else None
        if theirs is None and ours is None:
            raise RuntimeError(f"no {IMAGE} here nor on the machine's Docker daemon (run `skyrl-agent image build`)")
        if theirs is not None and ours != theirs:
            save = subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE)
            load = _docker(self.host, "load", stdin=save.stdout, timeout_s=600)
            save.wait()
            if load.returncode != 0 or save.returncode != 0:
                raise RuntimeError(f"copying {IMAGE} into the private daemon failed: {load.stderr[-500:]}")
        return time.monotonic() - started


@contextlib.contextmanager
def private_daemon(workdir: Path) -> Iterator[PrivateDaemon]:
    """A started private daemon with the base image, stopped at the end; its data root cached when not in use."""
    cache = Path(os.environ.get("SKYRL_CACHE_DIR") or Path.home() / ".cache" / "skyrl-agent") / "chaos-dockerd"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            data_root = cache / "data"
        except BlockingIOError:  # another chaos run holds the cached root: a fresh one (the image is copied again)
            data_root = Path(tempfile.mkdtemp(prefix="data-", dir=cache))
        exec_root = Path(tempfile.mkdtemp(prefix="skyrl-chaos-", dir="/tmp"))  # short: socket paths are limited
        daemon = PrivateDaemon(exec_root, data_root, workdir / "dockerd.log")
        try:
            daemon.start()
            yield daemon
        finally:
            daemon.stop()
            shutil.rmtree(exec_root, ignore_errors=True)
            if data_root.parent == cache and data_root.name != "data":
                shutil.rmtree(data_root, ignore_errors=True)


# --- Part 1: faults on Docker -----------------------------------------------------------------------------------------


class Worker:
    """One ``_chaos_worker.py docker`` child: stdout and stderr in files, ``@started`` and ``@done`` read from them."""

    def __init__(
        self, workdir: Path, name: str, ids: list[str], run_id: str, args: argparse.Namespace, env: dict[str, str]
    ) -> None:
        self.name, self.run_id = name, run_id
        ids_file = workdir / f"{name}.ids.json"
        ids_file.write_text(json.dumps(ids))
        self.stdout_path, self.stderr_path = workdir / f"{name}.out", workdir / f"{name}.err"
        argv = [
            sys.executable,
            str(WORKER),
            "docker",
            "--ids-file",
            str(ids_file),
            "--out",
            str(args.outcomes),
            "--run-id",
            run_id,
            "--seed",
            str(args.seed),
            "--crash-p",
            str(args.crash_p),
            "--hang-p",
            str(args.hang_p),
            "--daemon-error-p",
            str(args.daemon_error_p),
        ]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=REPO / "benchmarks")
        self.started = time.monotonic()

    def message(self, tag: str) -> dict[str, Any] | None:
        for line in self.stdout_path.read_text().splitlines():
            if line.startswith(f"@{tag} "):
                parsed: dict[str, Any] = json.loads(line.split(" ", 1)[1])
                return parsed
        return None

    def wait_started(self, timeout_s: float) -> None:
        while self.message("started") is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before it started: {self.tail()}")
            self.check_time(timeout_s, "start")
            time.sleep(0.1)

    def check_time(self, timeout_s: float, what: str) -> None:
        """Stop the child (SIGTERM: its reaper removes its containers) and raise once it has run ``timeout_s``."""
        if time.monotonic() - self.started > timeout_s:
            self.proc.terminate()
            self.proc.wait(60)
            raise RuntimeError(f"{self.name} did not {what} within {timeout_s:g} s: {self.tail()}")

    def tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]


def read_outcomes(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The complete records of the outcome file, and how many torn (unparseable) lines it has."""
    records, torn = [], 0
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                torn += 1
    return records, torn


def count_containers(host: str | None, run_ids: list[str]) -> int:
    """Containers (running or not) labelled with any of ``run_ids`` on the daemon at ``host``."""
    import docker

    from skyrl_agent.sandbox.docker_backend import list_managed

    client = docker.DockerClient(base_url=host, timeout=30) if host else docker.from_env(timeout=30)
    try:
        return sum(len(list_managed(client, run_id)[0]) for run_id in run_ids)
    finally:
        client.close()


def first_run(worker: Worker, args: argparse.Namespace, kill_at: int) -> dict[str, Any]:
    """Watch the first child and SIGKILL it once ``kill_at`` outcomes are in (unless it ends first)."""
    report: dict[str, Any] = {"kill_at_outcomes": kill_at, "killed_at_outcomes": None}
    worker.wait_started(args.timeout_s)
    while worker.proc.poll() is None:
        if len(read_outcomes(args.outcomes)[0]) >= kill_at:
            worker.proc.send_signal(signal.SIGKILL)
            worker.proc.wait()
            report["killed_at_outcomes"] = len(read_outcomes(args.outcomes)[0])
            print(f"  {report['killed_at_outcomes']} outcomes: SIGKILLed the run", flush=True)
            break
        worker.check_time(args.timeout_s, "reach the kill point")
        time.sleep(0.1)
    else:  # it ended first: nothing was killed
        report["returncode"], report["done"] = worker.proc.returncode, worker.message("done")
    report["wall_s"] = time.monotonic() - worker.started
    return report


def second_run(
    worker: Worker, args: argparse.Namespace, daemon: PrivateDaemon | None, restart_at: int, killed_run: str
) -> dict[str, Any]:
    """Watch the restarted child: count the killed run's containers after its start-up reap, restart the daemon
    once ``restart_at`` outcomes (of both runs) are in, wait for the end."""
    worker.wait_started(args.timeout_s)
    host = daemon.host if daemon else os.environ.get("DOCKER_HOST")
    report: dict[str, Any] = {"killed_run_containers_after_reap": count_containers(host, [killed_run])}
    while worker.proc.poll() is None:
        done = len(read_outcomes(args.outcomes)[0])
        if daemon is not None and "restart" not in report and done >= restart_at:
            print(f"  {done} outcomes: restarting the Docker daemon", flush=True)
            began = time.time()
            report["restart"] = {"at_outcomes": done, "began_unix_s": began, **daemon.restart()}
            report["restart"]["outcomes_during"] = len(read_outcomes(args.outcomes)[0]) - done
        worker.check_time(args.timeout_s, "finish")
        time.sleep(0.1)
    report["done"] = worker.message("done")
    if worker.proc.returncode != 0 or report["done"] is None:
        raise RuntimeError(f"{worker.name} failed ({worker.proc.returncode}): {worker.tail()}")
    report["wall_s"] = time.monotonic() - worker.started
    return report


def error_kind(error: str) -> str:
    """``"stage: ExceptionType"`` of a result's error (``"acquire: CircuitOpenError('…')"`` → its first two words)."""
    stage, _, rest = error.partition(": ")
    return f"{stage}: {rest.split('(', 1)[0]}"


def around_restart(records: list[dict[str, Any]], restart: dict[str, Any] | None) -> dict[str, Any] | None:
    """Outcomes decided from the restart's start until 5 s after the daemon answered again."""
    if restart is None:
        return None
    until = restart["began_unix_s"] + restart["stop_s"] + restart["start_s"] + 5.0
    during = [r for r in records if restart["began_unix_s"] <= r["unix_s"] <= until]
    return {
        "window_s": until - restart["began_unix_s"],
        "outcomes": dict(collections.Counter(r["outcome"] for r in during)),
        "errors": dict(collections.Counter(error_kind(r["error"]) for r in during if r["error"])),
    }


def exactly_once(ids: list[str], records: list[dict[str, Any]]) -> dict[str, Any]:
    per_episode = collections.Counter(r["episode"] for r in records)
    return {
        "with_one_outcome": sum(1 for i in ids if per_episode[i] == 1),
        "lost": sum(1 for i in ids if per_episode[i] == 0),
        "duplicated": sum(1 for i in ids if per_episode[i] > 1),
        "unknown": sorted(set(per_episode) - set(ids)),
        "duplicated_ids": sorted(i for i in ids if per_episode[i] > 1)[:20],
        "lost_ids": sorted(i for i in ids if per_episode[i] == 0)[:20],
    }


def run_docker_part(args: argparse.Namespace, workdir: Path, daemon: PrivateDaemon | None) -> dict[str, Any]:
    host = daemon.host if daemon else os.environ.get("DOCKER_HOST")
    # A SIGKILLed run's containers become reapable when its lease (renewed with the daemon) expires.
    env = {**os.environ, "SKYRL_LEASE_TTL_S": f"{args.lease_ttl_s:g}"}
    if daemon is not None:
        env["DOCKER_HOST"] = daemon.host
    ids = [f"ep{i:04d}" for i in range(args.episodes)]
    tag = f"chaos-{os.getpid()}-{int(time.time())}"
    runs = [f"{tag}-1", f"{tag}-2"]
    args.outcomes = workdir / "outcomes.jsonl"
    args.outcomes.unlink(missing_ok=True)  # a kept directory of an earlier run
    started = time.monotonic()
    print(f"run 1: {len(ids)} episodes", flush=True)
    first = first_run(Worker(workdir, "run1", ids, runs[0], args, env), args, max(1, len(ids) // 4))
    first["containers_after_kill"] = count_containers(host, runs[:1])
    if first["killed_at_outcomes"] is not None:
        print(f"  waiting {args.lease_ttl_s + 1:g} s for the killed run's lease to expire", flush=True)
        time.sleep(args.lease_ttl_s + 1)
    recorded = {r["episode"] for r in read_outcomes(args.outcomes)[0]}
    remaining = [i for i in ids if i not in recorded]
    print(f"run 2: the {len(remaining)} episodes without an outcome", flush=True)
    worker = Worker(workdir, "run2", remaining, runs[1], args, env)
    second = second_run(worker, args, daemon, max(2, len(ids) // 2), runs[0])
    wall_s = time.monotonic() - started
    records, torn = read_outcomes(args.outcomes)
    done = second["done"]
    return {
        **exactly_once(ids, records),
        "episodes": len(ids),
        "torn_lines": torn,
        "outcomes": dict(collections.Counter(r["outcome"] for r in records)),
        "retries": sum(r["attempts"] - 1 for r in records),
        "extra_sandbox_starts": sum(max(0, r["sandbox_starts"] - r["attempts"]) for r in records),
        "containers_after_kill": first["containers_after_kill"],
        "killed_run_containers_after_reap": second["killed_run_containers_after_reap"],
        "containers_left": count_containers(host, runs),
        "first_run": first,
        "second_run": second,
        "containers_left_by_second_run": {
            key: done[key]
            for key in (
                "containers_left_after_dispatch",
                "containers_left_after_close",
                "leftovers_after_dispatch",
                "leaked",
                "close_error",
            )
        },
        "release_errors_second_run": done["metrics"].get("release_errors"),
        "injected_second_run": done["injected"],
        "lease_ttl_s": args.lease_ttl_s,
        "errors": dict(collections.Counter(error_kind(r["error"]) for r in records if r["error"])),
        "around_restart": around_restart(records, second.get("restart")),
        "containers_left_when_dispatch_returned": done["containers_left_after_dispatch"],
        "second_run_results_match": done["results"] == done["distinct_results"] == len(remaining),
        "blamed_on_agent": sum(1 for r in records if r["outcome"] in AGENT_OUTCOMES),
        "failed_fast_by_open_circuit": sum(1 for r in records if "CircuitOpenError" in (r["error"] or "")),
        "breaker_trips_second_run": done["metrics"].get("breaker_trips"),
        "run_ids": runs,
        "records": records,
        "wall_s": wall_s,
    }


def docker_part(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    problem = None if args.daemon == "existing" else PrivateDaemon.problem()
    if problem is None and args.daemon == "private":
        with private_daemon(workdir) as daemon:
            image_s = daemon.ensure_image()
            result = run_docker_part(args, workdir, daemon)
        restart = result["second_run"].get("restart")
        daemon_info = {"kind": "private", "restarted": restart is not None, "image_copy_s": image_s, **(restart or {})}
        if restart is None:
            daemon_info["reason"] = "the second run finished before the restart point"
    else:
        result = run_docker_part(args, workdir, None)
        reason = problem or "--daemon existing"
        daemon_info = {"kind": "existing", "restarted": False, "reason": f"not restarted: {reason}"}
    return {**result, "daemon": daemon_info}


# --- Part 2: scale ----------------------------------------------------------------------------------------------------


def sim(episodes: int, backend: str, memory: bool, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        sys.executable,
        str(WORKER),
        "sim",
        "--episodes",
        str(episodes),
        "--backend",
        backend,
        "--seed",
        str(args.seed),
        *(["--memory"] if memory else []),
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=args.timeout_s, check=False, cwd=REPO / "benchmarks"
    )
    if done.returncode != 0:
        raise RuntimeError(f"sim {episodes} {backend} failed ({done.returncode}): {done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def scale_row(episodes: int, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    print(f"scale: {episodes} episodes, {backend} sandboxes", flush=True)
    cpu_run, memory_run = sim(episodes, backend, False, args), sim(episodes, backend, True, args)
    return {
        "episodes": episodes,
        "backend": backend,
        "clock": cpu_run["clock"],
        "outcomes": cpu_run["outcomes"],
        "hangs": cpu_run["hangs"],
        "live_idle": cpu_run["live_idle"],
        "cpu_s": cpu_run["cpu_s"],
        "wall_s": cpu_run["wall_s"],
        "real_wall_s": cpu_run["real_wall_s"],
        "cpu_ms_per_episode": cpu_run["cpu_ms_per_episode"],
        "gc_cpu_s": cpu_run["gc_cpu_s"],
        "cpu_ms_per_episode_without_gc": cpu_run["cpu_ms_per_episode_without_gc"],
        "overhead_fraction": cpu_run["overhead_fraction"],
        "traced_bytes_per_idle_episode": memory_run["traced_bytes_per_idle_episode"],
        "rss_bytes_per_idle_episode": cpu_run["rss_bytes_per_idle_episode"],
        "runs": {"cpu": cpu_run, "memory": memory_run},
    }


def throttle(args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, str(WORKER), "throttle", "--seconds", "3" if args.quick else "10"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True, cwd=REPO / "benchmarks")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def growth(rows: list[dict[str, Any]], key: str) -> float | None:
    """Per-episode ``key`` at the largest size over the smallest (modelled rows)."""
    modelled = sorted((r for r in rows if r["backend"] == "modelled"), key=lambda r: r["episodes"])
    if len(modelled) < 2 or not modelled[0][key]:
        return None
    return float(modelled[-1][key] / modelled[0][key])


def scale_part(args: argparse.Namespace) -> dict[str, Any]:
    rows = [scale_row(n, "modelled", args) for n in args.sizes]
    if args.memory_episodes:
        rows.append(scale_row(args.memory_episodes, "memory", args))
    limiter = throttle(args)
    return {
        "rows": rows,
        "growth": {
            "cpu_per_episode": growth(rows, "cpu_ms_per_episode"),
            "cpu_per_episode_without_gc": growth(rows, "cpu_ms_per_episode_without_gc"),
            "traced_bytes_per_idle_episode": growth(rows, "traced_bytes_per_idle_episode"),
        },
        "rate_limiter": limiter,
    }


# --- Report -----------------------------------------------------------------------------------------------------------


def _target(target: str, limit: str, value: float | None, met: bool | None, fmt: str = "{:g}") -> dict[str, Any]:
    return {"target": target, "limit": limit, "value": None if value is None else fmt.format(value), "met": met}


def docker_targets(d: dict[str, Any]) -> list[dict[str, Any]]:
    def none_of(target: str, key: str) -> dict[str, Any]:
        return _target(target, "0", d[key], d[key] == 0)

    return [
        none_of("episodes lost", "lost"),
        none_of("episodes duplicated", "duplicated"),
        none_of("containers left after the run", "containers_left"),
        none_of(
            "containers left when the restarted run's dispatcher returned", "containers_left_when_dispatch_returned"
        ),
        none_of("killed run's containers after the restart's reap", "killed_run_containers_after_reap"),
        none_of("infrastructure faults blamed on the agent", "blamed_on_agent"),
        none_of("episodes failed fast by the open circuit breaker", "failed_fast_by_open_circuit"),
        _target("Docker daemon restarted mid-run", "yes", None, d["daemon"]["restarted"]),
    ]


def scale_targets(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets on the modelled rows (the in-memory row's CPU and memory are mostly its real sandboxes')."""
    targets = []
    for row in (r for r in s["rows"] if r["backend"] == "modelled"):
        n, overhead, traced = row["episodes"], row["overhead_fraction"], row["traced_bytes_per_idle_episode"]
        met = overhead <= OVERHEAD_FRACTION
        targets.append(_target(f"dispatcher CPU / wall, {n} episodes", "≤ 2%", 100 * overhead, met, "{:.2f}%"))
        met = traced <= IDLE_EPISODE_BYTES
        targets.append(_target(f"memory per idle episode, {n} episodes", "≤ 50 KB", traced / 1024, met, "{:.1f} KB"))
    for key, label in (("cpu_per_episode", "CPU"), ("traced_bytes_per_idle_episode", "memory")):
        ratio = s["growth"][key]
        met = None if ratio is None else ratio <= LINEAR_GROWTH
        limit = f"≤ {LINEAR_GROWTH:g}×"
        targets.append(_target(f"{label} per episode, largest ÷ smallest size (linear)", limit, ratio, met, "{:.2f}×"))
    return targets


def docker_tables(d: dict[str, Any]) -> str:
    head = [
        "episodes",
        "one outcome",
        "lost",
        "duplicated",
        "containers after SIGKILL",
        "after the restart's reap",
        "left after the run",
        "episode retries",
        "extra starts",
        "wall s",
    ]
    row = [
        d["episodes"],
        d["with_one_outcome"],
        d["lost"],
        d["duplicated"],
        d["containers_after_kill"],
        d["killed_run_containers_after_reap"],
        d["containers_left"],
        d["retries"],
        d["extra_sandbox_starts"],
        f"{d['wall_s']:.0f}",
    ]
    main = render(head, [[str(c) for c in row]], set(range(len(head))))
    total = max(1, sum(d["outcomes"].values()))
    outcomes = render(
        ["outcome", "count", "fraction"],
        [[k, str(v), f"{v / total:.1%}"] for k, v in sorted(d["outcomes"].items(), key=lambda kv: -kv[1])],
        {1, 2},
    )
    return f"{main}\n\n{outcomes}"


def scale_table(s: dict[str, Any]) -> str:
    head = ["episodes at once", "sandboxes", "clock", "outcomes", "CPU s", "of which GC", "wall s", "real s",
            "CPU ms/episode", "without GC", "CPU / wall", "KB per idle episode (traced)", "KB (RSS)"]  # fmt: skip
    rows = []
    for r in s["rows"]:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
        cells = [r["episodes"], r["backend"], r["clock"], outcomes, f"{r['cpu_s']:.2f}", f"{r['gc_cpu_s']:.2f}",
                 f"{r['wall_s']:.0f}", f"{r['real_wall_s']:.1f}", f"{r['cpu_ms_per_episode']:.2f}",
                 f"{r['cpu_ms_per_episode_without_gc']:.2f}", f"{100 * r['overhead_fraction']:.2f}%",
                 f"{r['traced_bytes_per_idle_episode'] / 1024:.1f}",
                 f"{r['rss_bytes_per_idle_episode'] / 1024:.1f}"]  # fmt: skip
        rows.append([str(c) for c in cells])
    return render(head, rows, {0, *range(4, len(head))})


def print_report(result: dict[str, Any]) -> None:
    info = result["machine"]
    print(
        f"\nmachine: {info['cpu_count']} CPUs ({info['cpus_usable']} usable), {info['cpu_model']}, {info['platform']}"
    )
    print(f"load average: start {info['loadavg_start']}, end {info['loadavg_end']}")
    if result["quick"]:
        print("QUICK RUN: fewer episodes and sizes")
    d = result.get("docker")
    if d is not None:
        daemon = d["daemon"]
        restart = (
            f"restarted ({daemon['stop_s']:.1f} s to stop, {daemon['start_s']:.1f} s to answer again)"
            if daemon["restarted"]
            else daemon["reason"]
        )
        print(
            f"\nPart 1: {d['episodes']} episodes on Docker ({daemon['kind']} daemon, {restart}); faults: "
            f"{result['faults']}; run SIGKILLed at {d['first_run']['killed_at_outcomes']} outcomes\n"
        )
        print(docker_tables(d))
        print(f"\nerrors of the final outcomes: {d['errors']}")
        if d["around_restart"] is not None:
            a = d["around_restart"]
            print(f"outcomes decided during the daemon restart and 5 s after ({a['window_s']:.0f} s): {a['outcomes']}")
        print(f"\ninjected in the second run: {d['injected_second_run']}")
    s = result.get("scale")
    if s is not None:
        print("\nPart 2: scale (modelled sandboxes on an accelerated clock; in-memory sandboxes in real time)\n")
        print(scale_table(s))
        lim = s["rate_limiter"]
        print(
            f"\ndispatcher start-rate limiter (asyncio-throttle, {lim['waiters']} starts waiting, "
            f"{lim['rate_per_s']}/s): {100 * lim['cpu_fraction']:.2f}% of a core over {lim['wall_s']:.0f} s"
        )
    print("\nTargets\n")
    print(targets_table(result["targets"]))


def failures(result: dict[str, Any]) -> list[str]:
    d = result.get("docker")
    if d is None:
        return []
    return [f"{key}: {d[key]}" for key in ("lost", "duplicated", "containers_left") if d[key]]


# --- Main -------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50 Docker episodes; sizes 100 and 1000")
    parser.add_argument("--json", type=Path, default=DEFAULT_OUTPUT, help="where the JSON report goes")
    parser.add_argument("--parts", default="docker,scale", help="comma-separated subset of docker,scale")
    parser.add_argument("--episodes", type=int, help="Docker episodes (default 1000; quick 50)")
    parser.add_argument("--sizes", help="episodes at once in the scale part (default 100,1000,10000; quick 100,1000)")
    parser.add_argument("--memory-episodes", type=int, help="episodes of the in-memory backend row (0: none)")
    parser.add_argument(
        "--daemon",
        choices=("private", "existing"),
        default="private",
        help="restart a private dockerd, or use DOCKER_HOST's daemon without a restart",
    )
    parser.add_argument("--crash-p", type=float, default=0.2, help="fraction of sandboxes killed from the host")
    parser.add_argument("--hang-p", type=float, default=0.1, help="fraction of commands that sleep past their timeout")
    parser.add_argument("--daemon-error-p", type=float, default=0.05, help="fraction of daemon API calls that fail")
    parser.add_argument(
        "--lease-ttl-s",
        type=float,
        default=10.0,
        help="the workers' sandbox lease; the second run starts this long (+1 s) after the kill",
    )
    parser.add_argument("--keep", type=Path, help="keep the outcome file and the logs of the children here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=1800, help="limit on each child process")
    args = parser.parse_args(argv)
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not args.parts or args.parts - {"docker", "scale"}:
        parser.error("--parts takes docker and/or scale")
    args.episodes = args.episodes or (50 if args.quick else 1000)
    args.sizes = [int(x) for x in (args.sizes or ("100,1000" if args.quick else "100,1000,10000")).split(",")]
    if args.memory_episodes is None:
        args.memory_episodes = 50 if args.quick else 100
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_start = [round(x, 2) for x in os.getloadavg()]
    started = datetime.datetime.now(datetime.UTC)
    faults = {"crash_p": args.crash_p, "hang_p": args.hang_p, "daemon_error_p": args.daemon_error_p}
    result: dict[str, Any] = {
        "benchmark": "chaos_bench",
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "faults": faults,
        "lost": None,
        "duplicated": None,
        "containers_left": None,
        "targets": [],
    }
    wall0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-bench-"))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        if "docker" in args.parts:
            d = result["docker"] = docker_part(args, Path(tmp))
            result.update(lost=d["lost"], duplicated=d["duplicated"], containers_left=d["containers_left"])
            result["targets"] += docker_targets(d)
        if "scale" in args.parts:
            result["scale"] = scale_part(args)
            result["targets"] += scale_targets(result["scale"])
    result["wall_s"] = time.monotonic() - wall0
    result["machine"] = {
        **host_info(),
        "python": sys.version.split()[0],
        "loadavg_start": load_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print_report(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    problems = failures(result)
    for problem in problems:
        print(f"!!! {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
