"""Setting up a GRPO group's sandboxes: one prepared sandbox forked n − 1 times, against n independent preparations.

    .venv/bin/python benchmarks/group_fork_bench.py                         # docker, n=8, 3 tasks, 2 rounds
    .venv/bin/python benchmarks/group_fork_bench.py --backend local --tasks-limit 2 --rounds 1   # smoke run

Workload: for each of the first ``--tasks-limit`` tasks of ``--tasks`` (default the shipped suite; the real-package
suite once ``skyrl-agent tasks build-real`` has written it), one group of ``--n`` samples, started at once under
``--starts`` concurrent starts (the dispatcher's ``StageLimits.acquire``). Sides, alternating per round so drifts in
the machine's load hit both alike:

- ``independent``: each sample creates its sandbox and prepares the workspace (what every sample did before);
- ``fork``: :class:`~skyrl_agent.sandbox.group_fork.GroupForks`: one sample creates, prepares and snapshots, the
  others fork the snapshot.

Reported (never asserted): per side the median wall seconds until the whole group is ready, and the ratio
independent ÷ fork; then where the time goes, the median seconds of one call of each phase per side: ``create``
(a sandbox from the task's image), ``prepare`` (:func:`~skyrl_agent.tasks.workspace.prepare_workspace`),
``snapshot`` and ``fork`` (one call of ``backend.fork(snapshot, 1, spec)``, i.e. per forked sample). Calls overlap
(up to ``--starts`` at once), so per-call seconds do not add up to the wall seconds. Output: the tables on stdout
and ``--output`` (default ``benchmarks/results/group_fork_bench.json``). Sandbox closes are not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _machine import host_info

from skyrl_agent.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from skyrl_agent.sandbox.group_fork import GroupForks
from skyrl_agent.tasks import SUITE_PATH, load_tasks
from skyrl_agent.tasks.format import SWETask
from skyrl_agent.tasks.validate import make_backend
from skyrl_agent.tasks.workspace import prepare_workspace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "group_fork_bench.json"
SIDES = ("independent", "fork")
PHASES = ("create", "prepare", "snapshot", "fork")
Phases = dict[str, list[float]]  # phase → seconds of each of its calls


class _Timed:
    """``inner`` (a backend or a sandbox) with the calls of the coroutine methods in ``timed`` noted in ``phases``.

    It is how the benchmark sees the phases :class:`GroupForks` goes through (``backend.create``, ``sandbox.snapshot``,
    ``backend.fork``); a created sandbox is wrapped in turn so that its ``snapshot`` is timed. Everything else is
    ``inner``'s own attribute (``name``, ``discard_snapshot``, ``id``…).
    """

    def __init__(self, inner: Any, phases: Phases, timed: dict[str, str]) -> None:
        self._inner, self._phases, self._timed = inner, phases, timed

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self._timed:
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = await attr(*args, **kwargs)
            self._phases[self._timed[name]].append(time.perf_counter() - start)
            return _Timed(result, self._phases, {"snapshot": "snapshot"}) if name == "create" else result

        return call


async def _limited(gate: asyncio.Semaphore, start: Callable[[], Awaitable[Sandbox]]) -> Sandbox:
    async with gate:
        return await start()


async def _timed_prepare(task: SWETask, phases: Phases, sandbox: Sandbox) -> str:
    start = time.perf_counter()
    base = await prepare_workspace(task, sandbox)
    phases["prepare"].append(time.perf_counter() - start)
    return base


async def _group(side: str, backend: SandboxBackend, task: SWETask, n: int, starts: int, phases: Phases) -> float:
    """Wall seconds until all ``n`` sandboxes of one group of ``task`` are ready (closed afterwards, untimed).

    The seconds of each phase's calls are added to ``phases``.
    """
    spec = SandboxSpec(image=task.base_image, workdir=task.workdir, labels={"skyrl.task": task.id})
    gate = asyncio.Semaphore(starts)
    timed: Any = _Timed(backend, phases, {"create": "create", "fork": "fork"})
    forks = GroupForks(timed, sizes={task.id: n})
    prepare = functools.partial(_timed_prepare, task, phases)

    async def one() -> Sandbox:
        if side == "independent":
            sandbox: Sandbox = await timed.create(spec)
            await prepare(sandbox)
            return sandbox
        return (await forks.acquire(task.id, spec, prepare)).sandbox

    begin = time.perf_counter()
    sandboxes = await asyncio.gather(*(_limited(gate, one) for _ in range(n)))
    elapsed = time.perf_counter() - begin
    for sandbox in sandboxes:
        await sandbox.close()
        await forks.released(sandbox)
    await forks.close()
    return elapsed


async def _measure(args: argparse.Namespace) -> tuple[dict[str, dict[str, list[float]]], dict[str, Phases]]:
    """Per side, the wall seconds of each group by task, and the seconds of each call by phase."""
    tasks = load_tasks(args.tasks)[: args.tasks_limit]
    backend = make_backend(args.backend, run_id="group-fork-bench")
    times: dict[str, dict[str, list[float]]] = {side: {task.id: [] for task in tasks} for side in SIDES}
    phases: dict[str, Phases] = {side: defaultdict(list) for side in SIDES}
    try:
        for round_index in range(args.rounds):
            for task in tasks:
                for side in SIDES if round_index % 2 == 0 else tuple(reversed(SIDES)):
                    seconds = await _group(side, backend, task, args.n, args.starts, phases[side])
                    times[side][task.id].append(seconds)
    finally:
        await backend.close()
    return times, {side: dict(per) for side, per in phases.items()}


def _print_phases(phases: dict[str, Phases]) -> dict[str, dict[str, float]]:
    """Print the median seconds of one call of each phase per side; returns them."""
    medians = {side: {phase: statistics.median(calls) for phase, calls in per.items() if calls}
               for side, per in phases.items()}  # fmt: skip
    print(f"\nseconds per call (median)          {''.join(f'{phase:>9}' for phase in PHASES)}")
    for side, per in medians.items():
        cells = "".join(f"{per[phase]:>9.3f}" if phase in per else f"{'-':>9}" for phase in PHASES)
        print(f"{side:<34} {cells}")
    return medians


def _default_backend() -> str:
    return "docker" if shutil.which("docker") else "process"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("docker", "local", "process"), default=_default_backend())
    parser.add_argument("--tasks", type=Path, default=SUITE_PATH)
    parser.add_argument("--tasks-limit", type=int, default=3)
    parser.add_argument("--n", type=int, default=8, help="samples per group")
    parser.add_argument("--starts", type=int, default=8, help="sandbox starts at once")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    times, phases = asyncio.run(_measure(args))
    medians = {side: {task: statistics.median(values) for task, values in per.items()} for side, per in times.items()}
    print(f"setup seconds per group of n={args.n} ({args.backend}, {args.starts} starts at once, {args.rounds} rounds)")
    print(f"{'task':<34} {'independent':>12} {'fork':>8} {'ratio':>6}")
    for task in medians["fork"]:
        independent, fork = medians["independent"][task], medians["fork"][task]
        print(f"{task:<34} {independent:>12.2f} {fork:>8.2f} {independent / fork:>5.1f}x")
    overall = {side: statistics.median(list(per.values())) for side, per in medians.items()}
    ratio = overall["independent"] / overall["fork"]
    print(f"{'median':<34} {overall['independent']:>12.2f} {overall['fork']:>8.2f} {ratio:>5.1f}x")
    phase_medians = _print_phases(phases)
    result = {"backend": args.backend, "n": args.n, "starts": args.starts, "rounds": args.rounds,
              "tasks": str(args.tasks), "times_s": times, "median_s": medians, "overall_median_s": overall,
              "ratio": ratio, "phase_calls_s": phases, "phase_median_s": phase_medians,
              "host": host_info()}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
