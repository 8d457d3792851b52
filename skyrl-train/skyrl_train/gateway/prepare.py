"""Turning a request into engine work before the engine sees it.

A request's body is decoded and checked, its prompt rendered and planned, and its samples fitted into the context
and charged to its session.

Decoding a body, rendering its chat template and tokenizing run on one thread of their own (a tokenizer is not
safe to share between threads), so a large or slow request never holds the event loop, which a trainer may share.
Every refusal is a :class:`~skyrl_train.gateway.errors.GatewayError` naming what to change.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from skyrl_train.gateway.errors import ContextLengthError, InvalidRequestError, RequestTooLargeError
from skyrl_train.gateway.limits import check_prompt_chars, check_request_size, check_template_kwargs
from skyrl_train.gateway.protocol import (
    ChatRequest,
    CompletionRequest,
    Sampling,
    parse_chat_request,
    parse_completion_request,
)
from skyrl_train.gateway.render import Conversation, Renderer
from skyrl_train.gateway.sessions import Plan

if TYPE_CHECKING:
    from skyrl_train.gateway.open_sessions import LiveSession
    from skyrl_train.gateway.settings import GatewayConfig
    from skyrl_train.inference.base import SamplingParams

__all__ = ["PreparedChat", "PreparedCompletion", "RequestPreparer"]

T = TypeVar("T")


@dataclass(frozen=True)
class PreparedChat:
    """A chat request ready for the engine: one prompt, sampled ``chat.sampling.n`` times with ``params``."""

    chat: ChatRequest
    conversation: Conversation
    plan: Plan
    params: SamplingParams


@dataclass(frozen=True)
class PreparedCompletion:
    """A completions request ready for the engine: one plan and one ``SamplingParams`` per prompt."""

    completion: CompletionRequest
    plans: list[Plan]
    params: list[SamplingParams]


class RequestPreparer:
    """Prepares the gateway's requests; :meth:`start` gives it its thread (without one it works inline).

    ``max_model_len``: prompt + reply tokens at most (None: no limit); ``vocab_size``: token-id prompts must stay
    below it.
    """

    def __init__(self, renderer: Renderer, config: GatewayConfig, max_model_len: int | None, vocab_size: int) -> None:
        self.renderer = renderer
        self.config = config
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Run the preparation work on a thread of its own from now on."""
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gateway-prepare")

    def stop(self) -> None:
        """End the thread (work still queued on it is cancelled); idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=False, cancel_futures=True)

    async def chat(self, request: web.Request, live: LiveSession) -> PreparedChat:
        """The chat request's prompt and parameters, its samples admitted to ``live``."""
        body = await self._body(request)
        chat, conversation, plan = await self._off_loop(self._plan_chat, live, body)
        params = self.sampling_params(chat.sampling, len(plan.prompt_ids), "messages")
        self._admit(live, [(len(plan.prompt_ids), params.max_tokens)] * chat.sampling.n)
        return PreparedChat(chat, conversation, plan, params)

    async def completions(self, request: web.Request, live: LiveSession) -> PreparedCompletion:
        """The completions request's prompts and parameters, its samples admitted to ``live``."""
        body = await self._body(request)
        completion, plans = await self._off_loop(self._plan_completions, live, body)
        params = [self.sampling_params(completion.sampling, len(p.prompt_ids), "prompt") for p in plans]
        samples = [(len(plan.prompt_ids), p.max_tokens) for plan, p in zip(plans, params, strict=True)]
        self._admit(live, samples * completion.sampling.n)
        return PreparedCompletion(completion, plans, params)

    def sampling_params(self, sampling: Sampling, prompt_length: int, param: str) -> SamplingParams:
        """The engine's parameters, with ``max_tokens`` checked against (or fitted into) the context left."""
        limit = self.max_model_len
        if limit is not None and prompt_length >= limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens, but the prompt has {prompt_length} tokens: "
                "there is no room for a reply. Shorten the conversation.",
                param=param,
            )
        max_tokens = sampling.max_tokens
        if max_tokens is None:
            left = self.config.default_max_tokens if limit is None else limit - prompt_length
            max_tokens = min(self.config.default_max_tokens, left)
        elif limit is not None and prompt_length + max_tokens > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_length + max_tokens} tokens ({prompt_length} in the prompt, {max_tokens} for the "
                "completion). Reduce the length of the prompt or max_tokens.",
                param="max_tokens",
            )
        return sampling.params(max_tokens)

    # -- on the preparation thread ------------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        """The request's JSON, decoded and size-checked on the preparation thread."""
        raw = await _read_body(request)
        return await self._off_loop(self._decode, raw)

    def _decode(self, raw: bytes) -> Any:
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from exc
        check_prompt_chars(body, self.config)
        return body

    def _plan_chat(self, live: LiveSession, body: Any) -> tuple[ChatRequest, Conversation, Plan]:
        chat = parse_chat_request(body, max_n=self.config.max_n)
        check_template_kwargs(chat.template_options, self.config)
        conversation = self.renderer.conversation(chat.messages, chat.tools, chat.template_options)
        plan = live.session.plan(
            conversation.keys,
            lambda start: self.renderer.delta_ids(conversation, start),
            lambda: self.renderer.full_ids(conversation),
        )
        return chat, conversation, plan

    def _plan_completions(self, live: LiveSession, body: Any) -> tuple[CompletionRequest, list[Plan]]:
        completion = parse_completion_request(body, max_n=self.config.max_n)
        samples = len(completion.prompts) * completion.sampling.n
        check_request_size(samples, 0, self.config)  # before tokenizing prompts that would be refused anyway
        return completion, [self._completion_plan(live, prompt, completion) for prompt in completion.prompts]

    def _completion_plan(self, live: LiveSession, prompt: str | list[int], completion: CompletionRequest) -> Plan:
        if isinstance(prompt, str):
            ids = self.renderer.encode_text(prompt, add_special_tokens=completion.add_special_tokens)
        else:
            ids = prompt
        if not ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if max(ids) >= self.vocab_size:
            message = f"token id {max(ids)} is not in the vocabulary (size {self.vocab_size})"
            raise InvalidRequestError(message, param="prompt")
        return live.session.plan([], _no_delta, lambda: ids)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the preparation thread (inline when it has none)."""
        if self._thread is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._thread, functools.partial(fn, *args))

    def _admit(self, live: LiveSession, samples: Sequence[tuple[int, int]]) -> None:
        """Charge a request's samples (``(prompt tokens, max_tokens)`` each) to its session, or refuse it."""
        tokens = sum(prompt + reply for prompt, reply in samples)
        check_request_size(len(samples), tokens, self.config)
        live.budget.admit(len(samples), tokens, self.config)


async def _read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise RequestTooLargeError(f"the request body is too large: {exc.text} (GatewayConfig.max_body_bytes)") from exc


def _no_delta(start: int) -> list[int]:
    raise AssertionError("token-id prompts carry no conversation keys, so no message match can ask for a delta")
