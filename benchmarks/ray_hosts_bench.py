"""Sandbox hosts placed by Ray, measured: episodes over simulated hosts with one killed, and Ray against one daemon.

    .venv/bin/python benchmarks/ray_hosts_bench.py                                  # both parts, full size
    .venv/bin/python benchmarks/ray_hosts_bench.py --parts scale --episodes 2000    # a smaller scale run

Every episode is the chaos benchmark's (``_chaos_worker.py``): a scripted policy running four shell commands through
the ReAct agent and ``SandboxToolEnv``, then a cheap grade.

Part 1, ``scale``: ``--episodes`` episodes through the ``ray`` backend over ``--hosts`` simulated hosts, the nodes of
a ``ray.cluster_utils.Cluster`` offering ``sandbox_host``. Each host's actor runs a modelled backend (no process per
sandbox: each call waits its modelled time, in real time; starts at ``--starts-per-host`` per second, then
log-normal with mean ≈ 350 ms; commands ≈ 15 ms; 1% of commands hang until their 5 s timeout). LLM calls queue for
one shared modelled GPU. When ``--kill-at`` of the outcomes are in, one host's node is removed from the cluster.
The same episodes run twice, each on fresh hosts with one killed the same way: through the dispatcher, and through
a bare loop (a semaphore of the same size, acquire → agent → grade → release, a new sandbox when a host is lost)
that does only what every runner must. Reported per side: lost (episodes without an outcome), duplicated (with more
than one), leaked (sandboxes the live hosts still hold once the episodes are done), outcomes, retries, the driver's
CPU seconds and the wall time. **Dispatcher overhead** = (driver CPU with the dispatcher − driver CPU of the bare
loop) ÷ the dispatcher run's wall time: the CPU the dispatcher adds, as a share of the run (target ≤ 2 %).

Part 2, ``docker``: ``--docker-episodes`` episodes on this machine's Docker daemon through the dispatcher, on the
``docker`` backend directly and on the ``ray`` backend with ``--docker-hosts`` hosts (default two: nodes of one
local cluster, each a ``DockerBackend`` on the same daemon), alternating ``--rounds`` times. The hosts share the
daemon, so by default they share its container starts too (``--daemon-starts`` in flight, split evenly; each
``DockerBackend`` would otherwise start 4 at once, twice as many on the daemon as the one-backend side).
Reported: episodes per second per side and the overhead of going through Ray per episode (target ≤ 10 %).

Output: the tables on stdout and a JSON report (``--json``, default ``benchmarks/results/ray_hosts_bench.json``).
Exit status 1 when an episode was lost or duplicated or a sandbox leaked. No target is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from _chaos_worker import (
    LogNormal,
    ModelledBackend,
    RecordingDispatcher,
    SandboxModel,
    grade,
    outcome_counts,
    release,
    run_agent,
    scripted_policy,
)
from _machine import host_info

from skyrl_agent.dispatch import Dispatcher, DispatcherConfig, Episode, EpisodeResult, RunContext, StageLimits
from skyrl_agent.dispatch.outcomes import Outcome
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.llm.scripted import LatencyClient, ModelledGPU
from skyrl_agent.sandbox.base import Sandbox, SandboxBackend, SandboxSpec, SandboxUnavailableError
from skyrl_agent.sandbox.faults import FaultPlan, FaultyBackend
from skyrl_agent.sandbox.ray_hosts import RayHostBackend, RayHostSettings

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSON = REPO / "benchmarks" / "results" / "ray_hosts_bench.json"
COMMAND_TIMEOUT_S = 5.0
LIFETIME_S = DispatcherConfig().timeouts.sandbox_lifetime_s


@dataclass(frozen=True)
class SimHost:
    """Makes a simulated host's backend on its node (pickled there by Ray: a plain, importable value)."""

    starts_per_s: float

    def __call__(self) -> SandboxBackend:
        model = SandboxModel(start=LogNormal(0.30, 0.55), start_rate_per_s=self.starts_per_s)
        return ModelledBackend(model, seed=os.getpid())


@dataclass
class Tally:
    """Outcomes as they are decided, one count per episode id."""

    counts: collections.Counter[str]
    outcomes: list[EpisodeResult]

    def record(self, result: EpisodeResult) -> None:
        self.counts[result.episode.id] += 1
        self.outcomes.append(result)


# --- part 1: scale over simulated hosts ---------------------------------------------------------------------------


def _cluster(hosts: int) -> Any:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    for _ in range(hosts):
        cluster.add_node(num_cpus=1, resources={"sandbox_host": 1})
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    return cluster


async def _kill_when(cluster: Any, backend: RayHostBackend, tally: Tally, at: int) -> dict[str, Any]:
    """Remove the node of one host (not the head's) once ``at`` outcomes are in."""
    while len(tally.outcomes) < at:
        await asyncio.sleep(0.05)
    head = cluster.head_node.node_id
    victim = next(node for node in cluster.worker_nodes if node.node_id != head)
    host = next(host for host in backend.hosts if host.node_id == victim.node_id)
    held = host.held
    began = time.perf_counter()
    await asyncio.to_thread(cluster.remove_node, victim)
    return {"after_outcomes": len(tally.outcomes), "sandboxes_on_it": held, "remove_s": time.perf_counter() - began}


async def _bare(
    episodes: list[Episode],
    acquire: Callable[[Episode], Awaitable[Sandbox]],
    llm: Callable[[Episode], LLMClient],
    concurrency: int,
    tally: Tally,
) -> None:
    """The baseline runner: at most ``concurrency`` episodes at once, a new sandbox when a host is lost."""
    gate = asyncio.Semaphore(concurrency)
    agent = partial(run_agent, ".", COMMAND_TIMEOUT_S)

    async def one(episode: Episode) -> None:
        async with gate:
            for attempt in range(1, 4):
                sandbox = None
                try:
                    sandbox = await acquire(episode)
                    trajectory = await agent(episode, sandbox, llm(episode), RunContext())
                    graded = await grade(False, episode, sandbox, trajectory)
                    outcome = Outcome.RESOLVED if graded.resolved else Outcome.UNRESOLVED
                    tally.record(EpisodeResult(episode, outcome, reward=graded.reward, attempts=attempt))
                    return
                except SandboxUnavailableError:
                    continue
                finally:
                    if sandbox is not None:
                        await release(sandbox)
            tally.record(EpisodeResult(episode, Outcome.SANDBOX_ERROR, attempts=3))

    await asyncio.gather(*(one(episode) for episode in episodes))


async def _scale_pass(side: str, cluster: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One run of every episode on fresh hosts, one of them killed: the dispatcher's, or the bare loop's."""
    settings = RayHostSettings(max_sandboxes=args.max_per_host, start_timeout_s=120)
    backend = RayHostBackend(settings, make_inner=SimHost(args.starts_per_host))
    faulty = FaultyBackend(backend, FaultPlan(seed=args.seed, hang_p=0.01))
    spec = SandboxSpec()
    loop = asyncio.get_running_loop()
    gpu = ModelledGPU(capacity=64, decode_s_per_token=0.002, overhead_s=0.02, clock=loop.time)
    policy = scripted_policy()

    def llm(episode: Episode) -> LLMClient:
        return LatencyClient(policy, gpu=gpu, seed=zlib.crc32(episode.id.encode()))

    async def acquire(episode: Episode) -> Sandbox:
        return await faulty.create(spec, key=episode.id)

    episodes = [Episode(f"ep{i:05d}") for i in range(args.episodes)]
    tally = Tally(collections.Counter(), [])
    killer = asyncio.ensure_future(_kill_when(cluster, backend, tally, int(args.kill_at * args.episodes)))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    metrics: dict[str, float] = {}
    if side == "dispatcher":
        limits = StageLimits(acquire=args.concurrency, run=args.concurrency, grade=args.concurrency, prefetch=8)
        config = DispatcherConfig(limits=limits, seed=args.seed)
        dispatcher: Dispatcher = RecordingDispatcher(
            acquire,
            partial(run_agent, ".", COMMAND_TIMEOUT_S),
            partial(grade, False),
            release,
            llm,
            config,
            on_result=tally.record,
        )
        metrics = (await dispatcher.run(episodes)).metrics
    else:
        await _bare(episodes, acquire, llm, args.concurrency, tally)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    kill = await killer
    live = backend.live_hosts
    held_by_hosts = [await host.actor.held.remote() for host in live]
    await backend.close()
    return {
        "side": side,
        "episodes": args.episodes,
        "lost": sum(1 for episode in episodes if tally.counts[episode.id] == 0),
        "duplicated": sum(1 for count in tally.counts.values() if count > 1),
        "leaked": sum(held_by_hosts) + sum(host.held for host in live),
        "outcomes": outcome_counts(tally.outcomes),
        "retries": sum(result.attempts - 1 for result in tally.outcomes),
        "hosts": len(backend.hosts),
        "hosts_live_at_end": len(live),
        "kill": kill,
        "hangs_injected": faulty.injected["hang"],
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "episodes_per_s": args.episodes / wall_s,
        "dispatcher_metrics": metrics,
    }


def scale(args: argparse.Namespace) -> dict[str, Any]:
    """Both sides on one cluster; the killed node is replaced between them, so each starts with ``--hosts``."""
    import ray

    cluster = _cluster(args.hosts)
    sides = []
    try:
        for side in ("bare", "dispatcher"):
            sides.append(asyncio.run(_scale_pass(side, cluster, args)))
            print(f"  {side}: {_scale_row(sides[-1])}", flush=True)
            cluster.add_node(num_cpus=1, resources={"sandbox_host": 1})
            cluster.wait_for_nodes()
    finally:
        ray.shutdown()
        cluster.shutdown()
    bare, dispatched = sides
    return {
        "sides": sides,
        "dispatcher_overhead": (dispatched["cpu_s"] - bare["cpu_s"]) / dispatched["wall_s"],
        "wall_ratio": dispatched["wall_s"] / bare["wall_s"],
        "params": {k: getattr(args, k) for k in ("episodes", "hosts", "concurrency", "max_per_host", "kill_at")}
        | {"starts_per_host": args.starts_per_host, "seed": args.seed},
    }


def _scale_row(side: dict[str, Any]) -> str:
    return (
        f"{side['episodes']} episodes, lost {side['lost']}, duplicated {side['duplicated']}, leaked {side['leaked']}, "
        f"retries {side['retries']}, {side['wall_s']:.1f} s wall, {side['cpu_s']:.1f} s CPU, {side['outcomes']}"
    )


# --- part 2: Ray against one daemon -------------------------------------------------------------------------------


async def _docker_pass(backend: SandboxBackend, n: int, concurrency: int, label: str) -> dict[str, Any]:
    """``n`` Docker episodes through the dispatcher on ``backend`` (closed after); wall seconds and outcomes."""
    spec = SandboxSpec(memory_mb=256, pids_limit=64, labels={"skyrl.bench": label})

    async def acquire(episode: Episode) -> Sandbox:
        return await backend.create(spec)

    limits = StageLimits(acquire=concurrency, run=concurrency, grade=concurrency, prefetch=2)
    dispatcher = Dispatcher(
        acquire,
        partial(run_agent, "/workspace", 30.0),
        partial(grade, True),
        release,
        scripted_policy(),
        DispatcherConfig(limits=limits),
    )
    began = time.perf_counter()
    try:
        out = await dispatcher.run([Episode(f"{label}-{i}") for i in range(n)])
    finally:
        await backend.close()
    wall_s = time.perf_counter() - began
    row = {"wall_s": wall_s, "episodes_per_s": n / wall_s, "outcomes": outcome_counts(out.results)}
    if isinstance(backend, RayHostBackend):
        row["promises_sent"] = backend.promises_sent
    return row


def docker(args: argparse.Namespace) -> dict[str, Any]:
    """The same episodes on the docker backend and on two Ray hosts of the same daemon, alternating."""
    import ray

    from skyrl_agent.sandbox.docker_backend import DockerBackend

    cluster = _cluster(args.docker_hosts)
    # The simulated hosts share one daemon, so they share its starts: the same number in flight on both sides.
    host_starts = args.host_starts or max(1, args.daemon_starts // args.docker_hosts)
    rows: dict[str, list[dict[str, Any]]] = {"docker": [], "ray": []}
    try:
        for round_ in range(args.rounds):
            for side in ("docker", "ray") if round_ % 2 == 0 else ("ray", "docker"):
                run_id = f"skyrl-bench-{side}-{round_}"
                # Both sides' sandboxes have the lifetime a run gives them, so the dispatcher's promises count.
                docker_backend = partial(DockerBackend, run_id=run_id, lifetime_s=LIFETIME_S)
                backend: SandboxBackend = (
                    docker_backend(max_concurrent_starts=args.daemon_starts)
                    if side == "docker"
                    else RayHostBackend(
                        RayHostSettings(max_sandboxes=16),
                        make_inner=partial(docker_backend, max_concurrent_starts=host_starts),
                    )
                )
                row = asyncio.run(_docker_pass(backend, args.docker_episodes, args.docker_concurrency, run_id))
                rows[side].append(row)
                print(f"  round {round_} {side}: {row['episodes_per_s']:.2f} episodes/s, {row['outcomes']}", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    rate = {side: sum(r["episodes_per_s"] for r in runs) / len(runs) for side, runs in rows.items()}
    return {
        "rounds": rows,
        "episodes_per_s": rate,
        "ray_overhead_per_episode": rate["docker"] / rate["ray"] - 1,
        "params": {
            "episodes": args.docker_episodes,
            "concurrency": args.docker_concurrency,
            "rounds": args.rounds,
            "hosts": args.docker_hosts,
            "daemon_starts": args.daemon_starts,
            "host_starts": host_starts,
        },
    }


# --- main ---------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="scale,docker", help="comma-separated: scale, docker")
    parser.add_argument("--episodes", type=int, default=10_000, help="scale: episodes per side")
    parser.add_argument("--hosts", type=int, default=4, help="scale: simulated hosts (Ray nodes)")
    parser.add_argument("--concurrency", type=int, default=256, help="scale: episodes at once")
    parser.add_argument("--max-per-host", type=int, default=96, help="scale: sandboxes one host holds")
    parser.add_argument("--starts-per-host", type=float, default=25.0, help="scale: sandbox starts per second per host")
    parser.add_argument("--kill-at", type=float, default=0.25, help="scale: share of outcomes in when a host dies")
    parser.add_argument("--docker-episodes", type=int, default=96, help="docker: episodes per side and round")
    parser.add_argument("--docker-concurrency", type=int, default=8, help="docker: episodes at once")
    parser.add_argument("--rounds", type=int, default=4, help="docker: rounds (sides alternate)")
    parser.add_argument("--docker-hosts", type=int, default=2, help="docker: Ray hosts on the one daemon")
    parser.add_argument("--daemon-starts", type=int, default=4, help="docker: container starts in flight at once")
    parser.add_argument(
        "--host-starts", type=int, default=None, help="docker: starts in flight per Ray host (default: split evenly)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    report: dict[str, Any] = {"machine": host_info(), "python": sys.version.split()[0]}
    failed = False
    if "scale" in parts:
        print(f"scale: {args.episodes} episodes over {args.hosts} simulated hosts, one killed, twice", flush=True)
        report["scale"] = result = scale(args)
        failed = any(side["lost"] or side["duplicated"] or side["leaked"] for side in result["sides"])
        print(
            f"dispatcher overhead {100 * result['dispatcher_overhead']:.2f}% of wall "
            f"(wall dispatcher ÷ bare {result['wall_ratio']:.3f})"
        )
    if "docker" in parts:
        print(f"docker: {args.docker_episodes} episodes per side, {args.rounds} rounds", flush=True)
        report["docker"] = result = docker(args)
        rate = result["episodes_per_s"]
        print(
            f"docker {rate['docker']:.2f} vs ray {rate['ray']:.2f} episodes/s: "
            f"{100 * result['ray_overhead_per_episode']:+.1f}% per episode through Ray"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
