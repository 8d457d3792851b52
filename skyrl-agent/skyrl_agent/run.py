"""``skyrl-agent run``: every task through the dispatcher (acquire sandbox → run agent → grade), saved to disk.

Writes ``trajectories.jsonl`` (one episode per line: messages, per-turn actions, observations, token ids and
logprobs, outcome, reward, grade and trace spans) and ``summary.json`` (episodes per outcome, resolved rate, wall
time and time totals) into the output directory. With ``--harness`` an unmodified agent program plays the episodes
instead of the built-in ReAct agent (:mod:`skyrl_agent.harness`; its lines add the harness's exit status and the
gateway's recorded token ids per reply).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from skyrl_agent.agents.react import AgentConfig, Trajectory
from skyrl_agent.dispatch import DispatcherConfig, DispatchResult, Episode, EpisodeResult, StageLimits
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.pipeline import SWEPipeline
from skyrl_agent.sandbox.base import SandboxBackend
from skyrl_agent.tasks.format import SWETask

__all__ = ["RunOptions", "make_llm", "run_tasks", "summarize"]

SCRIPTED = ("oracle", "null", "latency-oracle")
# The oracle writes its patch inside .git (outside the work tree, so never part of the diff), by relative path.
ORACLE_PATCH = ".git/skyrl-gold.patch"


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What ``skyrl-agent run`` was asked for."""

    model: str
    out: Path
    concurrency: int = 4
    samples: int = 1
    max_turns: int = 30
    served_model: str = "default"
    run_id: str = "skyrl-run"
    harness: str | None = None  # an unmodified agent program (see skyrl_agent.harness) instead of the ReAct agent


def make_llm(model: str, served_model: str = "default") -> LLMClient | Any:
    """The client for ``--model``: ``scripted:NAME`` or an OpenAI-compatible base URL.

    The oracle needs each task's gold patch, so for it this returns a function of the episode.
    """
    from skyrl_agent.llm.scripted import LatencyClient, ModelledGPU, ScriptedClient, null_policy, oracle_replies

    if model.startswith("scripted:"):
        name = model.split(":", 1)[1]

        def oracle(episode: Episode) -> LLMClient:
            task: SWETask = episode.data["task"]
            return ScriptedClient(oracle_replies(task.gold_patch, workdir=".", patch_path=ORACLE_PATCH))

        if name == "oracle":
            return oracle
        if name == "null":
            return null_policy()
        if name == "latency-oracle":
            gpu = ModelledGPU()  # one server for the whole run: episodes queue for its slots as on a real one
            # crc32, not hash(): the same episode gets the same modelled delays in every process.
            return lambda episode: LatencyClient(oracle(episode), gpu=gpu, seed=zlib.crc32(episode.id.encode()))
        raise ValueError(f"unknown scripted policy {name!r}; choose one of {', '.join(SCRIPTED)}")
    if model.startswith(("http://", "https://")):
        from skyrl_agent.llm.openai import OpenAIClient

        return OpenAIClient(base_url=model.rstrip("/"), model=served_model)
    raise ValueError(f"--model must be scripted:{{{'|'.join(SCRIPTED)}}} or an http(s) base URL; got {model!r}")


def episode_record(result: EpisodeResult) -> dict[str, Any]:
    """One line of ``trajectories.jsonl``."""
    from skyrl_agent.harness.episodes import HarnessTrajectory

    trajectory = result.trajectory if isinstance(result.trajectory, Trajectory) else None
    grade_details = dict(result.grade.details) if result.grade else None
    record: dict[str, Any] = {
        "episode_id": result.episode.id,
        "task_id": result.episode.data.get("task_id"),
        "group_id": result.episode.group_id,
        "outcome": result.outcome.value,
        "reward": result.reward,
        "resolved": bool(result.grade and result.grade.resolved),
        "treatment": result.treatment.value,
        "attempts": result.attempts,
        "error": result.error,
        "grade": grade_details,
        "trace": result.trace.to_dict() if result.trace else None,
    }
    if trajectory is not None:
        record.update(
            finish_reason=trajectory.finish_reason,
            submission=trajectory.submission,
            messages=trajectory.messages,
            turns=[
                {
                    "text": turn.completion.text,
                    "action": None if turn.action is None else {
                        "type": type(turn.action).__name__, **dataclasses.asdict(turn.action)
                    },
                    "observations": turn.observations,
                    "token_ids": turn.completion.token_ids,
                    "logprobs": turn.completion.logprobs,
                    "prompt_token_ids": turn.completion.prompt_token_ids,
                    "finish_reason": turn.completion.finish_reason,
                    "usage": dataclasses.asdict(turn.completion.usage),
                }
                for turn in trajectory.turns
            ],
        )  # fmt: skip
    if isinstance(result.trajectory, HarnessTrajectory):
        record.update(harness_record(result.trajectory))
    return record


def harness_record(trajectory: Any) -> dict[str, Any]:
    """A harness episode's part of its line: the harness's conversation and, per model call, what was sampled.

    ``turns`` holds one entry per recorded reply (none when the model server records nothing): its sampled
    ``token_ids`` and ``logprobs``, and the ``prompt_token_ids`` before it, as the gateway recorded them.
    """
    turns = []
    for sample in trajectory.samples:
        for turn in sample.turns:
            context = list(sample.prompt_ids) + list(sample.response_ids[: turn.start])
            turns.append({
                "token_ids": list(sample.response_ids[turn.start : turn.end]),
                "logprobs": list(sample.logprobs[turn.start : turn.end]),
                "prompt_token_ids": context,
                "finish_reason": turn.stop_reason,
                "policy_version": turn.policy_version,
            })  # fmt: skip
    return {
        "finish_reason": trajectory.finish_reason,
        "submission": trajectory.submission,
        "messages": trajectory.result.messages,
        "harness": {"exit_status": trajectory.result.exit_status, "model_calls": trajectory.result.model_calls,
                    "submitted": trajectory.result.submitted, "error": trajectory.result.error,
                    "commands": trajectory.commands, "samples": len(trajectory.samples)},
        "turns": turns,
    }  # fmt: skip


def summarize(results: Sequence[EpisodeResult], wall_s: float) -> dict[str, Any]:
    """Episodes per outcome, the resolved rate, wall time and time totals (seconds) by kind of work."""
    outcomes = Counter(result.outcome.value for result in results)
    kinds = {"sandbox_start": "sandbox_start_s", "release": "sandbox_release_s", "env_init": "sandbox_tool_s",
             "tool_call": "sandbox_tool_s", "grade": "grade_s", "llm_call": "llm_s"}  # fmt: skip
    totals: dict[str, float] = dict.fromkeys(kinds.values(), 0.0)
    for result in results:
        for span in result.trace.spans if result.trace else []:
            if span.name in kinds:
                totals[kinds[span.name]] += span.duration_s
    resolved = sum(1 for result in results if result.grade is not None and result.grade.resolved)
    sandbox_s = totals["sandbox_start_s"] + totals["sandbox_release_s"] + totals["sandbox_tool_s"] + totals["grade_s"]
    return {
        "episodes": len(results),
        "outcomes": dict(sorted(outcomes.items())),
        "resolved": resolved,
        "resolved_rate": resolved / len(results) if results else 0.0,
        "wall_s": wall_s,
        "sandbox_s": sandbox_s,
        "llm_s": totals["llm_s"],
        "time_totals_s": {key: totals[key] for key in sorted(set(kinds.values()))},
    }


def format_summary(summary: dict[str, Any], per_task: dict[str, tuple[int, int]]) -> str:
    """A plain-text table: resolved episodes per task, then the totals."""
    width = max([len("task"), *(len(task) for task in per_task)])
    rows = [f"{'task':<{width}}  resolved"]
    rows += [f"{task:<{width}}  {ok}/{n}" for task, (ok, n) in per_task.items()]
    outcomes = ", ".join(f"{name} {count}" for name, count in summary["outcomes"].items())
    rows.append(
        f"{summary['resolved']}/{summary['episodes']} resolved ({summary['resolved_rate']:.0%}); {outcomes}; "
        f"wall {summary['wall_s']:.1f} s, sandbox {summary['sandbox_s']:.1f} s, "
        + ("LLM not timed" if summary["llm_s"] is None else f"LLM {summary['llm_s']:.1f} s")
    )
    return "\n".join(rows)


class _Progress:
    """A single stderr line: episodes finished and resolved so far."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total, self.stream = total, stream
        self.finished: set[str] = set()
        self.resolved = 0
        self.start = time.monotonic()

    def update(self, episode_id: str, resolved: bool | None = None) -> None:
        self.finished.add(episode_id)
        self.resolved += bool(resolved)
        done = len(self.finished)
        bar = "#" * (20 * done // max(self.total, 1))
        elapsed = time.monotonic() - self.start
        line = f"\r[{bar:<20}] {done}/{self.total} episodes, {self.resolved} resolved, {elapsed:.0f} s"
        self.stream.write(line + ("\n" if done >= self.total else ""))
        self.stream.flush()


async def run_tasks(
    tasks: Sequence[SWETask], backend: SandboxBackend, options: RunOptions, *, stream: TextIO = sys.stderr
) -> tuple[list[EpisodeResult], dict[str, Any]]:
    """Run ``options.samples`` episodes of every task; write the outputs; return the results and the summary."""
    episodes = [
        Episode(f"{task.id}#{k}" if options.samples > 1 else task.id, {"task": task, "task_id": task.id}, task.id)
        for task in tasks
        for k in range(options.samples)
    ]
    progress = _Progress(len(episodes), stream)
    pipeline = SWEPipeline(
        backend,
        AgentConfig(max_turns=options.max_turns),
        labels={"skyrl.run": options.run_id},
        on_finished=lambda episode, resolved: progress.update(episode.id, resolved),
    )
    n = max(1, options.concurrency)
    config = DispatcherConfig(limits=StageLimits(acquire=n, run=n, grade=n, prefetch=n))
    start = time.monotonic()
    harness_llm_s: float | None = None
    if options.harness is None:
        dispatched = await pipeline.dispatcher(make_llm(options.model, options.served_model), config).run(episodes)
    else:
        dispatched, harness_llm_s = await _run_harness(tasks, episodes, pipeline, options, config)
    wall_s = time.monotonic() - start
    for result in dispatched.results:
        if result.episode.id not in progress.finished:
            progress.update(result.episode.id, False)
    summary = summarize(dispatched.results, wall_s)
    summary["metrics"] = dispatched.metrics
    summary["model"], summary["run_id"] = options.model, options.run_id
    summary["harness"] = options.harness or "react"
    if options.harness is not None:
        summary["llm_s"] = harness_llm_s  # what the gateway's engine took; None: a plain server, untimed
    options.out.mkdir(parents=True, exist_ok=True)
    with (options.out / "trajectories.jsonl").open("w") as fh:
        for result in dispatched.results:
            fh.write(json.dumps(episode_record(result), default=str) + "\n")
    (options.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return dispatched.results, summary


async def _run_harness(
    tasks: Sequence[SWETask], episodes: list[Episode], base: SWEPipeline, options: RunOptions, config: DispatcherConfig
) -> tuple[DispatchResult, float | None]:
    """The episodes played by ``options.harness`` against ``options.model``, and the seconds its model calls took.

    The seconds are None when a plain server answered the calls: they are the harness's own requests.
    """
    from skyrl_agent.harness.episodes import HarnessPipeline
    from skyrl_agent.integrations.serving import make_harness, serving
    from skyrl_agent.llm.scripted import null_policy

    harness = make_harness(str(options.harness))
    # The gateway listens on the loopback; a harness inside a container reaches it through its model socket.
    async with serving(options.model, tasks, options.served_model, host="127.0.0.1") as served:
        pipeline = HarnessPipeline(
            base.backend, base.agent, labels=base.labels, on_finished=base.on_finished, harness=harness,
            server=served.server, endpoint=served.endpoint,
        )  # fmt: skip
        dispatched = await pipeline.dispatcher(null_policy(), config).run(episodes)
        return dispatched, served.llm_s() if served.llm_s is not None else None


def per_task(results: Sequence[EpisodeResult]) -> dict[str, tuple[int, int]]:
    """Task id → (resolved episodes, episodes)."""
    table: dict[str, tuple[int, int]] = {}
    for result in results:
        task_id = str(result.episode.data.get("task_id"))
        ok, n = table.get(task_id, (0, 0))
        table[task_id] = (ok + int(bool(result.grade and result.grade.resolved)), n + 1)
    return table


def main(tasks: Sequence[SWETask], backend_name: str, options: RunOptions) -> int:
    """Run with a backend made from its name; the Docker backend gets the reaper for this run id."""
    from skyrl_agent.tasks.validate import make_backend

    if backend_name == "docker":
        from skyrl_agent.sandbox import reaper

        reaper.install_reaper(options.run_id)
    # A sandbox nobody closed goes when the deadlines its dispatcher keeps it alive for have passed.
    lifetime_s = DispatcherConfig().timeouts.sandbox_lifetime_s
    backend = make_backend(backend_name, run_id=options.run_id, lifetime_s=lifetime_s)

    async def go() -> tuple[list[EpisodeResult], dict[str, Any]]:
        try:
            return await run_tasks(tasks, backend, options)
        finally:
            await backend.close()

    results, summary = asyncio.run(go())
    print(format_summary(summary, per_task(results)))
    print(f"wrote {options.out / 'trajectories.jsonl'} and {options.out / 'summary.json'}")
    return 0
