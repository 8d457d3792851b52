r"""Per-session recording of the tokens an engine saw and sampled, and the rule that merges or splits requests.

Pure bookkeeping: no HTTP, no tokenizer (rendering is passed in as callables). One session is one episode of a
harness; it turns the harness's requests into *samples*, each one growing token sequence::

    prompt ids │ sampled (mask 1) │ new context (mask 0) │ sampled (mask 1) │ new context (mask 0) │ sampled …

``response_ids`` is everything after the first prompt; ``loss_mask`` is 1 exactly on the ids the engine sampled
(the end-of-turn token included when the engine sampled it) and ``logprobs`` holds the engine's log-probability of
each sampled id, 0.0 elsewhere. A sample always ends on a sampled reply.

The merge rule. A *point* is the end of a recorded reply (its sample's ids up to and including the reply). For
each request, the first rule that applies decides where its prompt comes from:

1. **Message match.** The request's conversation begins with the conversation of a point: the messages of the
   request that produced the reply, then the assistant message the gateway returned for it (compared after
   normalisation, with the same ``tools`` and template options; see :mod:`skyrl_train.gateway.render`). The
   prompt is the point's ids as the engine produced them, then the end-of-turn token when the reply did not end
   with it, then only the *new* messages rendered as a delta. Earlier turns are never re-rendered, so a reply
   whose text re-tokenises differently (or that the template would render differently, e.g. without its
   reasoning) still merges.
2. **Token match.** Otherwise the whole conversation is rendered; when those ids begin with the ids of a point,
   the prompt is exactly the rendered ids, and only the ids after the point are new. This is the rule for
   ``/v1/completions`` (token-id prompts) and for clients that rebuild messages in their own words.
3. **New sample.** Otherwise the request rewrote its context (summarised, truncated, reordered): its rendered
   prompt starts a new sample of the same episode (a step-wise sample).

The longest matching point wins. When the point is the end of its sample, the sample grows in place. When it is
not (a retry, two concurrent requests from one state, or choices 2..n of a request with ``n > 1``), the request
*forks*: a new sample copies the history up to the point with mask 0 and log-probability 0.0, then continues.
Every sampled token is thus trained in exactly one sample.

Concurrency: a session is safe to use from several threads; :meth:`Session.close` may run while requests are in
flight, and their late :meth:`Session.record` calls report that the session closed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from skyrl_train.inference.base import GenerationOutput, StopReason

__all__ = ["POLICY_VERSION_KEY", "Plan", "Sample", "Session", "SessionCounts", "Turn"]

POLICY_VERSION_KEY = "policy_version"
"""Where an engine may report the policy version that sampled a reply: ``GenerationOutput.policy_version`` when the
output has that field, else this ``GenerationOutput.metadata`` entry."""

Via = Literal["messages", "tokens", "new"]


def reported_version(output: GenerationOutput) -> int | None:
    """The policy version an engine reported for an output: its ``policy_version`` field, else the metadata entry."""
    for version in (getattr(output, "policy_version", None), output.metadata.get(POLICY_VERSION_KEY)):
        if isinstance(version, int) and not isinstance(version, bool):
            return version
    return None


@dataclass(frozen=True)
class Turn:
    """One sampled reply of a sample: ``response_ids[start:end]``, all with loss mask 1."""

    start: int
    end: int
    stop_reason: StopReason
    policy_version: int | None  # what the engine reported (see POLICY_VERSION_KEY), if anything
    # Per token, when the engine changed weights inside the reply (``GenerationOutput.token_policy_versions``).
    token_versions: tuple[int, ...] | None = None

    def versions(self) -> list[int]:
        """The policy version of each of the reply's tokens (-1 where nothing was reported)."""
        if self.token_versions is not None and len(self.token_versions) == self.end - self.start:
            return list(self.token_versions)
        return [-1 if self.policy_version is None else self.policy_version] * (self.end - self.start)


@dataclass(frozen=True)
class Sample:
    """One trajectory of a session, ready for a trainer.

    ``response_ids``, ``loss_mask`` and ``logprobs`` have one entry per token after ``prompt_ids``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]  # 1 on sampled ids, 0 on context the harness added (and on history copied by a fork)
    logprobs: list[float]  # the engine's log-probability of each sampled id; 0.0 where the mask is 0
    turns: tuple[Turn, ...]  # the sampled replies trained in this sample, in order

    @property
    def policy_version(self) -> int | None:
        """The oldest policy version among the sample's replies (None when the engine reported none)."""
        versions = [version for turn in self.turns for version in turn.versions() if version >= 0]
        return min(versions) if versions else None

    @property
    def policy_versions(self) -> list[int] | None:
        """Per response token, the policy version that sampled it (-1 where the mask is 0); None if none reported."""
        if all(turn.policy_version is None and turn.token_versions is None for turn in self.turns):
            return None
        versions = [-1] * len(self.response_ids)
        for turn in self.turns:  # a turn that spans a weight sync keeps each token's own version
            versions[turn.start : turn.end] = turn.versions()
        return versions

    @property
    def stop_reason(self) -> StopReason | None:
        """Why the last reply ended (None for a sample without replies)."""
        return self.turns[-1].stop_reason if self.turns else None


@dataclass
class SessionCounts:
    """How the session's requests were placed (see the merge rule in the module docstring)."""

    messages: int = 0  # requests merged by a message match
    tokens: int = 0  # requests merged by a token match
    new: int = 0  # requests that started a new sample (the first request of a session included)
    forks: int = 0  # replies recorded in a fork


@dataclass(frozen=True)
class _Point:
    length: int  # ids of the sample up to and including the reply
    needs_end_of_turn: bool  # the reply did not end with the end-of-turn token


@dataclass
class _Builder:
    """A sample being recorded."""

    prompt_length: int
    ids: list[int]
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    points: list[_Point] = field(default_factory=list)

    def fork(self, length: int) -> _Builder:
        """A new sample with this one's ids up to ``length``, none of them trained."""
        context = length - self.prompt_length
        return _Builder(self.prompt_length, self.ids[:length], [0] * context, [0.0] * context)

    def add_context(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def add_reply(self, output: GenerationOutput, end_of_turn_token_id: int) -> _Point:
        start = len(self.mask)
        self.ids.extend(output.token_ids)
        self.mask.extend([1] * len(output.token_ids))
        self.logprobs.extend(output.logprobs or ())
        tokens = output.token_policy_versions
        per_token = tuple(tokens) if tokens is not None and len(tokens) == len(output.token_ids) else None
        self.turns.append(Turn(start, len(self.mask), output.stop_reason, reported_version(output), per_token))
        ended = bool(output.token_ids) and output.token_ids[-1] == end_of_turn_token_id
        point = _Point(len(self.ids), needs_end_of_turn=not ended)
        self.points.append(point)
        return point

    def sample(self) -> Sample:
        prompt, response = self.ids[: self.prompt_length], self.ids[self.prompt_length :]
        return Sample(prompt, response, list(self.mask), list(self.logprobs), tuple(self.turns))  # copies: a snapshot


@dataclass(frozen=True)
class Plan:
    """Where one request's prompt comes from; made by :meth:`Session.plan`, consumed by :meth:`Session.record`.

    ``prompt_ids`` is exactly what the engine must be asked to continue.
    """

    prompt_ids: list[int]
    via: Via
    source: _Builder | None  # the sample continued (None: a new sample)
    base_length: int  # ids of ``source`` continued; the rest of ``prompt_ids`` is new context

    @property
    def new_ids(self) -> list[int]:
        """The ids this request adds to the sample before the reply (all of the prompt for a new sample)."""
        return self.prompt_ids[self.base_length :]


class Session:
    """The recording of one episode.

    Args:
        session_id: The id the harness addresses the session by.
        end_of_turn_token_id: The token that closes an assistant turn in the chat template; a reply that does not
            end with it gets it appended (mask 0) before the next turn's messages.
    """

    def __init__(self, session_id: str, end_of_turn_token_id: int) -> None:
        self.session_id = session_id
        self.end_of_turn_token_id = end_of_turn_token_id
        self.counts = SessionCounts()
        self._builders: list[_Builder] = []
        self._by_conversation: dict[Hashable, tuple[_Builder, _Point]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def plan(
        self,
        keys: Sequence[Hashable],
        render_delta: Callable[[int], list[int]],
        render_full: Callable[[], list[int]],
    ) -> Plan:
        """Place a request by the merge rule.

        Args:
            keys: ``keys[i]`` identifies the request's conversation up to and including message ``i`` (empty for
                token-id prompts); equal keys mean equal conversations.
            render_delta: ``render_delta(start)``: ids of messages ``start:`` rendered after an assistant turn,
                with the generation prompt.
            render_full: Ids of the whole request rendered from scratch.
        """
        with self._lock:
            hit = self._match_conversation(keys)
        if hit is not None:
            builder, point, start = hit
            new_ids = [self.end_of_turn_token_id] if point.needs_end_of_turn else []
            new_ids += render_delta(start)
            return Plan(builder.ids[: point.length] + new_ids, "messages", builder, point.length)
        full = render_full()
        with self._lock:
            found = self._match_tokens(full)
        if found is not None:
            return Plan(full, "tokens", found[0], found[1])
        return Plan(full, "new", None, 0)

    def record(self, plan: Plan, outputs: Sequence[GenerationOutput], reply_keys: Sequence[Hashable | None]) -> bool:
        """Record the engine's replies to a planned request; False (nothing recorded) once the session is closed.

        ``outputs[k]`` is choice ``k`` (sampled from ``plan.prompt_ids``); ``reply_keys[k]`` identifies the
        conversation ending with the assistant message returned for it (None: only token matches can continue it).
        """
        for output in outputs:  # all checked before anything is recorded
            if output.logprobs is None or len(output.logprobs) != len(output.token_ids):
                got = None if output.logprobs is None else len(output.logprobs)
                raise ValueError(f"{len(output.token_ids)} sampled ids need as many log-probabilities; got {got}")
        with self._lock:
            if self._closed:
                return False
            self._count(plan.via)
            for k, (output, key) in enumerate(zip(outputs, reply_keys, strict=True)):
                builder = self._target(plan, first=k == 0)
                builder.add_context(plan.prompt_ids[len(builder.ids) :])
                point = builder.add_reply(output, self.end_of_turn_token_id)
                if key is not None:
                    self._by_conversation.setdefault(key, (builder, point))
            return True

    def samples(self) -> list[Sample]:
        """The samples recorded so far, in the order they were started."""
        with self._lock:
            return [builder.sample() for builder in self._builders]

    def close(self) -> list[Sample]:
        """Stop recording; return the samples. Later :meth:`record` calls record nothing."""
        with self._lock:
            self._closed = True
            samples = [builder.sample() for builder in self._builders]
            self._by_conversation.clear()
            return samples

    # -- helpers (called with the lock held) ------------------------------------------------------------------

    def _match_conversation(self, keys: Sequence[Hashable]) -> tuple[_Builder, _Point, int] | None:
        """The point whose conversation is the longest prefix of the request's, and where the new messages start."""
        for index in range(len(keys) - 1, -1, -1):
            hit = self._by_conversation.get(keys[index])
            if hit is not None:
                return hit[0], hit[1], index + 1
        return None

    def _match_tokens(self, ids: Sequence[int]) -> tuple[_Builder, int] | None:
        """The sample and point length of the longest point whose ids are a prefix of ``ids``."""
        best: tuple[_Builder, int] | None = None
        for builder in self._builders:
            for point in reversed(builder.points):
                length = point.length
                if best is not None and length <= best[1]:
                    break
                # The last id first: a cheap test that rejects most points before the full comparison.
                if (
                    length <= len(ids)
                    and ids[length - 1] == builder.ids[length - 1]
                    and list(ids[:length]) == builder.ids[:length]
                ):
                    best = (builder, length)
                    break
        return best

    def _target(self, plan: Plan, *, first: bool) -> _Builder:
        """The sample a reply goes into: the source grown in place, a fork of it, or a new sample."""
        source = plan.source
        if source is None:
            builder = _Builder(len(plan.prompt_ids), list(plan.prompt_ids))
        elif first and len(source.ids) == plan.base_length:
            return source
        else:
            builder = source.fork(plan.base_length)
            self.counts.forks += 1
        self._builders.append(builder)
        return builder

    def _count(self, via: Via) -> None:
        if via == "messages":
            self.counts.messages += 1
        elif via == "tokens":
            self.counts.tokens += 1
        else:
            self.counts.new += 1
