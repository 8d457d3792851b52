"""The gateway's HTTP server (aiohttp): OpenAI routes in front of an inference engine, one recording per session.

Routes, each also under ``/s/<session>`` (the session's base URL is ``<url>/s/<session>/v1``)::

    POST /v1/chat/completions     messages → chat template → engine → message (+ tool calls), streamed or not
    POST /v1/completions          text or token-id prompts → engine → text
    GET  /v1/models               the one served model (no session needed)

A request names its session by the URL path or, on the bare ``/v1/...`` routes, by its API key
(``Authorization: Bearer <session>``); :meth:`Gateway.open_session` returns both. Sessions are opened and closed
through the Python API only; :meth:`Gateway.close_session` returns the recorded samples
(:mod:`skyrl_train.gateway.sessions` holds the recording and the merge rule).

Time limits: none. A request waits as long as the engine's ``generate`` does, e.g. while the engine is paused for a
weight sync; a streamed request sends an SSE comment every ``stream_keepalive_s`` meanwhile, so clients that time
out between bytes keep waiting. A client that disconnects does not cancel its generation: what was sampled is
still recorded. Closing a session cancels its requests in flight (they are answered ``session_closed``).

Limits: every request is the policy's output, so its cost is bounded (:mod:`skyrl_train.gateway.limits`): body
size, characters of text, template arguments, samples and tokens per request, and requests, samples and tokens
per session, each a :class:`GatewayConfig` field and a 4xx answer naming it.

Threads: the server, the engine and the recording run on the event loop :meth:`Gateway.start` was awaited on (the
engine must be used from that loop). Decoding a body, rendering its chat template and tokenizing run on one
thread of their own, so a large or slow request never holds the loop (which a trainer may share).
:meth:`Gateway.open_session` and :meth:`Gateway.close_session` may be called from any thread. The gateway does not
own the engine: the caller closes it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiohttp import web

from skyrl_train.gateway.errors import (
    ContextLengthError,
    EngineError,
    GatewayError,
    InvalidRequestError,
    RequestTooLargeError,
    SessionClosedError,
    SessionNotFoundError,
    UnknownSessionKeyError,
    error_body,
)
from skyrl_train.gateway.limits import SessionBudget, check_prompt_chars, check_request_size, check_template_kwargs
from skyrl_train.gateway.protocol import (
    ChatRequest,
    Choice,
    CompletionRequest,
    Head,
    Sampling,
    chat_chunks,
    chat_message,
    chat_response,
    completion_chunks,
    completion_response,
    parse_chat_request,
    parse_completion_request,
)
from skyrl_train.gateway.render import Conversation, ParsedReply, Renderer, ToolParser, parse_hermes_tool_calls
from skyrl_train.gateway.sessions import Plan, Sample, Session

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams

__all__ = ["Gateway", "GatewayConfig", "GatewayStats", "SessionHandle"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

SESSION_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")
_SESSION_ROUTE = r"/s/{session:[A-Za-z0-9._~-]{1,128}}"
_DONE = b"data: [DONE]\n\n"
_KEEPALIVE = b": keep-alive\n\n"


@dataclass(frozen=True)
class GatewayConfig:
    """Settings of :class:`Gateway`."""

    host: str = "127.0.0.1"  # interface to listen on
    port: int = 0  # 0: any free port (read Gateway.url)
    model_name: str = "policy"  # what /v1/models lists; answers echo the request's model
    max_model_len: int | None = None  # prompt + reply tokens at most; None: the engine's, else the tokenizer's
    default_max_tokens: int = 2048  # reply tokens when a request sets no max_tokens (capped by the context left)
    max_n: int = 16  # largest `n` accepted
    stream_keepalive_s: float = 15.0  # seconds between SSE comments while a streamed request waits for the engine
    max_body_bytes: int = 8 * 2**20  # largest request body accepted
    max_prompt_chars: int = 2 * 2**20  # characters of text in one request (messages, tools, prompts)
    template_kwargs: tuple[str, ...] = ("enable_thinking",)  # chat_template_kwargs keys a request may set
    max_samples_per_request: int = 64  # prompts × n of one request
    max_request_tokens: int = 2**21  # prompt + max_tokens over one request's samples
    max_session_requests: int = 4096  # requests one session may make
    max_session_samples: int = 4096  # samples one session may ask for
    max_session_tokens: int = 2**24  # prompt + max_tokens over all of one session's samples


@dataclass(frozen=True)
class SessionHandle:
    """How a harness reaches its session: an OpenAI client with ``base_url`` (and any key), or ``api_key``."""

    session_id: str
    base_url: str  # <gateway url>/s/<session>/v1
    api_key: str  # the session id; on the bare <gateway url>/v1 routes it names the session


@dataclass
class GatewayStats:
    """Counters since the gateway was created."""

    requests: int = 0  # HTTP requests received
    errors: int = 0  # answered with an OpenAI error
    sessions_opened: int = 0
    sessions_closed: int = 0
    engine_calls: int = 0  # engine.generate calls made (one per request, whatever its n)
    engine_s: float = 0.0  # seconds those calls took, summed (calls in flight together each count in full)


class SpanRecorder(Protocol):
    """Where the gateway records each engine call (``skyrl_train.timeline.Timeline`` is one)."""

    def span(self, lane: str, name: str) -> AbstractContextManager[None]:
        """A context manager that records its block as a span on ``lane``."""
        ...


@dataclass
class _Live:
    """An open session and its generations in flight."""

    session: Session
    tasks: set[asyncio.Future[list[GenerationOutput]]] = field(default_factory=set)
    budget: SessionBudget = field(default_factory=SessionBudget)  # what its requests asked for so far


class Gateway:
    """An OpenAI-compatible server over ``engine`` that records each session's tokens exactly as sampled.

    Args:
        engine: The :class:`~skyrl_train.inference.base.InferenceEngine` to generate with (not owned).
        tokenizer: The policy's tokenizer; its chat template renders chat requests.
        config: Server settings.
        tool_parser: Reads tool calls from reply text (Hermes/Qwen ``<tool_call>`` blocks by default).
        spans: Records each engine call as a ``generate`` span on the ``engine`` lane (a run's timeline).

    Use ``async with Gateway(engine, tokenizer) as gateway:`` (or :meth:`start` / :meth:`stop`), then
    :meth:`open_session` per episode and :meth:`close_session` for its samples.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: PreTrainedTokenizerBase,
        config: GatewayConfig | None = None,
        *,
        tool_parser: ToolParser = parse_hermes_tool_calls,
        spans: SpanRecorder | None = None,
    ) -> None:
        self.engine = engine
        self.spans = spans
        self.config = config or GatewayConfig()
        self.renderer = Renderer(tokenizer, tool_parser)
        self.max_model_len = _context_limit(self.config, engine, tokenizer)
        self.vocab_size = len(tokenizer)
        self.stats = GatewayStats()
        self.url = ""
        self._sessions: dict[str, _Live] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        # One thread decodes, renders and tokenizes (a tokenizer is not safe to share between threads).
        self._prepare: concurrent.futures.ThreadPoolExecutor | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen on ``config.host:config.port``; return the base URL (``http://host:port``)."""
        if self._runner is not None:
            return self.url
        self._loop = asyncio.get_running_loop()
        self._prepare = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gateway-prepare")
        app = web.Application(middlewares=[self._answer_errors], client_max_size=self.config.max_body_bytes)
        for prefix in ("", _SESSION_ROUTE):
            app.router.add_get(prefix + "/v1/models", self._models)
            app.router.add_get(prefix + "/v1/models/{model}", self._model)
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        self._runner = runner
        self.url = f"http://{_url_host(host)}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving (open sessions stay readable through :meth:`close_session`); idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        prepare, self._prepare = self._prepare, None
        if prepare is not None:
            prepare.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- sessions -------------------------------------------------------------------------------------------

    def open_session(self, session_id: str | None = None) -> SessionHandle:
        """Open a session (a random id when None); raises ``ValueError`` for an id in use or not URL-safe."""
        if not self.url:
            raise RuntimeError("start the gateway before opening sessions (await gateway.start())")
        session_id = session_id or uuid.uuid4().hex
        if not SESSION_ID.fullmatch(session_id):
            raise ValueError(f"session ids are 1-128 characters of [A-Za-z0-9._~-]; got {session_id!r}")
        with self._lock:
            if session_id in self._sessions:
                raise ValueError(f"session {session_id!r} is already open")
            self._sessions[session_id] = _Live(Session(session_id, self.renderer.end_of_turn_token_id))
            self.stats.sessions_opened += 1
        return SessionHandle(session_id, f"{self.url}/s/{session_id}/v1", session_id)

    def session(self, session_id: str) -> Session:
        """The recording of an open session (``KeyError`` when none is open under that id)."""
        return self._sessions[session_id].session

    def close_session(self, session_id: str) -> list[Sample]:
        """Close a session and return its samples; its requests still in flight are cancelled, unrecorded."""
        with self._lock:
            live = self._sessions.pop(session_id, None)
            if live is None:
                raise KeyError(f"no open session {session_id!r}")
            self.stats.sessions_closed += 1
        samples = live.session.close()
        for task in list(live.tasks):
            self._cancel_soon(task)
        return samples

    def _cancel_soon(self, task: asyncio.Future[Any]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task.cancel()
        else:
            loop.call_soon_threadsafe(task.cancel)

    # -- routes ---------------------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        return web.json_response(self._model_card())

    def _model_card(self) -> dict[str, Any]:
        card: dict[str, Any] = {"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "skyrl"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return card

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        live = self._live(request)
        body = await self._body(request)
        chat, conversation, plan = await self._off_loop(self._plan_chat, live, body)
        params = self._sampling_params(chat.sampling, len(plan.prompt_ids), "messages")
        self._admit(live, [(len(plan.prompt_ids), params.max_tokens)] * chat.sampling.n)
        head = self._head("chatcmpl", chat.model, [plan.prompt_ids])

        async def work() -> tuple[dict[str, Any], list[dict[str, Any]]]:
            outputs = await self._generate(live, [plan.prompt_ids] * chat.sampling.n, params)
            choices = [
                self._choice(k, out, chat.sampling, chat.parse_tool_calls, chat.logprobs)
                for k, out in enumerate(outputs)
            ]
            keys = [self.renderer.reply_key(conversation, chat_message(choice)) for choice in choices]
            self._record(live, plan, outputs, keys)
            if chat.stream:
                return {}, chat_chunks(head, chat, choices)
            return chat_response(head, chat, choices), []

        return await self._respond(request, chat, work)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        live = self._live(request)
        body = await self._body(request)
        completion, plans = await self._off_loop(self._plan_completions, live, body)
        params = [self._sampling_params(completion.sampling, len(p.prompt_ids), "prompt") for p in plans]
        n = completion.sampling.n
        self._admit(live, [(len(plan.prompt_ids), p.max_tokens) for plan, p in zip(plans, params, strict=True)] * n)
        head = self._head("cmpl", completion.model, [plan.prompt_ids for plan in plans])

        async def work() -> tuple[dict[str, Any], list[dict[str, Any]]]:
            batches = await asyncio.gather(
                *(self._generate(live, [plan.prompt_ids] * n, p) for plan, p in zip(plans, params, strict=True))
            )
            choices: list[Choice] = []
            prompt_of: list[int] = []
            for index, (plan, outputs) in enumerate(zip(plans, batches, strict=True)):
                self._record(live, plan, outputs, [None] * len(outputs))
                for output in outputs:
                    want_texts = completion.logprobs is not None
                    choices.append(self._choice(len(choices), output, completion.sampling, False, want_texts))
                    prompt_of.append(index)
            if completion.stream:
                return {}, completion_chunks(head, completion, choices, prompt_of)
            return completion_response(head, completion, choices, prompt_of), []

        return await self._respond(request, completion, work)

    # -- preparing a request (on the prepare thread) ----------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        """The request's JSON, decoded and size-checked on the prepare thread."""
        raw = await _read_body(request)
        return await self._off_loop(self._decode, raw)

    def _decode(self, raw: bytes) -> Any:
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from exc
        check_prompt_chars(body, self.config)
        return body

    def _plan_chat(self, live: _Live, body: Any) -> tuple[ChatRequest, Conversation, Plan]:
        chat = parse_chat_request(body, max_n=self.config.max_n)
        check_template_kwargs(chat.template_options, self.config)
        conversation = self.renderer.conversation(chat.messages, chat.tools, chat.template_options)
        plan = live.session.plan(
            conversation.keys,
            lambda start: self.renderer.delta_ids(conversation, start),
            lambda: self.renderer.full_ids(conversation),
        )
        return chat, conversation, plan

    def _plan_completions(self, live: _Live, body: Any) -> tuple[CompletionRequest, list[Plan]]:
        completion = parse_completion_request(body, max_n=self.config.max_n)
        samples = len(completion.prompts) * completion.sampling.n
        check_request_size(samples, 0, self.config)  # before tokenizing prompts that would be refused anyway
        return completion, [self._completion_plan(live, prompt, completion) for prompt in completion.prompts]

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the prepare thread (inline when the gateway is not serving)."""
        if self._prepare is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._prepare, functools.partial(fn, *args))

    def _admit(self, live: _Live, samples: Sequence[tuple[int, int]]) -> None:
        """Charge a request's samples (``(prompt tokens, max_tokens)`` each) to its session, or refuse it."""
        tokens = sum(prompt + reply for prompt, reply in samples)
        check_request_size(len(samples), tokens, self.config)
        live.budget.admit(len(samples), tokens, self.config)

    def _completion_plan(self, live: _Live, prompt: str | list[int], completion: CompletionRequest) -> Plan:
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

    # -- shared steps ---------------------------------------------------------------------------------------

    def _live(self, request: web.Request) -> _Live:
        """The open session a request names, by its URL path or else its bearer token."""
        session_id = request.match_info.get("session")
        missing: type[SessionNotFoundError] = SessionNotFoundError
        if session_id is None:
            missing = UnknownSessionKeyError
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            session_id = token.strip()
            if scheme.lower() != "bearer" or not session_id:
                raise missing(
                    "no session named: use the session's base URL (/s/<session>/v1) or send the session id as "
                    "the API key (Authorization: Bearer <session>)"
                )
        live = self._sessions.get(session_id)
        if live is None:
            raise missing(f"no open session {session_id!r}: open it with Gateway.open_session before sending requests")
        return live

    def _sampling_params(self, sampling: Sampling, prompt_length: int, param: str) -> SamplingParams:
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

    def _head(self, prefix: str, model: str | None, prompts: list[list[int]]) -> Head:
        total = sum(len(p) for p in prompts)
        return Head(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model or self.config.model_name, total, prompts)

    async def _generate(
        self, live: _Live, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[GenerationOutput]:
        """The engine's outputs, waiting as long as it takes (a paused engine holds the call)."""
        task = asyncio.ensure_future(self.engine.generate(prompts, params))
        live.tasks.add(task)
        start = time.monotonic()
        try:
            with self.spans.span("engine", "generate") if self.spans is not None else contextlib.nullcontext():
                outputs = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and live.session.closed and (current is None or not current.cancelling()):
                raise SessionClosedError(f"session {live.session.session_id!r} was closed during the request") from None
            raise
        except GatewayError:
            raise
        except ValueError as exc:
            raise InvalidRequestError(f"the engine refused the request: {exc}") from exc
        except Exception as exc:
            raise EngineError(f"the inference engine failed: {type(exc).__name__}: {exc}") from exc
        finally:
            live.tasks.discard(task)
            self.stats.engine_calls += 1
            self.stats.engine_s += time.monotonic() - start
        if len(outputs) != len(prompts) or any(o.logprobs is None for o in outputs):
            raise EngineError("the inference engine returned too few outputs or no log-probabilities")
        return outputs

    def _choice(
        self, index: int, output: GenerationOutput, sampling: Sampling, parse_tools: bool, token_texts: bool
    ) -> Choice:
        text = self.renderer.decode(output.token_ids)
        if output.stop_reason == "stop" and sampling.stop:
            text = _before_stop(text, sampling.stop)
        reply = self.renderer.tool_parser(text) if parse_tools else ParsedReply(text, [])
        texts = self.renderer.token_texts(output.token_ids) if token_texts else None
        return Choice(index, output, text, reply, texts)

    def _record(self, live: _Live, plan: Plan, outputs: Sequence[GenerationOutput], keys: Sequence[Any]) -> None:
        if not live.session.record(plan, outputs, keys):
            raise SessionClosedError(f"session {live.session.session_id!r} was closed during the request")

    async def _respond(
        self,
        request: web.Request,
        parsed: ChatRequest | CompletionRequest,
        work: Callable[[], Awaitable[tuple[dict[str, Any], list[dict[str, Any]]]]],
    ) -> web.StreamResponse:
        if not parsed.stream:
            body, _ = await work()
            return web.json_response(body, dumps=_dumps)
        return await self._stream(request, work())

    async def _stream(
        self, request: web.Request, work: Awaitable[tuple[dict[str, Any], list[dict[str, Any]]]]
    ) -> web.StreamResponse:
        """Answer as server-sent events: comments while the engine works, then the chunks and ``[DONE]``."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        task = asyncio.ensure_future(work)
        try:
            while not (await asyncio.wait({task}, timeout=self.config.stream_keepalive_s))[0]:
                await response.write(_KEEPALIVE)
            try:
                _, chunks = task.result()
            except GatewayError as exc:  # the status line is sent already: the error goes in the stream
                self.stats.errors += 1
                await response.write(_event(exc.body()))
                return response
            await response.write(b"".join(_event(chunk) for chunk in chunks) + _DONE)
        except (ConnectionError, asyncio.CancelledError):
            task.add_done_callback(_consume)  # the generation goes on and is recorded; nobody reads its result
            raise
        await response.write_eof()
        return response

    @web.middleware
    async def _answer_errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every failure as OpenAI's error body with its HTTP status; the server never dies on a request."""
        try:
            return await handler(request)
        except GatewayError as exc:
            self.stats.errors += 1
            return web.json_response(exc.body(), status=exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            self.stats.errors += 1
            message = f"{request.method} {request.path}: {exc.reason}"
            return web.json_response(error_body(message, "invalid_request_error"), status=exc.status)
        except Exception as exc:
            self.stats.errors += 1
            logger.exception("gateway: %s %s failed", request.method, request.path)
            body = error_body(f"internal server error: {type(exc).__name__}: {exc}", "server_error")
            return web.json_response(body, status=500)


def _context_limit(config: GatewayConfig, engine: object, tokenizer: PreTrainedTokenizerBase) -> int | None:
    """``config.max_model_len``, else the engine's ``max_model_len``, else a plausible tokenizer limit."""
    for candidate in (config.max_model_len, getattr(engine, "max_model_len", None)):
        if isinstance(candidate, int) and candidate > 0:
            return candidate
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**7 else None  # HF's "unset" is ~1e30


async def _read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise RequestTooLargeError(f"the request body is too large: {exc.text} (GatewayConfig.max_body_bytes)") from exc


def _no_delta(start: int) -> list[int]:
    raise AssertionError("token-id prompts carry no conversation keys, so no message match can ask for a delta")


def _before_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the earliest stop string (OpenAI leaves the stop string out of the content)."""
    cuts = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return text[: min(cuts)] if cuts else text


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _event(data: Any) -> bytes:
    return b"data: " + _dumps(data).encode() + b"\n\n"


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        with contextlib.suppress(BaseException):
            task.exception()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
