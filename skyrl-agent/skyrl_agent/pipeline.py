"""The dispatcher's stages for SWE-style tasks, shared by ``skyrl-agent run`` and the trainer bridge.

::

    acquire    a sandbox from the backend, labelled with the run and the task; the samples of one group
               (``Episode.group_id``, of a size given in ``group_sizes``) on a backend that forks: the first
               prepares the workspace and snapshots it, the others start as forks (:mod:`.sandbox.group_fork`)
    run_agent  the ReAct agent drives an SWEEnv on that sandbox (the env does not grade); the env prepares the
               workspace unless acquire did
    grade      the submitted diff, in a fresh sandbox from the same backend
    release    close the sandbox

Episodes carry their task as ``episode.data["task"]`` (an :class:`~skyrl_agent.tasks.SWETask`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from skyrl_agent.agents.react import AgentConfig, ReActAgent, Trajectory
from skyrl_agent.agents.swe_env import SWEEnv, instructions
from skyrl_agent.dispatch import Dispatcher, DispatcherConfig, Episode, GradeResult, PausableClock, RunContext
from skyrl_agent.dispatch.admission import AdmissionController
from skyrl_agent.dispatch.dispatcher import LLMFactory, TrajectoryLike
from skyrl_agent.dispatch.outcomes import GradingError
from skyrl_agent.llm.base import LLMClient, Message
from skyrl_agent.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from skyrl_agent.sandbox.group_fork import GroupForks, can_fork
from skyrl_agent.spans import SpannedEnv, SpanRecorder, span_on
from skyrl_agent.tasks.format import SWETask
from skyrl_agent.tasks.grading import grade
from skyrl_agent.tasks.workspace import prepare_workspace

__all__ = ["TASK_LABEL", "SWEPipeline"]

TASK_LABEL = "skyrl.task"  # sandbox label naming the task an episode's sandbox was started for


@dataclass
class SWEPipeline:
    """Acquire, run, grade and release for SWE episodes; :meth:`dispatcher` wires them into a :class:`Dispatcher`.

    Attributes:
        backend: Where episode and grading sandboxes come from; the caller owns it (and closes it).
        agent: The agent's limits and sampling parameters.
        labels: Extra labels on every sandbox (e.g. ``{"skyrl.run": run_id}``).
        spec: What every sandbox starts from (limits, user, network…); each task sets the image and working
            directory, and ``labels`` are added to the spec's own.
        env_options: Extra :class:`SWEEnv` options (``command_timeout_s``, ``max_output_chars``).
        on_finished: Called with the episode and whether it was resolved, once it is graded or truncated.
        spans: Where to record sandbox start/close, env calls and grading as spans (:mod:`skyrl_agent.spans`).
        group_fork: Start the samples of one group from one prepared sandbox (on a backend that forks): one
            create and one workspace preparation per group instead of one per sample.
        group_sizes: Samples per group (``Episode.group_id``). Only groups listed here with two samples or more
            are forked: a group of unknown size could not tell when its snapshot may go.
    """

    backend: SandboxBackend
    agent: AgentConfig = field(default_factory=AgentConfig)
    labels: Mapping[str, str] = field(default_factory=dict)
    spec: SandboxSpec = field(default_factory=SandboxSpec)
    env_options: Mapping[str, Any] = field(default_factory=dict)
    on_finished: Callable[[Episode, bool], None] | None = None
    spans: SpanRecorder | None = None
    group_fork: bool = True
    group_sizes: Mapping[str, int] = field(default_factory=dict)
    _forks: GroupForks | None = field(default=None, init=False, repr=False)
    _bases: dict[str, str] = field(default_factory=dict, init=False, repr=False)  # sandbox id → prepared base commit

    @property
    def env_max_turns(self) -> int:
        """The env's turn limit: one more than the agent's, so the agent's limit ends the episode (ungraded)."""
        return self.agent.max_turns + 1

    def instructions(self, task: SWETask) -> list[Message]:
        """The messages an episode of ``task`` starts with (what the env's ``init`` returns)."""
        return instructions(task, self.env_max_turns)

    def dispatcher(
        self,
        llm: LLMClient | LLMFactory,
        config: DispatcherConfig | None = None,
        *,
        clock: PausableClock | None = None,
        admission: AdmissionController | None = None,
    ) -> Dispatcher:
        """A dispatcher running these stages; ``clock`` and ``admission`` may be shared by several dispatchers."""
        stages = (self.acquire, self.run_agent, self.grade, self.release)
        return Dispatcher(*stages, llm, config, clock=clock, admission=admission)

    async def acquire(self, episode: Episode) -> Sandbox:
        """A fresh sandbox for the episode's task (a fork of its group's prepared one, see :attr:`group_fork`)."""
        return await self._start(episode, self._agent_spec(_task(episode)))

    async def run_agent(self, episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext) -> Trajectory:
        """Run the agent on the borrowed sandbox; the env returns the diff on submit without grading it."""
        options = {**self.env_options, "task": _task(episode), "sandbox": sandbox, "grade": False}
        if sandbox.id in self._bases:
            options["workspace_base"] = self._bases[sandbox.id]  # acquire prepared it: the env must not again
        env = SWEEnv(extras={**options, "max_turns": self.env_max_turns})
        driven = env if self.spans is None else SpannedEnv(env, self.spans)
        try:
            trajectory = await ReActAgent(llm, driven, self.agent).run([], ctx)
        finally:
            await env.aclose()
        if trajectory.truncated:
            self._finished(episode, resolved=False)
        return trajectory

    async def grade(self, episode: Episode, sandbox: Sandbox, trajectory: TrajectoryLike) -> GradeResult:
        """Grade the submission in a fresh sandbox: reward 1.0 when resolved, else 0.0.

        Raises:
            GradingError: the verdict is ``error``: the task itself is broken (its hidden tests do not apply), which
                says nothing about the submission (masked, not a reward of 0).
        """
        task = _task(episode)
        submission = getattr(trajectory, "submission", None) or ""
        with span_on(self.spans, "reward", "grade"):
            verdict = await grade(task, submission, self.backend, spec=self._spec(task, {}))
        if verdict.status == "error":
            raise GradingError(f"task {task.id} could not be graded: {verdict.error}")
        self._finished(episode, resolved=verdict.resolved)
        details = {"status": verdict.status, "tests": dict(verdict.tests), "fail_to_pass": dict(verdict.fail_to_pass),
                   "pass_to_pass": dict(verdict.pass_to_pass), "error": verdict.error,
                   "duration_s": verdict.duration_s}  # fmt: skip
        return GradeResult(1.0 if verdict.resolved else 0.0, verdict.resolved, details)

    async def release(self, sandbox: Sandbox) -> None:
        """Close the sandbox."""
        self._bases.pop(sandbox.id, None)
        try:
            with span_on(self.spans, "sandbox", "close"):
                await sandbox.close()
        finally:
            if self._forks is not None:
                await self._forks.released(sandbox)

    async def workspace_base(self, task: SWETask, sandbox: Sandbox) -> str:
        """The base commit of the sandbox's workspace: the one acquire prepared, else prepared now."""
        base = self._bases.get(sandbox.id)
        return base if base is not None else await prepare_workspace(task, sandbox)

    def group_setup_metrics(self) -> dict[str, float]:
        """Seconds to set up each forked group's sandboxes (share plus forks): ``agent/group_setup_s/*``."""
        seconds = list(self._forks.setup_s.values()) if self._forks is not None else []
        if not seconds:
            return {}
        return {"agent/group_setup_s/mean": sum(seconds) / len(seconds), "agent/group_setup_s/max": max(seconds),
                "agent/forked_groups": float(len(seconds))}  # fmt: skip

    async def _start(self, episode: Episode, spec: SandboxSpec) -> Sandbox:
        """A sandbox of ``spec`` for the episode: from its group's share when it has one, else created."""
        forks = self._group_forks(episode)
        with span_on(self.spans, "sandbox", "start"):
            if forks is None or episode.group_id is None:
                return await self.backend.create(spec)
            started = await forks.acquire(episode.group_id, spec, functools.partial(prepare_workspace, _task(episode)))
        if started.base is not None:
            self._bases[started.sandbox.id] = started.base
        return started.sandbox

    def _group_forks(self, episode: Episode) -> GroupForks | None:
        if not self.group_fork or self.group_sizes.get(episode.group_id or "", 0) < 2 or not can_fork(self.backend):
            return None
        if self._forks is None:
            self._forks = GroupForks(self.backend, sizes=self.group_sizes, spans=self.spans)
        return self._forks

    def _agent_spec(self, task: SWETask) -> SandboxSpec:
        """The spec of the sandbox the agent works in."""
        return self._spec(task, {TASK_LABEL: task.id})

    def _spec(self, task: SWETask, labels: Mapping[str, str]) -> SandboxSpec:
        labels = {**self.spec.labels, **self.labels, **labels}
        return replace(self.spec, image=task.base_image, workdir=task.workdir, labels=labels)

    def _finished(self, episode: Episode, *, resolved: bool) -> None:
        if self.on_finished is not None:
            self.on_finished(episode, resolved)


def _task(episode: Episode) -> SWETask:
    task = episode.data.get("task")
    if not isinstance(task, SWETask):
        raise TypeError(f"episode {episode.id} has no SWETask in data['task'] (got {type(task).__name__})")
    return task
