"""One run of the dispatcher comparison in a fresh interpreter: the shipped suite through one schedule.

``benchmarks/agent_bench.py`` starts this script once per schedule and repeat, each time in a cgroup of its own
when it can (so ``--cpu-file`` counts every process the run starts), and compares the reports.

    .venv/bin/python benchmarks/_agent_bench_worker.py --mode dispatcher --backend local --samples 4 --json

Every episode is the oracle policy (it writes the task's gold patch, applies it, submits) behind a
:class:`~skyrl_agent.llm.scripted.LatencyClient`; all episodes' clients share ONE
:class:`~skyrl_agent.llm.scripted.ModelledGPU`, so concurrent LLM calls queue for its slots. Each client's noise is
seeded by its episode id, so every schedule asks the GPU for the same work. Schedules:

- ``sequential``: one episode at a time: start a sandbox, run the agent, grade, release.
- ``naive``: the same per episode, one asyncio task per episode, all gathered at once.
- ``dispatcher``: :class:`~skyrl_agent.dispatch.Dispatcher` with stage limits (``--limits``).

Output: one JSON object on stdout (makespan, the GPU's accounting, CPU seconds, time per kind of work).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from _machine import read_cpu_seconds

from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.dispatch import Dispatcher, DispatcherConfig, Episode, StageLimits, Trace
from skyrl_agent.dispatch.context import RunContext
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.llm.scripted import LatencyClient, ModelledGPU, ScriptedClient, oracle_replies
from skyrl_agent.pipeline import SWEPipeline
from skyrl_agent.run import ORACLE_PATCH
from skyrl_agent.sandbox.base import SandboxBackend, SandboxSpec
from skyrl_agent.tasks import SWETask, load_suite

MODES = ("sequential", "naive", "dispatcher")
MAX_TURNS = 30
# Time per kind of work, from the episodes' trace spans (summed over episodes).
SPAN_KINDS = ("sandbox_start", "env_init", "llm_call", "tool_call", "grade", "release")
# RLIMIT_NPROC of the local backend counts every sandbox process of uid 1000 on the host, shared by all its
# sandboxes; the default of 256 is too few for the naive schedule's 2 × episodes shells at once.
PIDS_LIMIT = 8192


@dataclass(frozen=True)
class GPUParams:
    """The modelled inference server every episode shares."""

    slots: int  # sequences generated at once
    decode_ms: float  # per generated token of one sequence
    prefill_ms: float  # per prompt token
    overhead_ms: float  # per call
    jitter: float  # sigma of the log-normal noise on each call

    def build(self) -> ModelledGPU:
        return ModelledGPU(
            capacity=self.slots,
            decode_s_per_token=self.decode_ms / 1000,
            prefill_s_per_token=self.prefill_ms / 1000,
            overhead_s=self.overhead_ms / 1000,
            jitter=self.jitter,
        )


# --- The work of one episode ----------------------------------------------------------------------------------------


class Workload:
    """What every schedule runs: the stages of ``skyrl-agent run`` (:class:`SWEPipeline`) on sandboxes from
    ``backend``, with the oracle on the shared ``gpu``."""

    def __init__(self, backend: SandboxBackend, gpu: ModelledGPU) -> None:
        self.gpu = gpu
        self.resolved = 0
        pipeline = SWEPipeline(
            backend,
            agent=AgentConfig(max_turns=MAX_TURNS),
            spec=SandboxSpec(pids_limit=PIDS_LIMIT),
            on_finished=self._finished,
        )
        self.acquire, self.run_agent, self.grade, self.release = (
            pipeline.acquire,
            pipeline.run_agent,
            pipeline.grade,
            pipeline.release,
        )

    def llm(self, episode: Episode) -> LLMClient:
        task: SWETask = episode.data["task"]
        oracle = ScriptedClient(oracle_replies(task.gold_patch, workdir=".", patch_path=ORACLE_PATCH))
        return LatencyClient(oracle, gpu=self.gpu, seed=zlib.crc32(episode.id.encode()))

    def _finished(self, episode: Episode, resolved: bool) -> None:
        self.resolved += resolved


# --- Schedules ------------------------------------------------------------------------------------------------------


async def _one_episode(work: Workload, episode: Episode) -> tuple[Trace, float]:
    """Start → run → grade → release, as the dispatcher's stages do, with the same trace spans; (trace, seconds)."""
    start = time.monotonic()
    trace = Trace(episode.id)
    with trace.span("sandbox_start"):
        sandbox = await work.acquire(episode)
    try:
        ctx = RunContext(trace=trace)
        with trace.span("agent"):
            trajectory = await work.run_agent(episode, sandbox, work.llm(episode), ctx)
        with trace.span("grade"):
            await work.grade(episode, sandbox, trajectory)
    finally:
        with trace.span("release"):
            await work.release(sandbox)
    return trace, time.monotonic() - start


async def run_sequential(work: Workload, episodes: Sequence[Episode], limits: StageLimits) -> list[Trace]:
    traces = []
    for episode in episodes:
        trace, _ = await _one_episode(work, episode)
        traces.append(trace)
    return traces


async def run_naive(work: Workload, episodes: Sequence[Episode], limits: StageLimits) -> list[Trace]:
    done = await asyncio.gather(*(_one_episode(work, episode) for episode in episodes))
    return [trace for trace, _ in done]


async def run_dispatcher(work: Workload, episodes: Sequence[Episode], limits: StageLimits) -> list[Trace]:
    dispatcher = Dispatcher(work.acquire, work.run_agent, work.grade, work.release, work.llm, DispatcherConfig(limits))
    out = await dispatcher.run(episodes)
    failed = [r for r in out.results if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed in the dispatcher, e.g. {failed[0].error}")
    return [r.trace for r in out.results if r.trace is not None]


SCHEDULES: dict[str, Callable[[Workload, Sequence[Episode], StageLimits], Awaitable[list[Trace]]]] = {
    "sequential": run_sequential,
    "naive": run_naive,
    "dispatcher": run_dispatcher,
}


# --- Measuring ------------------------------------------------------------------------------------------------------


def host_busy_seconds() -> float:
    """CPU seconds the whole machine has spent not idle since boot (``/proc/stat``), every process counted."""
    with open("/proc/stat") as file:
        fields = [int(x) for x in file.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def make_backend(name: str, run_id: str) -> SandboxBackend:
    """The backend called ``name``; Docker sandboxes carry ``run_id`` and are reaped at exit."""
    if name == "docker":
        from skyrl_agent.sandbox import reaper
        from skyrl_agent.sandbox.docker_backend import DockerBackend

        reaper.install_reaper(run_id)
        backend: SandboxBackend = DockerBackend(run_id=run_id)  # type: ignore[assignment]
        return backend
    from skyrl_agent.tasks.validate import make_backend as by_name

    return by_name(name)


def span_totals(traces: Sequence[Trace]) -> dict[str, float]:
    totals = dict.fromkeys(SPAN_KINDS, 0.0)
    for trace in traces:
        for span in trace.spans:
            if span.name in totals:
                totals[span.name] += span.duration_s
    return totals


def episode_seconds(traces: Sequence[Trace]) -> list[float]:
    """Each episode's time from its sandbox start to its release's end."""
    return [max(s.end_s or 0.0 for s in t.spans) - min(s.start_s for s in t.named("sandbox_start")) for t in traces]


async def measure(args: argparse.Namespace, episodes: list[Episode], limits: StageLimits) -> dict[str, Any]:
    """Run the schedule once; the report without the run's identity."""
    gpu = args.gpu.build()
    backend = make_backend(args.backend, args.run_id)
    work = Workload(backend, gpu)
    cpu_before, host_before = read_cpu_seconds(args.cpu_file), host_busy_seconds()
    start = time.monotonic()
    try:
        traces = await SCHEDULES[args.mode](work, episodes, limits)
        makespan = time.monotonic() - start
    finally:
        await backend.close()
    cpu_after, host_after = read_cpu_seconds(args.cpu_file), host_busy_seconds()
    stats = gpu.stats()
    return {
        "makespan_s": makespan,
        "resolved": work.resolved,
        "cpu_s": None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
        "host_cpu_s": host_after - host_before,
        "gpu": {**asdict(stats), "capacity": gpu.capacity, "utilisation": gpu.utilisation(makespan)},
        "gpu_busy_fraction": stats.busy_s / makespan,
        "span_totals_s": span_totals(traces),
        "episode_s": episode_seconds(traces),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--backend", choices=("docker", "local", "process"), default="local")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task")
    parser.add_argument("--tasks", type=int, default=0, help="the first N tasks of the suite only (0: all)")
    parser.add_argument("--gpu", default="8,3.5,0.05,20,0.2", help="slots,decode_ms,prefill_ms,overhead_ms,jitter")
    parser.add_argument("--limits", default="2,10,2,2", help="dispatcher stage limits: acquire,run,grade,prefetch")
    parser.add_argument("--run-id", default=f"agent-bench-worker-{os.getpid()}", help="label of Docker sandboxes")
    parser.add_argument("--cpu-file", help="cgroup CPU usage file to read before and after the run")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line")
    args = parser.parse_args(argv)
    slots, decode, prefill, overhead, jitter = (float(x) for x in args.gpu.split(","))
    args.gpu = GPUParams(int(slots), decode, prefill, overhead, jitter)
    return args


def parse_limits(text: str) -> StageLimits:
    acquire, run, grade_, prefetch = (int(x) for x in text.split(","))
    return StageLimits(acquire=acquire, run=run, grade=grade_, prefetch=prefetch)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tasks = load_suite()[: args.tasks or None]
    # Episodes in task-major order, as `skyrl-agent run` builds them: a group's samples are adjacent.
    episodes = [
        Episode(f"{task.id}#{k}", {"task": task, "task_id": task.id}, task.id)
        for task in tasks
        for k in range(args.samples)
    ]
    limits = parse_limits(args.limits)
    report = asyncio.run(measure(args, episodes, limits))
    report.update(
        mode=args.mode,
        backend=args.backend,
        tasks=len(tasks),
        samples=args.samples,
        episodes=len(episodes),
        gpu_params=asdict(args.gpu),
        limits=asdict(limits) if args.mode == "dispatcher" else None,
    )
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0 if report["resolved"] == len(episodes) else 1


if __name__ == "__main__":
    sys.exit(main())
