"""A ReAct agent loop: ask the LLM, parse one action, step the env, until the env is done.

The env is any skyrl-gym text env (``init(prompt) -> (messages, info)``, ``step(text) -> {observations,
reward, done, metadata}``), driven unchanged through :mod:`skyrl_gym.async_env`. Control flow uses exceptions:
:class:`FormatError` becomes a corrective observation; :class:`Finished` and its subclasses end the loop
with a finish reason. The trajectory is handed to ``on_step`` after every step so it can be saved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from skyrl_agent.action_format import Action, FormatError, SubmitAction, parse_action
from skyrl_agent.dispatch.context import RunContext
from skyrl_agent.dispatch.outcomes import Outcome
from skyrl_agent.llm.base import Completion, LLMClient, Message, SamplingParams, count_message_tokens
from skyrl_gym.async_env import ainit, astep

__all__ = ["AgentConfig", "ContextBudgetExceeded", "Finished", "ReActAgent", "Trajectory", "Turn"]

TRUNCATING = frozenset({"max_turns", "context_budget"})


class Finished(Exception):
    """The episode is over; ``reason`` is the trajectory's finish reason."""

    reason = "env_done"


class Submitted(Finished):
    """The model submitted."""

    reason = "submitted"


class SandboxBroken(Finished):
    """The env ended the episode because the agent's action destroyed its sandbox (the agent's failure)."""

    reason = Outcome.AGENT_BROKE_SANDBOX.value


class TurnLimitReached(Finished):
    """``max_turns`` LLM calls were made without finishing."""

    reason = "max_turns"


class ContextBudgetExceeded(Finished):
    """The conversation no longer fits the context budget."""

    reason = "context_budget"


@dataclass(frozen=True)
class AgentConfig:
    """Limits of one agent run."""

    max_turns: int = 50  # LLM calls at most
    context_budget_tokens: int = 32768  # prompt plus completion tokens of any call at most
    params: SamplingParams = field(default_factory=SamplingParams)
    parse: Callable[[str], Action] | None = parse_action  # None: pass replies to the env unparsed


@dataclass
class Turn:
    """One LLM call and what followed: the action parsed (``None`` if malformed) and the observations."""

    completion: Completion
    action: Action | None
    observations: list[Message]
    reward: float = 0.0


@dataclass
class Trajectory:
    """An agent run: the conversation, every turn with its tokens and logprobs, and why it ended."""

    messages: list[Message]
    turns: list[Turn] = field(default_factory=list)
    finish_reason: str = "running"
    reward: float = 0.0  # the env's rewards, summed
    metadata: dict[str, Any] = field(default_factory=dict)  # the last step's metadata (e.g. the submitted patch)

    @property
    def truncated(self) -> bool:
        """True when the run stopped for lack of turns or context."""
        return self.finish_reason in TRUNCATING

    @property
    def submission(self) -> str | None:
        """The submitted work, if the env reported one as ``metadata["submission"]``."""
        value = self.metadata.get("submission")
        return value if isinstance(value, str) else None


class ReActAgent:
    """Drives ``env`` with ``llm`` until the env is done, the turns run out or the context budget does.

    Args:
        llm: The policy.
        env: A skyrl-gym text env; the agent calls ``init``/``step`` (or native ``ainit``/``astep``), not ``close``.
        config: Limits and sampling parameters.
        on_step: Called with the trajectory after every step (e.g. to save it).
    """

    def __init__(
        self,
        llm: LLMClient,
        env: Any,
        config: AgentConfig | None = None,
        on_step: Callable[[Trajectory], None] | None = None,
    ) -> None:
        self.llm, self.env, self.config, self.on_step = llm, env, config or AgentConfig(), on_step

    async def run(self, prompt: Sequence[Message], ctx: RunContext | None = None) -> Trajectory:
        """Run one episode. Deadlines and LLM errors propagate; the model's mistakes do not."""
        ctx = ctx or RunContext()
        messages, _info = await ctx.call_tool(ainit(self.env, list(prompt)), name="env_init")
        trajectory = Trajectory(messages=list(messages))
        while True:
            try:
                await self.step(trajectory, ctx)
            except FormatError as exc:
                feedback = {"role": "user", "content": str(exc)}
                trajectory.turns[-1].observations.append(feedback)
                trajectory.messages.append(feedback)
            except Finished as done:
                trajectory.finish_reason = done.reason
                self._saved(trajectory)
                return trajectory
            self._saved(trajectory)

    async def step(self, trajectory: Trajectory, ctx: RunContext) -> None:
        """One turn: query, parse, act. Raises :class:`FormatError` or a :class:`Finished`."""
        if len(trajectory.turns) >= self.config.max_turns:
            raise TurnLimitReached
        completion = await self.query(trajectory, ctx)
        trajectory.messages.append({"role": "assistant", "content": completion.text})
        turn = Turn(completion, None, [])
        trajectory.turns.append(turn)
        if completion.usage.total_tokens >= self.config.context_budget_tokens:
            raise ContextBudgetExceeded
        if self.config.parse is not None:
            turn.action = self.config.parse(completion.text)
        out = await ctx.call_tool(astep(self.env, completion.text))
        turn.observations, turn.reward = list(out["observations"]), float(out["reward"])
        trajectory.messages.extend(turn.observations)
        trajectory.reward += turn.reward
        if out["done"]:
            trajectory.metadata = dict(out.get("metadata") or {})
            if trajectory.metadata.get("finish_reason") == SandboxBroken.reason:
                raise SandboxBroken
            raise Submitted if isinstance(turn.action, SubmitAction) else Finished

    async def query(self, trajectory: Trajectory, ctx: RunContext) -> Completion:
        """Ask the LLM for the next reply, with ``max_tokens`` lowered to what the context budget leaves."""
        room = self.config.context_budget_tokens - self._prompt_tokens(trajectory)
        if room <= 0:
            raise ContextBudgetExceeded
        params = replace(self.config.params, max_tokens=min(self.config.params.max_tokens, room))
        return await ctx.call_llm(self.llm, trajectory.messages, params)

    @staticmethod
    def _prompt_tokens(trajectory: Trajectory) -> int:
        # The last call's exact usage plus an estimate of what was appended since.
        if not trajectory.turns:
            return count_message_tokens(trajectory.messages)
        last = trajectory.turns[-1]
        return last.completion.usage.total_tokens + count_message_tokens(last.observations)

    def _saved(self, trajectory: Trajectory) -> None:
        if self.on_step is not None:
            self.on_step(trajectory)
