"""The dispatcher's stages for SWE-style tasks, shared by ``skyrl-agent run`` and the trainer bridge.

::

    acquire    a sandbox from the backend, labelled with the run and the task
    run_agent  the ReAct agent drives an SWEEnv on that sandbox (the env does not grade)
    grade      the submitted diff, in a fresh sandbox from the same backend
    release    close the sandbox

Episodes carry their task as ``episode.data["task"]`` (an :class:`~skyrl_agent.tasks.SWETask`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from skyrl_agent.agents.react import AgentConfig, ReActAgent, Trajectory
from skyrl_agent.agents.swe_env import SWEEnv, instructions
from skyrl_agent.dispatch import Dispatcher, DispatcherConfig, Episode, GradeResult, PausableClock, RunContext
from skyrl_agent.dispatch.dispatcher import LLMFactory, TrajectoryLike
from skyrl_agent.dispatch.outcomes import GradingError
from skyrl_agent.llm.base import LLMClient, Message
from skyrl_agent.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from skyrl_agent.spans import SpannedEnv, SpanRecorder, span_on
from skyrl_agent.tasks.format import SWETask
from skyrl_agent.tasks.grading import grade

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
    """

    backend: SandboxBackend
    agent: AgentConfig = field(default_factory=AgentConfig)
    labels: Mapping[str, str] = field(default_factory=dict)
    spec: SandboxSpec = field(default_factory=SandboxSpec)
    env_options: Mapping[str, Any] = field(default_factory=dict)
    on_finished: Callable[[Episode, bool], None] | None = None
    spans: SpanRecorder | None = None

    @property
    def env_max_turns(self) -> int:
        """The env's turn limit: one more than the agent's, so the agent's limit ends the episode (ungraded)."""
        return self.agent.max_turns + 1

    def instructions(self, task: SWETask) -> list[Message]:
        """The messages an episode of ``task`` starts with (what the env's ``init`` returns)."""
        return instructions(task, self.env_max_turns)

    def dispatcher(
        self, llm: LLMClient | LLMFactory, config: DispatcherConfig | None = None, *, clock: PausableClock | None = None
    ) -> Dispatcher:
        """A dispatcher running these stages; ``clock`` lets several dispatchers share one pause state."""
        return Dispatcher(self.acquire, self.run_agent, self.grade, self.release, llm, config, clock=clock)

    async def acquire(self, episode: Episode) -> Sandbox:
        """A fresh sandbox for the episode's task."""
        task = _task(episode)
        with span_on(self.spans, "sandbox", "start"):
            return await self.backend.create(self._agent_spec(task))

    async def run_agent(self, episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext) -> Trajectory:
        """Run the agent on the borrowed sandbox; the env returns the diff on submit without grading it."""
        options = {**self.env_options, "task": _task(episode), "sandbox": sandbox, "grade": False}
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
        with span_on(self.spans, "sandbox", "close"):
            await sandbox.close()

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
