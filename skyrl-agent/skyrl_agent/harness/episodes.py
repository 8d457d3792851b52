"""The dispatcher's stages for a harness: like :class:`~skyrl_agent.pipeline.SWEPipeline`, with the harness as agent.

::

    acquire    a sandbox for the task (as SWEPipeline, group forks included; with a model socket for a harness that
               runs inside it)
    run_agent  prepare the workspace (unless acquire did); open a session on the recording server (or use the plain
               endpoint);
               for a harness inside the sandbox: serve the model socket, and check the endpoint from inside;
               run the harness in its own thread until it returns or the episode deadline passes;
               close the session (its recorded samples) and take the workspace diff as the submission
    grade      the diff, in a fresh sandbox (as SWEPipeline)
    release    close the sandbox, then its model socket

A harness that hits its own turn limit ends *truncated* (ungraded, like the built-in agent out of turns); any
other return is graded, whatever the harness thought of its work. What it raises decides the outcome as for the
built-in agent: a command that broke the sandbox ends it ``agent_broke_sandbox`` (reward 0); the model server
failing (:class:`~skyrl_agent.llm.base.LLMError`) is a ``model_error``, the sandbox failing a ``sandbox_error``, a
deadline ``timed_out`` (all three masked, per the failure policy); anything else is an ``agent_error``
(:class:`HarnessError`). A harness inside its sandbox that cannot reach its model fails before it starts, as a
``model_error`` (:mod:`skyrl_agent.harness.routing`).

The deadline is the dispatcher's: time the engine spends paused for a weight sync counts against none of it,
because the session's requests simply wait at the gateway meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from skyrl_agent.dispatch import Episode, RunContext
from skyrl_agent.dispatch.clock import DeadlineExceeded, within
from skyrl_agent.dispatch.outcomes import Outcome
from skyrl_agent.harness.base import Endpoint, Harness, HarnessJob, HarnessResult, SandboxShell, SessionServer
from skyrl_agent.harness.routing import check_reachable, forwarded_url, relay_target, relays_model, runs_in_sandbox
from skyrl_agent.llm.base import LLMClient, LLMError
from skyrl_agent.pipeline import SWEPipeline, _task
from skyrl_agent.sandbox.base import CommandResult, Sandbox, SandboxError
from skyrl_agent.sandbox.session_socket import SessionSocket
from skyrl_agent.sandbox.shell import CommandBrokeSandboxError
from skyrl_agent.spans import span_on
from skyrl_agent.tasks.format import SWETask

__all__ = ["HarnessError", "HarnessPipeline", "HarnessTrajectory", "session_id_for"]

# Exit statuses of a harness that stopped on its own limits (turns, time, context).
TRUNCATED_EXITS = frozenset({"LimitsExceeded", "TimeExceeded", "ContextWindowExceeded"})
# Raised by a harness, these keep their meaning for the dispatcher's outcomes; anything else is a HarnessError.
PASSED_THROUGH = (LLMError, SandboxError, DeadlineExceeded)
SANDBOX_BROKEN = Outcome.AGENT_BROKE_SANDBOX.value
_UNSAFE = re.compile(r"[^A-Za-z0-9._~-]")


class HarnessError(RuntimeError):
    """The harness raised instead of returning."""


@dataclass
class HarnessTrajectory:
    """One harness episode: how it ended, the diff it left and what the server recorded of its model calls."""

    result: HarnessResult
    submission: str
    samples: Sequence[Any] = field(default_factory=list)  # the session's recorded samples (none on a plain endpoint)
    session_id: str | None = None
    commands: int = 0

    @property
    def finish_reason(self) -> str:
        """How the harness ended: ``max_turns`` (its limits), ``submitted``, else its own exit status."""
        if self.truncated:
            return "max_turns"
        if self.result.exit_status == SANDBOX_BROKEN:
            return SANDBOX_BROKEN  # not graded: the dispatcher ends it agent_broke_sandbox
        return "submitted" if self.result.submitted else (self.result.exit_status or "stopped")

    @property
    def truncated(self) -> bool:
        """True when the harness ran out of turns or time of its own (then the episode is not graded)."""
        return self.result.exit_status in TRUNCATED_EXITS


def session_id_for(episode: Episode) -> str:
    """A fresh, URL-safe session id naming the episode (one per attempt)."""
    return f"{_UNSAFE.sub('_', episode.id)[:96]}-{uuid.uuid4().hex[:12]}"


@dataclass
class HarnessPipeline(SWEPipeline):
    """SWE episodes played by a harness (see the module docstring).

    Attributes (beyond :class:`SWEPipeline`'s):
        harness: The agent program.
        server: The recording server each episode gets a session on; or ``endpoint``.
        endpoint: A plain OpenAI-compatible server (nothing recorded), when ``server`` is None.
        command_timeout_s: A sandbox command's limit when the harness sets none.

    A harness that runs inside its sandbox, on a backend that mounts model sockets, gets one per sandbox: made at
    ``acquire``, serving the endpoint's address from ``run_agent`` on, closed at ``release``.
    """

    harness: Harness | None = None
    server: SessionServer | None = None
    endpoint: Endpoint | None = None
    command_timeout_s: float = 60.0
    _sockets: dict[str, SessionSocket] = field(default_factory=dict, init=False, repr=False)  # by sandbox id

    def __post_init__(self) -> None:
        if self.harness is None:
            raise ValueError("HarnessPipeline needs a harness")
        if (self.server is None) == (self.endpoint is None):
            raise ValueError("HarnessPipeline needs exactly one of server (recorded) and endpoint (plain)")

    async def acquire(self, episode: Episode) -> Sandbox:
        """A fresh sandbox for the episode's task; with a model socket mounted when the harness runs inside it."""
        if not relays_model(self.backend, self._harness()):
            return await super().acquire(episode)
        model_socket = SessionSocket()
        try:
            spec = replace(self._agent_spec(_task(episode)), model_socket_dir=model_socket.directory)
            sandbox = await self._start(episode, spec)
        except BaseException:
            await model_socket.close()
            raise
        self._sockets[sandbox.id] = model_socket
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Close the sandbox, then its model socket (if it has one)."""
        try:
            await super().release(sandbox)
        finally:
            model_socket = self._sockets.pop(sandbox.id, None)
            if model_socket is not None:
                await model_socket.close()

    async def run_agent(self, episode: Episode, sandbox: Sandbox, llm: LLMClient, ctx: RunContext) -> Any:
        """Run the harness on the borrowed sandbox (``llm`` is unused: the harness has its own endpoint)."""
        task = _task(episode)
        with span_on(self.spans, "env", "init"):
            base_commit = await self.workspace_base(task, sandbox)
        session_id, endpoint = self._endpoint(episode)
        shell = SandboxShell(
            sandbox,
            asyncio.get_running_loop(),
            task.workdir,
            guard=self._guard(ctx),
            whole_guard=self._whole_guard(ctx),
            timeout_s=self.command_timeout_s,
        )
        samples: Sequence[Any] = []
        try:
            deadlines = [ctx.deadline] if ctx.deadline is not None else []
            reached = await within(self._reach(sandbox, endpoint), *deadlines)
            job = HarnessJob(task, reached, shell, self.agent.max_turns, episode.id)
            result = await within(_in_thread(self._harness(), job), *deadlines)
        except CommandBrokeSandboxError as exc:  # the harness's own command: its doing, not the infrastructure's
            result = HarnessResult(SANDBOX_BROKEN, model_calls=0, error=str(exc))
        finally:
            shell.close()
            if session_id is not None and self.server is not None:
                samples = self.server.close_session(session_id)
        if not result.model_calls:  # a harness that does not count its calls (a command line): the session did
            result.model_calls = sum(len(getattr(sample, "turns", ())) for sample in samples)
        submission = "" if result.exit_status == SANDBOX_BROKEN else await self._diff(sandbox, task, base_commit)
        trajectory = HarnessTrajectory(result, submission, samples, session_id, shell.commands)
        if trajectory.truncated:
            self._finished(episode, resolved=False)
        return trajectory

    def _harness(self) -> Harness:
        assert self.harness is not None  # checked in __post_init__
        return self.harness

    def _endpoint(self, episode: Episode) -> tuple[str | None, Endpoint]:
        if self.server is None:
            assert self.endpoint is not None  # checked in __post_init__
            return None, self.endpoint
        session_id = session_id_for(episode)
        ticket = self.server.open_session(session_id)
        return session_id, Endpoint(ticket.base_url, ticket.api_key, self.server.model)

    async def _reach(self, sandbox: Sandbox, endpoint: Endpoint) -> Endpoint:
        """The endpoint as the harness reaches it: through the sandbox's model socket, if it has one.

        A harness inside its sandbox is not started before the endpoint answered from there (LLMConnectionError).
        """
        if not runs_in_sandbox(self._harness()):
            return endpoint
        model_socket = self._sockets.get(sandbox.id)
        if model_socket is not None:
            await model_socket.serve(*relay_target(endpoint.base_url))
            endpoint = replace(endpoint, base_url=forwarded_url(endpoint.base_url))
        try:
            await check_reachable(sandbox, endpoint, model_socket)
        except CommandBrokeSandboxError as exc:  # nothing of the harness ran yet: not its doing
            raise SandboxError(f"the sandbox broke while its model endpoint was checked: {exc}") from exc
        return endpoint

    def _guard(self, ctx: RunContext) -> Any:
        async def guarded(command: Awaitable[CommandResult]) -> CommandResult:
            with span_on(self.spans, "env", "step"):
                return await ctx.call_tool(command, "harness_command")

        return guarded

    def _whole_guard(self, ctx: RunContext) -> Any:
        async def guarded(command: Awaitable[CommandResult]) -> CommandResult:
            with span_on(self.spans, "env", "step"), ctx.trace.span("harness_command"):
                deadlines = [ctx.deadline] if ctx.deadline is not None else []
                return await within(command, *deadlines)

        return guarded

    @staticmethod
    async def _diff(sandbox: Sandbox, task: SWETask, base_commit: str) -> str:
        from skyrl_agent.tasks.workspace import WorkspaceError, submission_diff

        try:
            return await submission_diff(sandbox, task.workdir, base_commit)
        except (WorkspaceError, OSError):
            return ""  # a repository broken past diffing submits nothing


def _in_thread(harness: Harness, job: HarnessJob) -> asyncio.Future[HarnessResult]:
    """Run the harness in a daemon thread of its own; its result (or its error, as HarnessError) on the loop.

    A daemon thread, not an executor's: a harness past its deadline cannot be killed, only starved (its shell
    refuses commands, its session refuses requests), and it must not hold the process open at exit.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[HarnessResult] = loop.create_future()

    def settle(value: HarnessResult | None, error: BaseException | None) -> None:
        if future.done():
            return
        if isinstance(error, PASSED_THROUGH):
            future.set_exception(error)  # the dispatcher classifies these (model, sandbox, deadline)
        elif error is not None:
            future.set_exception(HarnessError(f"harness {job_name(harness)} raised {type(error).__name__}: {error}"))
        else:
            future.set_result(value)  # type: ignore[arg-type]

    def target() -> None:
        try:
            value, error = harness(job), None
        except BaseException as exc:  # the harness's failure is reported, never lost with the thread
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for this episode any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=target, name=f"harness-{job.episode_id}", daemon=True).start()
    return future


def job_name(harness: Harness) -> str:
    """The harness's name for messages."""
    return str(getattr(harness, "name", type(harness).__name__))
