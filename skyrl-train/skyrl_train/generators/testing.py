"""Test doubles for generators: a deterministic scripted inference engine.

:class:`ScriptedEngine` implements :class:`~skyrl_train.inference.base.InferenceEngine` without a model. A
*responder* picks each reply from the request (usually by a marker in the prompt text); the engine tokenizes the
reply with the real tokenizer, applies ``max_tokens`` and stop strings like a real engine would, appends the EOS
token when the reply ends naturally, and reports plausible log-probabilities. Replies can be delayed, fail or hang,
so failure handling and concurrency can be tested on CPU in milliseconds::

    engine = ScriptedEngine(tokenizer, by_marker({"Q1": ["#### 4"], "Q2": [Reply(hang=True)]}))
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skyrl_train.generators.chat import decode
from skyrl_train.inference.base import GenerationOutput, SamplingParams, StopReason

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["EngineFailure", "Reply", "Request", "Responder", "ScriptedEngine", "by_marker", "scripted_logprob"]


class EngineFailure(RuntimeError):
    """What a :class:`Reply` with ``fail=True`` raises from ``generate`` (an injected engine error)."""


@dataclass(frozen=True)
class Reply:
    """One scripted completion.

    Attributes:
        text: The text the "model" writes (before ``max_tokens`` and stop strings are applied).
        eos: End with the EOS token when the text is not cut short (a natural stop); False ends the reply
            with stop reason ``stop`` but no EOS token, as after a stop string.
        delay_s: Seconds to wait (on the event loop) before answering.
        fail: Raise :class:`EngineFailure` instead of answering.
        hang: Never answer; the request waits until it is cancelled.
    """

    text: str = ""
    eos: bool = True
    delay_s: float = 0.0
    fail: bool = False
    hang: bool = False


@dataclass(frozen=True)
class Request:
    """What a responder sees: one prompt of a ``generate`` call."""

    prompt_ids: list[int]
    prompt_text: str  # decoded with special tokens, so markers and roles are visible
    params: SamplingParams
    index: int  # order of arrival over the engine's life, from 0


Responder = Callable[[Request], Reply | str]
"""Picks the reply to a request; a plain string means ``Reply(text=...)``."""


def by_marker(scripts: Mapping[str, Sequence[Reply | str]], default: Reply | str = "") -> Responder:
    """A responder that follows one script per marker string.

    The first marker (in ``scripts`` order) found in a request's prompt text selects the script; its ``n``-th
    request gets the script's ``n``-th reply, and the last reply repeats once the script runs out. Prompts with
    no marker get ``default``. Give each trajectory its own marker (e.g. in the question) so turns line up.
    """
    calls: defaultdict[str, int] = defaultdict(int)

    def respond(request: Request) -> Reply | str:
        for marker, script in scripts.items():
            if marker in request.prompt_text and script:
                turn = calls[marker]
                calls[marker] += 1
                return script[min(turn, len(script) - 1)]
        return default

    return respond


def scripted_logprob(token_id: int, position: int) -> float:
    """A deterministic, plausible log-probability (in ``[-2.0, -0.05]``) for a token at an output position."""
    return -0.05 - ((token_id * 31 + position * 17) % 40) / 20.0


class ScriptedEngine:
    """An :class:`~skyrl_train.inference.base.InferenceEngine` that answers from a script.

    Args:
        tokenizer: Tokenizes reply texts (and decodes prompts for the responder).
        responder: Picks each reply; see :func:`by_marker`.
        eos_token_id: The id appended on a natural stop; default the tokenizer's EOS token.

    Attributes:
        requests: Every request received, in order of arrival.
        in_flight: Prompts being answered right now; ``max_in_flight`` is the most seen at once.
        weight_updates: Number of ``update_weights`` calls.
        closed: True after ``close``.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, responder: Responder, *, eos_token_id: int | None = None
    ) -> None:
        eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        if not isinstance(eos, int):
            raise ValueError("The tokenizer has no EOS token; pass eos_token_id")
        self.tokenizer = tokenizer
        self.responder = responder
        self.eos_token_id = eos
        self.requests: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.weight_updates = 0
        self.closed = False
        self._running = asyncio.Event()
        self._running.set()

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Answer every prompt concurrently; raises if any reply is scripted to fail."""
        await self._running.wait()
        return list(await asyncio.gather(*(self._answer(prompt, params) for prompt in prompts)))

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Count the update; the weights are consumed and ignored."""
        for _ in weights:
            pass
        self.weight_updates += 1

    async def pause(self) -> None:
        """Hold new ``generate`` calls until :meth:`resume`."""
        self._running.clear()

    async def resume(self) -> None:
        """Let held ``generate`` calls proceed."""
        self._running.set()

    async def close(self) -> None:
        """Mark the engine closed (idempotent)."""
        self.closed = True

    async def _answer(self, prompt: Sequence[int], params: SamplingParams) -> GenerationOutput:
        request = Request(
            prompt_ids=list(prompt),
            prompt_text=decode(self.tokenizer, prompt, skip_special_tokens=False),
            params=params,
            index=len(self.requests),
        )
        self.requests.append(request)
        picked = self.responder(request)
        reply = Reply(text=picked) if isinstance(picked, str) else picked
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if reply.delay_s > 0:
                await asyncio.sleep(reply.delay_s)
            if reply.hang:
                await asyncio.Event().wait()  # until cancelled
            if reply.fail:
                raise EngineFailure(f"scripted failure for request {request.index}")
            return self._complete(reply, params)
        finally:
            self.in_flight -= 1

    def _complete(self, reply: Reply, params: SamplingParams) -> GenerationOutput:
        """Tokenize the reply as the model's output: stop strings, then ``max_tokens``, then EOS."""
        text, hit_stop_string = _cut_at_stop_string(reply.text, params.stop)
        ids = [int(token) for token in self.tokenizer.encode(text, add_special_tokens=False)]
        stop_reason: StopReason = "stop"
        if len(ids) > params.max_tokens:
            ids, stop_reason = ids[: params.max_tokens], "length"
        elif reply.eos and not hit_stop_string:
            if len(ids) < params.max_tokens:
                ids.append(self.eos_token_id)
            else:
                stop_reason = "length"  # no room left for the EOS token
        logprobs = [scripted_logprob(token, position) for position, token in enumerate(ids)]
        return GenerationOutput(
            token_ids=ids, logprobs=logprobs if params.logprobs else None, stop_reason=stop_reason, text=None
        )


def _cut_at_stop_string(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to and including the earliest stop string (kept, as the protocol says), and whether one hit."""
    hits = [(text.find(stop), stop) for stop in stops if stop and stop in text]
    if not hits:
        return text, False
    start, stop = min(hits)
    return text[: start + len(stop)], True
