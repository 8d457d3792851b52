"""What a harness is given and what it returns; the bridge from its thread to the episode's sandbox.

A harness is any agent that talks to a model through an OpenAI-compatible API: a Python callable that takes a
:class:`HarnessJob` and returns a :class:`HarnessResult`. It runs in a thread of its own (harnesses are
synchronous programs), with the job's :class:`Endpoint` as its model server and the job's :class:`SandboxShell`
to run commands in the task's sandbox. It never sees the trainer: whatever records its tokens (the gateway of
skyrl-train, behind :class:`SessionServer`) sits behind the endpoint.

The shell is the one way back into the episode. Each command runs on the event loop under the dispatcher's tool
and episode deadlines; once the episode is over (done, timed out, cancelled) every call raises
:class:`HarnessCancelled`, so a harness that outlives its deadline stops at its next command.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from skyrl_agent.sandbox.base import CommandResult, Sandbox
from skyrl_agent.tasks.format import SWETask

__all__ = [
    "Endpoint",
    "Harness",
    "HarnessCancelled",
    "HarnessJob",
    "HarnessResult",
    "SandboxShell",
    "SessionServer",
    "SessionTicket",
]


class HarnessCancelled(RuntimeError):
    """The episode is over (finished, past its deadline or cancelled): the harness must stop."""


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server as a client sees it: ``base_url`` ends in ``/v1``."""

    base_url: str
    api_key: str
    model: str

    def environment(self) -> dict[str, str]:
        """The variables OpenAI clients read (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, and the model name)."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.model}


@dataclass(frozen=True)
class SessionTicket:
    """One episode's session on a recording server: where its harness sends requests."""

    session_id: str
    base_url: str
    api_key: str


class SessionServer(Protocol):
    """A model server that records each session apart (skyrl-train's gateway, through its integration)."""

    model: str  # the model name clients send

    def open_session(self, session_id: str) -> SessionTicket:
        """Open a session for one episode."""
        ...

    def close_session(self, session_id: str) -> Sequence[Any]:
        """Close it; return what it recorded (the gateway's samples)."""
        ...


Guard = Callable[[Awaitable[CommandResult]], Awaitable[CommandResult]]


class SandboxShell:
    """Runs commands in the episode's sandbox from the harness's thread.

    Args:
        sandbox: The episode's sandbox (borrowed).
        loop: The event loop the episode runs on (commands run there).
        workdir: Where commands start.
        guard: Wraps each command's coroutine with the episode's deadlines (``RunContext.call_tool``).
        whole_guard: Wraps a command that is the whole harness (``run(..., whole=True)``): the episode deadline
            only, no per-command one. Default ``guard``.
        timeout_s: A command's own limit when the harness gives none.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        loop: asyncio.AbstractEventLoop,
        workdir: str,
        *,
        guard: Guard | None = None,
        whole_guard: Guard | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.sandbox, self.loop, self.workdir = sandbox, loop, workdir
        self.guard, self.whole_guard, self.timeout_s = guard, whole_guard or guard, timeout_s
        self.commands = 0
        self._closed = threading.Event()

    def run(
        self, command: str, *, timeout_s: float | None = None, cwd: str | None = None, whole: bool = False
    ) -> CommandResult:
        """Run ``command`` in the sandbox and wait for it (call from the harness thread, not the loop).

        ``whole``: the command is the whole harness (a command-line harness), bound by the episode deadline only.

        Raises:
            HarnessCancelled: The episode is over.
            DeadlineExceeded: The command outlived the tool or episode deadline.
        """
        if self._closed.is_set():
            raise HarnessCancelled("the episode is over; no more commands run in its sandbox")
        self.commands += 1
        limit = timeout_s if timeout_s is not None else self.timeout_s
        coroutine: Awaitable[CommandResult] = self.sandbox.run(command, timeout_s=limit, workdir=cwd or self.workdir)
        guard = self.whole_guard if whole else self.guard
        if guard is not None:
            coroutine = guard(coroutine)
        future = asyncio.run_coroutine_threadsafe(_awaited(coroutine), self.loop)
        while True:  # wake up now and then: a closed shell must not wait out a long command
            try:
                return future.result(timeout=0.5)
            except TimeoutError:
                if self._closed.is_set():
                    future.cancel()
                    raise HarnessCancelled("the episode ended while a command ran") from None

    def close(self) -> None:
        """Refuse every later command (and stop waiting for the one running)."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        """True once the episode is over."""
        return self._closed.is_set()


async def _awaited(awaitable: Awaitable[CommandResult]) -> CommandResult:
    return await awaitable


@dataclass(frozen=True)
class HarnessJob:
    """One episode for a harness: the task, its model endpoint, its sandbox and its limits."""

    task: SWETask
    endpoint: Endpoint
    shell: SandboxShell
    max_turns: int  # model calls at most
    episode_id: str = ""

    @property
    def problem_statement(self) -> str:
        """The task as the harness should state it to its model."""
        return self.task.problem_statement


@dataclass
class HarnessResult:
    """What the harness did: how it ended, its conversation as it kept it, and how many model calls it made."""

    exit_status: str  # the harness's own word for how it ended ("Submitted", "LimitsExceeded", …)
    messages: list[Mapping[str, Any]] = field(default_factory=list)
    model_calls: int = 0
    submitted: bool = False  # the harness said it was done (rather than stopping on a limit or an error)
    error: str | None = None


class Harness(Protocol):
    """An agent program: runs one job to its end in the calling thread."""

    @property
    def name(self) -> str:
        """What results and messages call it."""
        ...

    def __call__(self, job: HarnessJob) -> HarnessResult:
        """Run the episode; return how it ended (raising counts as the harness crashing)."""
        ...
