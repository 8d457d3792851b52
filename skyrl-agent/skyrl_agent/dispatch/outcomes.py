"""The failure taxonomy and the declarative policy that says what each outcome means for training.

Every episode ends with exactly one :class:`Outcome`. A :class:`FailurePolicy` maps each outcome to a
:class:`Treatment` (train on it, zero its reward, mask it from the loss, drop its whole group) and says which
outcomes are retried. ``DEFAULT_POLICY`` is the table in docs/agent/dispatcher.md.

An outcome says whose failure an episode is. The agent's own (``truncated``, ``agent_broke_sandbox``) are trained
on with reward 0, so that a policy cannot escape a bad reward through them; the infrastructure's
(``sandbox_error``, ``model_error``, …) are masked and some are retried. How a destroyed sandbox is told to be the
agent's doing is the section "How outcomes are told apart" of that page.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from skyrl_agent.dispatch.clock import DeadlineExceeded
from skyrl_agent.dispatch.retry import CircuitOpenError
from skyrl_agent.llm.base import LLMError
from skyrl_agent.sandbox.base import SandboxError
from skyrl_agent.sandbox.shell import CommandBrokeSandboxError

__all__ = [
    "DEFAULT_POLICY",
    "FailurePolicy",
    "GradingError",
    "Outcome",
    "Treatment",
    "classify_error",
    "outcome_metrics",
    "ungraded_outcome",
]


class Outcome(enum.StrEnum):
    """How an episode ended; exactly one per episode."""

    RESOLVED = "resolved"  # graded and passed
    UNRESOLVED = "unresolved"  # graded and failed (including "submitted nothing")
    TRUNCATED = "truncated"  # the agent ran out of turns or context before submitting
    AGENT_BROKE_SANDBOX = "agent_broke_sandbox"  # the agent's own action destroyed its sandbox (not graded)
    TIMED_OUT = "timed_out"  # the episode, an LLM call or a tool call passed its deadline
    SANDBOX_ERROR = "sandbox_error"  # the sandbox could not start, or died without the agent's doing
    MODEL_ERROR = "model_error"  # the LLM server failed (after the client's own retries)
    GRADING_ERROR = "grading_error"  # the grader raised or passed its deadline
    AGENT_ERROR = "agent_error"  # an unexpected exception in agent or env code (a bug)
    CANCELLED = "cancelled"  # the dispatcher was stopped before the episode finished


class Treatment(enum.StrEnum):
    """What training does with an episode."""

    TRAIN = "train"  # use it with its reward
    ZERO_REWARD = "zero_reward"  # use it with reward 0
    MASK = "mask"  # keep its slot, exclude its tokens from the loss and the group baseline
    DROP_GROUP = "drop_group"  # drop every episode of its group


class GradingError(RuntimeError):
    """The grader could not decide (harness crash, unparseable test output); not a failed test."""


_DEFAULT_TREATMENTS = {
    Outcome.RESOLVED: Treatment.TRAIN,
    Outcome.UNRESOLVED: Treatment.TRAIN,
    Outcome.TRUNCATED: Treatment.ZERO_REWARD,
    Outcome.AGENT_BROKE_SANDBOX: Treatment.ZERO_REWARD,
    Outcome.TIMED_OUT: Treatment.MASK,
    Outcome.SANDBOX_ERROR: Treatment.MASK,
    Outcome.MODEL_ERROR: Treatment.MASK,
    Outcome.GRADING_ERROR: Treatment.MASK,
    Outcome.AGENT_ERROR: Treatment.MASK,
    Outcome.CANCELLED: Treatment.DROP_GROUP,
}


@dataclass(frozen=True)
class FailurePolicy:
    """Outcome → treatment, and which outcomes re-run the episode on a fresh sandbox.

    Attributes:
        treatments: The treatment of each outcome; a missing outcome is masked.
        retry: Outcomes that re-run the whole episode (infrastructure failures only).
        max_episode_attempts: Runs of one episode at most, the first included.
        max_masked_fraction: When more than this fraction of a group is masked, drop the group: its
            baseline would rest on too few samples.
    """

    treatments: Mapping[Outcome, Treatment] = field(default_factory=lambda: MappingProxyType(_DEFAULT_TREATMENTS))
    retry: frozenset[Outcome] = frozenset({Outcome.SANDBOX_ERROR})
    max_episode_attempts: int = 2
    max_masked_fraction: float = 1.0

    def treatment(self, outcome: Outcome) -> Treatment:
        """The treatment of ``outcome``."""
        return self.treatments.get(outcome, Treatment.MASK)

    def should_retry(self, outcome: Outcome, attempt: int) -> bool:
        """Whether to run the episode again after ``attempt`` (1-based) ended with ``outcome``."""
        return outcome in self.retry and attempt < self.max_episode_attempts

    def group_treatments(self, outcomes: Sequence[Outcome], group_ids: Sequence[str | None]) -> list[Treatment]:
        """Treatments of many episodes, with group drops applied to every member of the group."""
        own = [self.treatment(o) for o in outcomes]
        members: dict[str, list[int]] = {}
        for i, gid in enumerate(group_ids):
            if gid is not None:
                members.setdefault(gid, []).append(i)
        for idx in members.values():
            masked = sum(own[i] in (Treatment.MASK, Treatment.DROP_GROUP) for i in idx)
            if any(own[i] is Treatment.DROP_GROUP for i in idx) or masked / len(idx) > self.max_masked_fraction:
                for i in idx:
                    own[i] = Treatment.DROP_GROUP
        return own


DEFAULT_POLICY = FailurePolicy()


def classify_error(exc: BaseException, stage: str) -> Outcome:
    """The outcome of an episode that ended with ``exc`` raised in ``stage`` (``acquire``, ``agent``, ``grade``).

    In grading, a sandbox that died is told apart like one that died under the agent: ended from the inside by a
    command of the grade (the only code there that is not ours is the agent's own work) it is the agent's doing;
    lost otherwise, the infrastructure's, and retried. Every other grading failure is ``grading_error``.
    """
    if stage == "grade":
        if isinstance(exc, CommandBrokeSandboxError):
            return Outcome.AGENT_BROKE_SANDBOX
        if isinstance(exc, SandboxError) and not isinstance(exc, CircuitOpenError):
            return Outcome.SANDBOX_ERROR
        return Outcome.GRADING_ERROR
    if isinstance(exc, DeadlineExceeded):
        return Outcome.TIMED_OUT
    if isinstance(exc, SandboxError | CircuitOpenError):
        return Outcome.SANDBOX_ERROR
    if isinstance(exc, LLMError):
        return Outcome.MODEL_ERROR
    if stage == "acquire":
        return Outcome.SANDBOX_ERROR
    return Outcome.AGENT_ERROR


def ungraded_outcome(finish_reason: str, truncated: bool) -> Outcome | None:
    """The outcome an agent run settles without grading, from its trajectory; None: grade it.

    ``agent_broke_sandbox`` when the run finished for that reason (the env ended the episode: the agent's action
    destroyed its sandbox); ``truncated`` when it ran out of turns or context.
    """
    if finish_reason == Outcome.AGENT_BROKE_SANDBOX:
        return Outcome.AGENT_BROKE_SANDBOX
    return Outcome.TRUNCATED if truncated else None


def outcome_metrics(outcomes: Iterable[Outcome], treatments: Iterable[Treatment] = ()) -> dict[str, float]:
    """``outcome/<name>/count`` and ``/fraction`` for every outcome, and ``treatment/<name>/count``."""
    counts = Counter(outcomes)
    total = sum(counts.values())
    metrics: dict[str, float] = {"episodes": float(total)}
    for outcome in Outcome:
        metrics[f"outcome/{outcome}/count"] = float(counts[outcome])
        metrics[f"outcome/{outcome}/fraction"] = counts[outcome] / total if total else 0.0
    for treatment, n in Counter(treatments).items():
        metrics[f"treatment/{treatment}/count"] = float(n)
    return metrics
