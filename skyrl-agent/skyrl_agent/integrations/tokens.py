"""Agent episodes as token rows for a trainer: prompt ids, response ids, loss mask, logprobs, reward.

Pure bookkeeping (no torch, no skyrl-train). One episode becomes one growing token sequence::

    prompt ids ─► generated ids (mask 1) ─► [end of turn] + observation ids (mask 0) ─► generated ids ─► …

The generated ids are those the LLM client returned; nothing is re-tokenised. The ids between two turns are taken
from the next call's ``prompt_token_ids`` when the client reports them (they must extend the sequence so far), and
rendered with the :class:`ChatTemplate` otherwise (scripted clients). The row always ends on a generated token: a
trailing observation is never kept, and a turn that generated nothing ends the row.

The failure policy then decides what the row trains on (:func:`treat`):

==================  ==========================================  ==================================
treatment           loss mask and reward                        stop reason
==================  ==========================================  ==================================
``train``           as generated; the episode's reward          ``stop``/``length``/``max_turns``/``context``
``zero_reward``     as generated; reward 0                      same
``mask``            all 0; reward 0                             a failure reason
``drop_group``      all 0; reward 0 (every row of the group)    a failure reason
==================  ==========================================  ==================================

A trainer keeps rows with a failure stop reason (``env_error``, ``engine_error``, ``timeout``) out of group
statistics, so a masked row's zero reward never biases the baseline of the samples it was drawn with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from skyrl_agent.agents.react import Trajectory, Turn
from skyrl_agent.dispatch.dispatcher import EpisodeResult
from skyrl_agent.dispatch.outcomes import Outcome, Treatment

__all__ = [
    "FAILURE_STOP_REASONS",
    "ChatTemplate",
    "TokenError",
    "TokenRow",
    "between_turns",
    "first_prompt_ids",
    "initial_messages",
    "stop_reason",
    "trajectory_tokens",
    "treat",
    "treat_steps",
]

FAILURE_STOP_REASONS = frozenset({"env_error", "engine_error", "timeout"})
"""Stop reasons a trainer treats as failed rows (as skyrl-train's ``FAILURE_STOP_REASONS``)."""

_FAILURE_OF = {
    Outcome.TIMED_OUT: "timeout",
    Outcome.MODEL_ERROR: "engine_error",
}


class ChatTemplate(Protocol):
    """A chat template as token ids (``skyrl_train.generators.chat.ChatEncoder`` is one)."""

    end_of_turn_token_id: int

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Ids of a whole conversation, ending with the generation prompt."""
        ...

    def observation_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Ids to append after an assistant turn that ended with the end-of-turn token, then the generation prompt."""
        ...

    def needs_end_of_turn(self, generated_ids: Sequence[int]) -> bool:
        """True when generated ids do not end with the end-of-turn token."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids, without special tokens."""
        ...


class TokenError(ValueError):
    """An episode cannot be written as one token sequence (missing ids or logprobs, or a prompt that drifted)."""


@dataclass
class TokenRow:
    """One episode's tokens. ``response_ids``, ``loss_mask``, ``logprobs`` and ``rewards`` have equal lengths."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    turns: int = 0  # turns whose generated ids are in the row

    def add_generated(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Append one turn's generated ids (loss mask 1)."""
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.rewards.extend([0.0] * len(ids))
        self.turns += 1

    def add_observation(self, ids: Sequence[int]) -> None:
        """Append ids the model did not generate (loss mask 0, logprob 0.0)."""
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.rewards.extend([0.0] * len(ids))

    def place_reward(self, reward: float) -> None:
        """Put ``reward`` on the last generated token (dropped when nothing was generated)."""
        generated = [i for i, m in enumerate(self.loss_mask) if m]
        if generated:
            self.rewards[generated[-1]] = reward

    def mask_all(self) -> None:
        """Exclude the whole row from the loss, with reward 0."""
        self.loss_mask = [0] * len(self.loss_mask)
        self.rewards = [0.0] * len(self.rewards)


def initial_messages(trajectory: Trajectory) -> list[dict[str, str]]:
    """The messages the episode started with (the env's ``init``), before the first reply."""
    appended = sum(1 + len(turn.observations) for turn in trajectory.turns)
    return list(trajectory.messages[: len(trajectory.messages) - appended])


def first_prompt_ids(trajectory: Trajectory, chat: ChatTemplate) -> list[int]:
    """The prompt of the first turn: as the client reported it, else the initial messages rendered."""
    reported = trajectory.turns[0].completion.prompt_token_ids if trajectory.turns else None
    return list(reported) if reported else chat.prompt_ids(initial_messages(trajectory))


def between_turns(
    chat: ChatTemplate, generated_ids: Sequence[int], observations: Sequence[Mapping[str, Any]]
) -> list[int]:
    """Ids after a turn's generated ids that open the next turn: the end of turn if not sampled, then observations."""
    closing = [chat.end_of_turn_token_id] if chat.needs_end_of_turn(generated_ids) else []
    return closing + chat.observation_ids(observations)


def trajectory_tokens(trajectory: Trajectory, chat: ChatTemplate, *, logprobs: bool = True) -> TokenRow:
    """The token row of ``trajectory`` (see the module docstring); rewards are all 0 here.

    Raises:
        TokenError: A turn has no token ids (or no logprobs when ``logprobs``), or a reported prompt does not
            extend the sequence so far.
    """
    row = TokenRow(first_prompt_ids(trajectory, chat))
    previous: Turn | None = None
    for turn in trajectory.turns:
        ids, turn_logprobs = _generated(turn, logprobs)
        if not ids:
            break  # nothing generated (e.g. no context left): the row ends on the previous turn
        if previous is not None:
            row.add_observation(_between(row, previous, turn, chat))
        row.add_generated(ids, turn_logprobs)
        previous = turn
    return row


def _generated(turn: Turn, logprobs: bool) -> tuple[list[int], list[float]]:
    completion = turn.completion
    if completion.token_ids is None:
        raise TokenError("the LLM client returned no token ids; use a client that does (e.g. TrainEngineClient)")
    ids = list(completion.token_ids)
    if not logprobs:
        return ids, [0.0] * len(ids)
    if completion.logprobs is None or len(completion.logprobs) != len(ids):
        got = "no" if completion.logprobs is None else len(completion.logprobs)
        raise TokenError(f"the LLM client returned {got} logprobs for {len(ids)} tokens")
    return ids, list(completion.logprobs)


def _between(row: TokenRow, previous: Turn, turn: Turn, chat: ChatTemplate) -> list[int]:
    """The ids between ``previous`` and ``turn``: from the prompt the client reported, else rendered."""
    reported = turn.completion.prompt_token_ids
    if reported is None:
        return between_turns(chat, previous.completion.token_ids or [], previous.observations)
    sequence = row.prompt_ids + row.response_ids
    if reported[: len(sequence)] != sequence:
        raise TokenError("a turn's prompt does not extend the previous turns' ids (the conversation was re-tokenised)")
    return list(reported[len(sequence) :])


def stop_reason(result: EpisodeResult) -> str:
    """The trainer's stop reason for an episode that is trained on (see :func:`treat` for masked ones)."""
    trajectory = result.trajectory
    if result.outcome is Outcome.TRUNCATED:
        return "max_turns" if getattr(trajectory, "finish_reason", "") == "max_turns" else "context"
    turns = trajectory.turns if isinstance(trajectory, Trajectory) else []
    return "length" if turns and turns[-1].completion.finish_reason == "length" else "stop"


def treat(row: TokenRow, result: EpisodeResult) -> str:
    """Apply the result's treatment to ``row`` (mask, reward) in place; return the row's stop reason."""
    if result.treatment in (Treatment.MASK, Treatment.DROP_GROUP):
        row.mask_all()
        return _FAILURE_OF.get(result.outcome, "env_error")
    row.place_reward(result.reward if result.treatment is Treatment.TRAIN else 0.0)
    return stop_reason(result)


def treat_steps(rows: Sequence[TokenRow], result: EpisodeResult) -> str:
    """:func:`treat` for an episode of several step-wise rows: the reward on the last, a mask on all when it failed.

    Returns the episode's stop reason (every one of its rows has it).
    """
    reason = treat(rows[-1], result)
    if result.treatment in (Treatment.MASK, Treatment.DROP_GROUP):
        for row in rows[:-1]:
            row.mask_all()
    return reason
