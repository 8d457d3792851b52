"""What an agent run gets from the dispatcher: its deadlines, its clock and its trace."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from skyrl_agent.dispatch.clock import Deadline, PausableClock, within
from skyrl_agent.dispatch.trace import Trace
from skyrl_agent.llm.base import Completion, LLMClient, Prompt, SamplingParams

T = TypeVar("T")

__all__ = ["GuardedLLM", "RunContext", "Timeouts"]


@dataclass(frozen=True)
class Timeouts:
    """Deadlines in active seconds (pauses excluded); ``None`` disables one."""

    episode_s: float | None = 3600.0  # the agent run of one attempt, from when it gets its run slot
    llm_call_s: float | None = 600.0  # one LLM call
    tool_call_s: float | None = 300.0  # one env step (host backstop over the sandbox's own command timeout)
    sandbox_start_s: float | None = 600.0  # one try of acquire() (None: a start may take forever)
    grade_s: float | None = 1800.0  # grading one episode

    @property
    def sandbox_lifetime_s(self) -> float | None:
        """Active seconds an attempt holds its sandbox from its run slot on: the episode, then grading headroom.

        The one deadline model: the episode deadline plus the grading deadline, both in active time, so a pause
        extends the lifetime exactly as it extends them. ``None`` when either is unbounded.
        """
        if self.episode_s is None or self.grade_s is None:
            return None
        return self.episode_s + self.grade_s


@dataclass
class RunContext:
    """The deadlines, clock and trace of one episode attempt.

    ``deadline`` is the episode deadline; :meth:`call_tool` and :class:`GuardedLLM` add the per-call ones.
    """

    clock: PausableClock = field(default_factory=PausableClock)
    timeouts: Timeouts = field(default_factory=lambda: Timeouts(None, None, None, None, None))
    trace: Trace = field(default_factory=lambda: Trace("episode"))
    deadline: Deadline | None = None

    def __post_init__(self) -> None:
        if self.deadline is None:
            self.deadline = Deadline(self.clock, self.timeouts.episode_s, "episode")

    def _episode(self) -> Deadline:
        assert self.deadline is not None  # set in __post_init__
        return self.deadline

    async def call_tool(self, awaitable: Awaitable[T], name: str = "tool_call") -> T:
        """Await one env call under the tool and episode deadlines, as a span called ``name``.

        Raises:
            DeadlineExceeded: ``kind`` ``"tool"`` or ``"episode"``.
        """
        with self.trace.span(name):
            tool = Deadline(self.clock, self.timeouts.tool_call_s, "tool")
            return await within(awaitable, self._episode(), tool)

    async def call_llm(self, llm: LLMClient, prompt: Prompt, params: SamplingParams) -> Completion:
        """One LLM call: waits while paused, then runs under the LLM and episode deadlines as an ``llm_call`` span.

        The client's own (wall-time) timeout is left to the client: a pause must not time a call out.
        """
        if isinstance(llm, GuardedLLM):
            llm = llm.inner  # already guarded by this method: do not nest spans and deadlines
        await self.clock.wait_running()
        with self.trace.span("llm_call") as span:
            llm_deadline = Deadline(self.clock, self.timeouts.llm_call_s, "llm")
            completion = await within(llm.complete(prompt, params), self._episode(), llm_deadline)
            span.attrs.update(
                prompt_tokens=completion.usage.prompt_tokens, completion_tokens=completion.usage.completion_tokens
            )
            return completion


class GuardedLLM:
    """An :class:`LLMClient` whose every call goes through :meth:`RunContext.call_llm`."""

    def __init__(self, inner: LLMClient, ctx: RunContext) -> None:
        self.inner = inner
        self.ctx = ctx

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        """Complete under the context's deadlines (``timeout_s`` is ignored: the context sets the limits)."""
        return await self.ctx.call_llm(self.inner, prompt, params)
