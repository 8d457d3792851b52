"""The LLM client protocol: a prompt in, a :class:`Completion` with token ids and logprobs out.

Token ids and logprobs make trajectories trainable without re-tokenising. Errors::

    LLMError
    ├── LLMConnectionError   the server could not be reached (retried by clients)
    ├── LLMServerError       the server answered 5xx (retried by clients) or 4xx (``status`` says which)
    ├── LLMTimeoutError      a call ran past its timeout
    └── LLMResponseError     the answer could not be understood
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "Completion",
    "FinishReason",
    "LLMClient",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMServerError",
    "LLMTimeoutError",
    "Message",
    "Prompt",
    "SamplingParams",
    "Usage",
    "count_message_tokens",
]

Message = dict[str, str]
"""One chat message: ``{"role": ..., "content": ...}``."""

Prompt = Sequence[Message] | Sequence[int]
"""Chat messages, or token ids already rendered with the chat template."""

FinishReason = Literal["stop", "length", "abort"]


class LLMError(RuntimeError):
    """The LLM could not produce a completion; the message says what failed."""


class LLMConnectionError(LLMError):
    """The server could not be reached."""


class LLMServerError(LLMError):
    """The server answered with an error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class LLMTimeoutError(LLMError):
    """A call ran past its timeout."""


class LLMResponseError(LLMError):
    """The server's answer was malformed."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    max_tokens: int = 1024  # new tokens at most; the agent lowers it to fit its context budget
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = True  # ask for the sampled tokens' log-probabilities


@dataclass(frozen=True)
class Usage:
    """Token counts of one call."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens: the context the call used."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Completion:
    """One sampled completion.

    Attributes:
        text: The decoded completion.
        token_ids: The sampled token ids, or ``None`` when the server does not return them.
        logprobs: One log-probability per sampled token, or ``None`` when not returned.
        finish_reason: ``stop`` (EOS or a stop string), ``length`` (max tokens) or ``abort``.
        usage: Token counts.
        prompt_token_ids: The prompt as the server tokenised it, when returned.
    """

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)
    prompt_token_ids: list[int] | None = None


@runtime_checkable
class LLMClient(Protocol):
    """Anything that completes prompts."""

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        """Sample one completion of ``prompt``; give up after ``timeout_s`` seconds (``None``: the client's default).

        Raises:
            LLMError: The completion could not be produced.
        """
        ...


def count_message_tokens(messages: Sequence[Message]) -> int:
    """A tokenizer-free size estimate of chat messages: one token per 4 characters, plus 4 per message."""
    return sum(len(m.get("content", "")) // 4 + 4 for m in messages)
