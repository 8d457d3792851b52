"""What one request and one session may ask of the gateway: a harness's requests are the policy's output.

Every byte a session's client sends is chosen by the policy being trained, so nothing it sends may cost the gateway
(and the event loop it shares with the trainer) more than a bounded amount of work:

- a request's text (every string in its JSON body: messages, tool definitions, prompts) is at most
  ``max_prompt_chars`` characters, checked before anything is rendered or tokenized;
- ``chat_template_kwargs`` may only set the keys in ``template_kwargs``: a request must not bring its own template
  (``chat_template``) or arguments the template was not written for;
- a request asks for at most ``max_samples_per_request`` samples (prompts × ``n``) and ``max_request_tokens``
  tokens (prompt + ``max_tokens`` over its samples);
- a session makes at most ``max_session_requests`` requests and records at most ``max_session_samples`` samples and
  ``max_session_tokens`` tokens (counted as asked, when a request is admitted).

A request over a per-request cap is answered 413 (``request_too_large``) and one past a session cap 429
(``session_limit``), each naming the :class:`~skyrl_train.gateway.server.GatewayConfig` field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from skyrl_train.gateway.errors import InvalidRequestError, RequestTooLargeError, SessionLimitError

__all__ = [
    "Limits",
    "SessionBudget",
    "check_prompt_chars",
    "check_request_size",
    "check_template_kwargs",
    "text_chars",
]


class Limits(Protocol):
    """The caps of :class:`~skyrl_train.gateway.server.GatewayConfig` this module reads (read-only)."""

    @property
    def max_prompt_chars(self) -> int:
        """Characters of text one request may carry."""
        ...

    @property
    def template_kwargs(self) -> tuple[str, ...]:
        """chat_template_kwargs keys a request may set."""
        ...

    @property
    def max_samples_per_request(self) -> int:
        """Prompts × n of one request."""
        ...

    @property
    def max_request_tokens(self) -> int:
        """Prompt + max_tokens over one request's samples."""
        ...

    @property
    def max_session_requests(self) -> int:
        """Requests of one session."""
        ...

    @property
    def max_session_samples(self) -> int:
        """Samples one session may ask for."""
        ...

    @property
    def max_session_tokens(self) -> int:
        """Prompt + max_tokens over one session's samples."""
        ...


def text_chars(value: Any) -> int:
    """Characters of every string in a parsed JSON value (keys included), without recursion limits to hit."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Mapping):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return total


def check_prompt_chars(body: Any, limits: Limits) -> None:
    """Refuse a body whose text is longer than ``max_prompt_chars`` (before any rendering or tokenizing)."""
    chars = text_chars(body)
    if chars > limits.max_prompt_chars:
        raise RequestTooLargeError(
            f"the request carries {chars} characters of text, more than this gateway's limit of "
            f"{limits.max_prompt_chars} (GatewayConfig.max_prompt_chars): shorten the conversation"
        )


def check_template_kwargs(options: Mapping[str, Any], limits: Limits) -> None:
    """Refuse ``chat_template_kwargs`` keys outside ``template_kwargs`` (a caller's own template among them)."""
    unknown = sorted(set(options) - set(limits.template_kwargs))
    if unknown:
        allowed = ", ".join(limits.template_kwargs) or "none"
        raise InvalidRequestError(
            f"chat_template_kwargs may not set {', '.join(map(repr, unknown))}: this gateway renders with the "
            f"policy's own chat template and accepts only these arguments: {allowed} (GatewayConfig.template_kwargs)",
            param="chat_template_kwargs",
        )


def check_request_size(samples: int, tokens: int, limits: Limits) -> None:
    """Refuse a request for more than ``max_samples_per_request`` samples or ``max_request_tokens`` tokens."""
    if samples > limits.max_samples_per_request:
        raise RequestTooLargeError(
            f"the request asks for {samples} samples (prompts × n), more than this gateway's limit of "
            f"{limits.max_samples_per_request} (GatewayConfig.max_samples_per_request): send fewer prompts or a lower n"
        )
    if tokens > limits.max_request_tokens:
        raise RequestTooLargeError(
            f"the request asks for {tokens} tokens (prompt + max_tokens over its samples), more than this gateway's "
            f"limit of {limits.max_request_tokens} (GatewayConfig.max_request_tokens): lower max_tokens or n"
        )


@dataclass
class SessionBudget:
    """What a session has asked for so far; :meth:`admit` charges a request or refuses it whole."""

    requests: int = 0
    samples: int = 0
    tokens: int = 0

    def admit(self, samples: int, tokens: int, limits: Limits) -> None:
        """Charge one request of ``samples`` samples and ``tokens`` tokens, or raise without charging anything.

        Raises:
            SessionLimitError: the request would take the session past one of its caps.
        """
        after = (self.requests + 1, self.samples + samples, self.tokens + tokens)
        for used, cap, what in zip(after, _caps(limits), ("requests", "samples", "tokens"), strict=True):
            if used > cap[0]:
                raise SessionLimitError(
                    f"this session has reached its limit of {cap[0]} {what} (GatewayConfig.{cap[1]}): the episode "
                    "must end; a new session starts a new budget"
                )
        self.requests, self.samples, self.tokens = after


def _caps(limits: Limits) -> Iterable[tuple[int, str]]:
    return (
        (limits.max_session_requests, "max_session_requests"),
        (limits.max_session_samples, "max_session_samples"),
        (limits.max_session_tokens, "max_session_tokens"),
    )
