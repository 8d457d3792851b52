"""The child processes of ``benchmarks/chaos_bench.py``: one dispatcher run per process.

    .venv/bin/python benchmarks/_chaos_worker.py docker --ids-file IDS.json --out OUTCOMES.jsonl --run-id RUN
    .venv/bin/python benchmarks/_chaos_worker.py sim --episodes 1000 --backend modelled [--memory]
    .venv/bin/python benchmarks/_chaos_worker.py throttle --seconds 3

Every episode is the same scripted policy: four shell commands through the ReAct agent and
:class:`~skyrl_agent.agents.tool_env.SandboxToolEnv` (the env ends the episode after the fourth), then a cheap
grade: every command exited 0 and, on Docker, ``out.txt`` holds what the commands wrote.

``docker``: the episodes of ``--ids-file`` on the Docker backend wrapped by the fault injector
(:mod:`skyrl_agent.sandbox.faults`): sandboxes killed from the host, hung commands, failing daemon API calls.
Each episode's outcome is appended to ``--out`` (one JSON line, one ``write``) the moment the dispatcher decides
it, so a SIGKILL loses no decided outcome. The reaper is installed first: it removes the containers of dead runs
(a SIGKILLed predecessor's) before anything starts. Prints ``@started {json}`` once ready, ``@done {json}`` at
the end.

``sim``: ``--episodes`` episodes at once through the dispatcher, all held live while it is paused (as during a
weight sync), then resumed; sandboxes are modelled (``modelled``: no process; start ≈350 ms log-normal behind a
5/s start limit, 1% of commands hang) or the in-memory backend behind the same start model (``memory``: two real
processes per sandbox). The modelled runs use an accelerated event loop: waits with nothing else to do are
skipped, CPU work takes real time. Prints one JSON object.

``throttle``: the CPU the dispatcher's sandbox-start rate limiter (asyncio-throttle) uses while starts wait.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import math
import os
import random
import re
import resource
import selectors
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from skyrl_agent.agents.actions import bash_block
from skyrl_agent.agents.react import AgentConfig, ReActAgent, Trajectory
from skyrl_agent.agents.tool_env import SandboxToolEnv
from skyrl_agent.dispatch import (
    Backoff,
    Dispatcher,
    DispatcherConfig,
    Episode,
    EpisodeResult,
    GradeResult,
    PausableClock,
    RunContext,
    StageLimits,
    Timeouts,
)
from skyrl_agent.dispatch.dispatcher import TrajectoryLike
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.llm.scripted import LatencyClient, ModelledGPU, ScriptedClient
from skyrl_agent.sandbox.base import CommandResult, Sandbox, SandboxBackend, SandboxSpec, Snapshot
from skyrl_agent.sandbox.faults import FaultPlan, FaultyBackend, FlakyCalls

# --- The episode ------------------------------------------------------------------------------------------------------

COMMANDS = (
    "echo start > out.txt && uname -s",
    "python3 -c 'print(sum(range(10**5)))' >> out.txt",
    "sleep 0.2 && ls -la",
    "echo done >> out.txt && wc -l out.txt",
)
EXPECTED = b"start\n4999950000\ndone\n"  # out.txt when no command hung
PROMPT = [{"role": "user", "content": "Run the four commands you were given, one per turn."}]


def scripted_policy() -> ScriptedClient:
    """The four commands, one per reply (stateless: one client serves every episode)."""
    return ScriptedClient([f"Next command.\n{bash_block(command)}" for command in COMMANDS])


async def run_agent(
    workdir: str, command_timeout_s: float, episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext
) -> Trajectory:
    """The ReAct agent on the borrowed sandbox; the env ends the episode after the last command."""
    env = SandboxToolEnv(sandbox, workdir=workdir, command_timeout_s=command_timeout_s, max_turns=len(COMMANDS))
    return await ReActAgent(llm, env, AgentConfig(max_turns=len(COMMANDS) + 1)).run(PROMPT, ctx)


async def grade(check_file: bool, episode: Episode, sandbox: Sandbox, trajectory: TrajectoryLike) -> GradeResult:
    """Resolved when every command exited 0 (and, with ``check_file``, ``out.txt`` is as expected)."""
    turns = getattr(trajectory, "turns", [])
    ok = len(turns) == len(COMMANDS) and all(
        str(turn.observations[0]["content"]).startswith("exit code 0\n") for turn in turns if turn.observations
    )
    if check_file:
        ok = ok and await sandbox.read_file("out.txt") == EXPECTED
    return GradeResult(float(ok), ok)


async def release(sandbox: Sandbox) -> None:
    """Close the sandbox."""
    await sandbox.close()


class RecordingDispatcher(Dispatcher):
    """A :class:`Dispatcher` that hands each episode's final result to ``on_result`` as soon as it is decided.

    ``Dispatcher.run`` returns results only when every episode is done; a run that may be killed needs them one by
    one. The hook wraps the per-episode supervisor, which returns an episode's result after its last attempt.
    """

    def __init__(self, *args: Any, on_result: Callable[[EpisodeResult], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_result = on_result

    async def _supervise(self, episode: Episode, *args: Any, **kwargs: Any) -> EpisodeResult:
        result = await super()._supervise(episode, *args, **kwargs)
        self._on_result(result)
        return result


def outcome_counts(results: Sequence[EpisodeResult]) -> dict[str, int]:
    return dict(collections.Counter(str(r.outcome) for r in results))


# --- docker: the fault-injected run -----------------------------------------------------------------------------------


def _docker_api_object(value: Any) -> bool:
    """The docker SDK's client and model objects (not its sockets or streams): what the flaky proxy wraps."""
    module = type(value).__module__
    return module.startswith(("docker.models.", "docker.client", "docker.api."))


async def _containers_of_run(run_id: str, wait_s: float = 60.0) -> list[dict[str, str]] | None:
    """The containers of ``run_id`` the daemon lists, asking again while it does not answer (None: never)."""
    from skyrl_agent.sandbox import docker_backend
    from skyrl_agent.sandbox.base import SandboxUnavailableError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            containers = await asyncio.to_thread(docker_backend.containers_of_run, run_id)
        except SandboxUnavailableError:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(1.0)
        else:
            return [{"id": c.short_id, "name": c.name, "status": c.status} for c in containers]


def _record_line(fd: int, run_id: str, result: EpisodeResult) -> None:
    trace = result.trace
    starts = len(trace.named("sandbox_start")) if trace is not None else 0
    record = {
        "episode": result.episode.id,
        "outcome": str(result.outcome),
        "attempts": result.attempts,
        "sandbox_starts": starts,
        "run_id": run_id,
        "error": result.error,
        "unix_s": time.time(),
    }
    os.write(fd, (json.dumps(record) + "\n").encode())  # one write of one line: a SIGKILL cannot tear it


async def docker_run(args: argparse.Namespace) -> dict[str, Any]:
    import docker.errors

    from skyrl_agent.sandbox import docker_backend

    ids = json.loads(Path(args.ids_file).read_text())
    backend = docker_backend.DockerBackend(run_id=args.run_id)
    api_rng = random.Random(f"{args.seed}:daemon:{args.run_id}")
    flaky = FlakyCalls(
        await asyncio.to_thread(docker_backend.connect),
        p=args.daemon_error_p,
        error=lambda name: docker.errors.APIError(f"injected fault: {name} failed"),
        rng=api_rng,
        wrap=_docker_api_object,
    )
    # DockerBackend connects on first use; a client set before that is the one it uses.
    backend._client = flaky
    killer = await asyncio.to_thread(docker_backend.connect)  # crashes come from the host, through a clean client

    async def crash(sandbox: Sandbox) -> None:
        await asyncio.to_thread(killer.api.kill, sandbox.container.id)  # type: ignore[attr-defined]

    plan = FaultPlan(seed=args.seed, crash_p=args.crash_p, hang_p=args.hang_p, crash_at=(2, len(COMMANDS)))
    faulty = FaultyBackend(backend, plan, crash=crash)
    spec = SandboxSpec(memory_mb=256, pids_limit=64, labels={"skyrl.chaos": "1"})

    async def acquire(episode: Episode) -> Sandbox:
        return await faulty.create(spec, key=episode.id, episode=episode.id)

    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    acquire_n, run_n, grade_n, prefetch_n = (int(x) for x in args.limits.split(","))
    config = DispatcherConfig(
        limits=StageLimits(acquire=acquire_n, run=run_n, grade=grade_n, prefetch=prefetch_n),
        timeouts=Timeouts(episode_s=300, llm_call_s=30, tool_call_s=60, sandbox_start_s=60, grade_s=60),
        backoff=Backoff(base_s=0.5, max_s=5.0),
        seed=args.seed,
    )
    dispatcher = RecordingDispatcher(
        acquire,
        partial(run_agent, "/workspace", args.command_timeout_s),
        partial(grade, True),
        release,
        scripted_policy(),
        config,
        on_result=partial(_record_line, fd, args.run_id),
    )
    start = time.monotonic()
    try:
        out = await dispatcher.run([Episode(i) for i in ids])
    finally:
        os.close(fd)
    # Counted before the backend's close and the exit reaper: what the dispatcher's releases left.
    left_after_dispatch = await _containers_of_run(args.run_id)
    close_error = None
    try:
        await backend.close()
    except Exception as exc:
        close_error = repr(exc)
    left_after_close = await _containers_of_run(args.run_id)
    return {
        "episodes": len(ids),
        "results": len(out.results),
        "distinct_results": len({r.episode.id for r in out.results}),
        "outcomes": outcome_counts(out.results),
        "metrics": out.metrics,
        "injected": {**faulty.injected, **flaky.injected},
        "containers_left_after_dispatch": None if left_after_dispatch is None else len(left_after_dispatch),
        "containers_left_after_close": None if left_after_close is None else len(left_after_close),
        "leftovers_after_dispatch": left_after_dispatch,
        "leaked": list(backend.leaked),
        "close_error": close_error,
        "wall_s": time.monotonic() - start,
    }


def docker_main(args: argparse.Namespace) -> int:
    from skyrl_agent.sandbox import reaper

    reaper.install_reaper(args.run_id)  # reaps dead runs now, and this run at exit and on SIGTERM/SIGINT
    print("@started " + json.dumps({"pid": os.getpid(), "run_id": args.run_id}), flush=True)
    report = asyncio.run(docker_run(args))
    print("@done " + json.dumps(report), flush=True)
    return 0


# --- sim: the scale simulation ----------------------------------------------------------------------------------------


class _SkipIdleSelector:
    """A selector that, when the loop would sleep until its next timer with no I/O ready, skips the sleep."""

    def __init__(self) -> None:
        self._inner = selectors.DefaultSelector()
        self.skipped_s = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O (or another thread) can wake the loop
            return self._inner.select(None)
        self.skipped_s += timeout
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class AcceleratedLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock runs real time plus every idle wait it skipped.

    Work takes the CPU time it takes; a wait for a timer with nothing else to do costs nothing. Everything that
    waits through the loop (``asyncio.sleep``, ``wait_for``, the dispatcher's deadlines, the modelled GPU)
    sees the loop's time. Only for code without real I/O: a wait on a process or socket would be skipped too.
    """

    def __init__(self) -> None:
        self._skipper = _SkipIdleSelector()
        super().__init__(self._skipper)  # type: ignore[arg-type]

    def time(self) -> float:
        return super().time() + self._skipper.skipped_s


@dataclass(frozen=True)
class LogNormal:
    """A log-normal duration in seconds: ``median`` and the sigma of its logarithm."""

    median_s: float
    sigma: float

    @property
    def mean_s(self) -> float:
        return self.median_s * math.exp(self.sigma**2 / 2)

    def draw(self, rng: random.Random) -> float:
        return self.median_s * rng.lognormvariate(0.0, self.sigma)


@dataclass(frozen=True)
class SandboxModel:
    """Latencies of a modelled sandbox backend (seconds)."""

    start: LogNormal = LogNormal(0.30, 0.55)  # mean ≈ 0.35 s, p99 ≈ 1.1 s
    start_rate_per_s: float = 5.0  # the daemon starts one sandbox per 1/rate s at most
    command: LogNormal = LogNormal(0.015, 0.5)
    file_s: float = 0.002
    close: LogNormal = LogNormal(0.08, 0.4)


_SLEEP = re.compile(r"^sleep ([0-9.]+)$")


class ModelledSandbox:
    """No process: each call waits its modelled time. ``sleep N`` waits N s, or ``timeout_s`` and times out."""

    def __init__(self, backend: ModelledBackend, n: int) -> None:
        self.id = f"modelled-{n}"
        self._backend = backend
        self._files: dict[str, bytes] = {}

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        match = _SLEEP.match(command)
        duration = float(match.group(1)) if match else self._backend.model.command.draw(self._backend.rng)
        if duration > timeout_s:
            await asyncio.sleep(timeout_s)
            return CommandResult("", -1, timed_out=True, duration_s=timeout_s)
        await asyncio.sleep(duration)
        return CommandResult("", 0, duration_s=duration)

    async def read_file(self, path: str) -> bytes:
        await asyncio.sleep(self._backend.model.file_s)
        return self._files[path]

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        await asyncio.sleep(self._backend.model.file_s)
        self._files[path] = data.encode() if isinstance(data, str) else data

    async def snapshot(self) -> Snapshot:
        raise NotImplementedError("modelled sandboxes take no snapshots")

    async def close(self) -> None:
        await asyncio.sleep(self._backend.model.close.draw(self._backend.rng))


class ModelledBackend:
    """Modelled starts (a rate limit, then a log-normal start), of modelled sandboxes or of ``inner``'s."""

    name = "modelled"

    def __init__(self, model: SandboxModel, seed: int, inner: SandboxBackend | None = None) -> None:
        self.model, self.inner = model, inner
        self.rng = random.Random(seed)
        self._next_start = -math.inf
        self.created = 0
        self.starting = 0

    async def create(self, spec: SandboxSpec) -> Sandbox:
        self.starting += 1
        try:
            now = asyncio.get_running_loop().time()
            begin = max(now, self._next_start)
            self._next_start = begin + 1.0 / self.model.start_rate_per_s
            await asyncio.sleep(begin - now + self.model.start.draw(self.rng))
            self.created += 1
            return ModelledSandbox(self, self.created) if self.inner is None else await self.inner.create(spec)
        finally:
            self.starting -= 1

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[Sandbox]:
        raise NotImplementedError("modelled backends do not fork")

    async def close(self) -> None:
        if self.inner is not None:
            await self.inner.close()


@dataclass(frozen=True)
class SimParams:
    """One scale run."""

    episodes: int
    backend: str  # "modelled" or "memory"
    memory: bool  # trace allocations (tracemalloc) for the memory per idle episode; slows the run
    hang_p: float = 0.01
    command_timeout_s: float = 5.0
    gpu_slots: int = 64
    decode_ms: float = 2.0
    overhead_ms: float = 20.0
    seed: int = 0
    model: SandboxModel = field(default_factory=SandboxModel)


class GCTimer:
    """CPU seconds spent in the cyclic garbage collector (from ``gc.callbacks``), and its collections."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.cpu_s += time.process_time() - self._started
            self.collections[info["generation"]] += 1


def rss_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _live_idle(dispatcher: Dispatcher, backend: ModelledBackend, n: int) -> None:
    """Wait until ``n`` episodes hold a sandbox and wait for the paused LLM (none is starting or running a tool)."""
    while dispatcher.gauges["run"].current < n or backend.starting:
        await asyncio.sleep(0.5)
    await asyncio.sleep(0.5)  # the last ones reach their first LLM call


async def sim_run(p: SimParams) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    gpu = ModelledGPU(
        capacity=p.gpu_slots, decode_s_per_token=p.decode_ms / 1000, overhead_s=p.overhead_ms / 1000, clock=loop.time
    )
    policy = scripted_policy()

    def llm(episode: Episode) -> LLMClient:
        return LatencyClient(policy, gpu=gpu, seed=zlib.crc32(episode.id.encode()))

    inner = None
    if p.backend == "memory":
        from skyrl_agent.sandbox.memory import InMemoryBackend

        inner = InMemoryBackend()
    modelled = ModelledBackend(p.model, p.seed, inner)
    faulty = FaultyBackend(modelled, FaultPlan(seed=p.seed, hang_p=p.hang_p))
    spec = SandboxSpec()

    async def acquire(episode: Episode) -> Sandbox:
        return await faulty.create(spec, key=episode.id)

    config = DispatcherConfig(limits=StageLimits(run=p.episodes), seed=p.seed)
    dispatcher = Dispatcher(
        acquire,
        partial(run_agent, ".", p.command_timeout_s),
        partial(grade, False),
        release,
        llm,
        config,
        clock=PausableClock(loop.time),
    )
    episodes = [Episode(f"ep{i:05d}") for i in range(p.episodes)]
    gc.collect()
    traced0, rss0 = (tracemalloc.get_traced_memory()[0] if p.memory else 0), rss_bytes()
    gc_timer = GCTimer()
    gc.callbacks.append(gc_timer)
    cpu0, virtual0, real0 = time.process_time(), loop.time(), time.perf_counter()
    dispatcher.pause()
    running = asyncio.ensure_future(dispatcher.run(episodes))
    await _live_idle(dispatcher, modelled, p.episodes)
    ramp_virtual_s, ramp_cpu_s = loop.time() - virtual0, time.process_time() - cpu0
    gc.collect()
    traced1, rss1 = (tracemalloc.get_traced_memory()[0] if p.memory else 0), rss_bytes()
    dispatcher.resume()
    out = await running
    cpu_s, virtual_s, real_s = time.process_time() - cpu0, loop.time() - virtual0, time.perf_counter() - real0
    gc.callbacks.remove(gc_timer)
    await modelled.close()
    gpu_stats = gpu.stats()
    return {
        "episodes": p.episodes,
        "backend": p.backend,
        "memory_traced": p.memory,
        "clock": "accelerated" if isinstance(loop, AcceleratedLoop) else "real",
        "results": len(out.results),
        "outcomes": outcome_counts(out.results),
        "retries": out.metrics["retries"],
        "hangs": faulty.injected["hang"],
        "live_idle": dispatcher.gauges["run"].peak,
        "cpu_s": cpu_s,
        "wall_s": virtual_s,  # the run's time as the episodes saw it
        "real_wall_s": real_s,
        "ramp_wall_s": ramp_virtual_s,
        "ramp_cpu_s": ramp_cpu_s,
        "cpu_ms_per_episode": 1000 * cpu_s / p.episodes,
        "gc_cpu_s": gc_timer.cpu_s,
        "gc_collections": gc_timer.collections,
        "cpu_ms_per_episode_without_gc": 1000 * (cpu_s - gc_timer.cpu_s) / p.episodes,
        "overhead_fraction": cpu_s / virtual_s,
        "traced_bytes_per_idle_episode": (traced1 - traced0) / p.episodes if p.memory else None,
        "rss_bytes_per_idle_episode": (rss1 - rss0) / p.episodes,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "gpu": {**asdict(gpu_stats), "capacity": gpu.capacity},
        "params": {**asdict(p), "model": asdict(p.model)},
    }


def sim_main(args: argparse.Namespace) -> int:
    # Real commands of 100 sandboxes at once on a shared 2-core host take seconds: a longer timeout there.
    timeout_s = 5.0 if args.backend == "modelled" else 20.0
    params = SimParams(args.episodes, args.backend, args.memory, command_timeout_s=timeout_s, seed=args.seed)
    if params.memory:
        tracemalloc.start()
    # The real backend does I/O with processes, which an accelerated loop would skip past: real time there.
    factory = AcceleratedLoop if params.backend == "modelled" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        report = runner.run(sim_run(params))
    print(json.dumps(report), flush=True)
    return 0 if report["results"] == params.episodes else 1


# --- throttle: the rate limiter's idle cost ---------------------------------------------------------------------------


async def throttle_run(seconds: float, waiters: int, rate: int) -> dict[str, Any]:
    from asyncio_throttle.throttler import Throttler

    throttler = Throttler(rate)  # as the dispatcher builds it for StageLimits.acquire_rate_per_s
    passed = 0

    async def starter() -> None:
        nonlocal passed
        while True:
            async with throttler:
                passed += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    tasks = [asyncio.ensure_future(starter()) for _ in range(waiters)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "waiters": waiters,
        "rate_per_s": rate,
        "starts": passed,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "cpu_fraction": cpu_s / wall_s,
    }


def throttle_main(args: argparse.Namespace) -> int:
    print(json.dumps(asyncio.run(throttle_run(args.seconds, args.waiters, args.rate))), flush=True)
    return 0


# --- main -------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    d = modes.add_parser("docker", help="fault-injected episodes on the Docker backend")
    d.add_argument("--ids-file", required=True, help="JSON list of episode ids to run")
    d.add_argument("--out", required=True, help="JSONL file each outcome is appended to")
    d.add_argument("--run-id", required=True, help="the skyrl.run label of this run's containers")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--crash-p", type=float, default=0.2, help="fraction of sandboxes killed from the host")
    d.add_argument("--hang-p", type=float, default=0.1, help="fraction of commands that sleep past their timeout")
    d.add_argument("--daemon-error-p", type=float, default=0.05, help="fraction of daemon API calls that fail")
    d.add_argument("--command-timeout-s", type=float, default=1.0, help="each command's timeout in the sandbox")
    d.add_argument("--limits", default="2,6,2,2", help="dispatcher stage limits: acquire,run,grade,prefetch")
    s = modes.add_parser("sim", help="the scale simulation")
    s.add_argument("--episodes", type=int, required=True, help="episodes at once")
    s.add_argument("--backend", choices=("modelled", "memory"), default="modelled")
    s.add_argument("--memory", action="store_true", help="trace allocations (memory per idle episode)")
    s.add_argument("--seed", type=int, default=0)
    t = modes.add_parser("throttle", help="the rate limiter's CPU while starts wait")
    t.add_argument("--seconds", type=float, default=3.0)
    t.add_argument("--waiters", type=int, default=8, help="starts waiting at once (StageLimits.acquire)")
    t.add_argument("--rate", type=int, default=5, help="starts per second")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return {"docker": docker_main, "sim": sim_main, "throttle": throttle_main}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
