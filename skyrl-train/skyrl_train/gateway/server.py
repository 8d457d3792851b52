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

Pieces: :mod:`~skyrl_train.gateway.open_sessions`, :mod:`~skyrl_train.gateway.prepare` (a request turned into
engine work), :mod:`~skyrl_train.gateway.responses` (JSON, SSE and errors); settings and counters in
:mod:`~skyrl_train.gateway.settings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from skyrl_train.gateway.errors import EngineError, GatewayError, InvalidRequestError, SessionClosedError
from skyrl_train.gateway.open_sessions import SESSION_ID, LiveSession, SessionRegistry
from skyrl_train.gateway.prepare import RequestPreparer
from skyrl_train.gateway.protocol import (
    Choice,
    Head,
    Sampling,
    chat_chunks,
    chat_message,
    chat_response,
    completion_chunks,
    completion_response,
)
from skyrl_train.gateway.render import ParsedReply, Renderer, ToolParser, parse_hermes_tool_calls
from skyrl_train.gateway.responses import Answer, answer, answer_errors
from skyrl_train.gateway.sessions import Plan, Sample, Session
from skyrl_train.gateway.settings import GatewayConfig, GatewayStats

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams

__all__ = ["SESSION_ID", "Gateway", "GatewayConfig", "GatewayStats", "SessionHandle"]

_SESSION_ROUTE = r"/s/{session:[A-Za-z0-9._~-]{1,128}}"


@dataclass(frozen=True)
class SessionHandle:
    """How a harness reaches its session: an OpenAI client with ``base_url`` (and any key), or ``api_key``."""

    session_id: str
    base_url: str  # <gateway url>/s/<session>/v1
    api_key: str  # the session id; on the bare <gateway url>/v1 routes it names the session


class SpanRecorder(Protocol):
    """Where the gateway records each engine call (``skyrl_train.timeline.Timeline`` is one)."""

    def span(self, lane: str, name: str) -> AbstractContextManager[None]:
        """A context manager that records its block as a span on ``lane``."""
        ...


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
        self._sessions = SessionRegistry(self.renderer.end_of_turn_token_id, self.stats)
        self._prepare = RequestPreparer(self.renderer, self.config, self.max_model_len, self.vocab_size)
        self._runner: web.AppRunner | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen on ``config.host:config.port``; return the base URL (``http://host:port``)."""
        if self._runner is not None:
            return self.url
        self._sessions.bind(asyncio.get_running_loop())
        self._prepare.start()
        app = web.Application(middlewares=[answer_errors(self.stats)], client_max_size=self.config.max_body_bytes)
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
        self._prepare.stop()

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
        session_id = self._sessions.open(session_id)
        return SessionHandle(session_id, f"{self.url}/s/{session_id}/v1", session_id)

    def session(self, session_id: str) -> Session:
        """The recording of an open session (``KeyError`` when none is open under that id)."""
        return self._sessions[session_id].session

    def close_session(self, session_id: str) -> list[Sample]:
        """Close a session and return its samples; its requests still in flight are cancelled, unrecorded."""
        return self._sessions.close(session_id)

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
        live = self._sessions.for_request(request)
        prepared = await self._prepare.chat(request, live)
        chat, conversation, plan = prepared.chat, prepared.conversation, prepared.plan
        head = self._head("chatcmpl", chat.model, [plan.prompt_ids])

        async def work() -> Answer:
            outputs = await self._generate(live, [plan.prompt_ids] * chat.sampling.n, prepared.params)
            choices = [
                self._choice(k, out, chat.sampling, chat.parse_tool_calls, chat.logprobs)
                for k, out in enumerate(outputs)
            ]
            keys = [self.renderer.reply_key(conversation, chat_message(choice)) for choice in choices]
            self._record(live, plan, outputs, keys)
            if chat.stream:
                return {}, chat_chunks(head, chat, choices)
            return chat_response(head, chat, choices), []

        return await answer(request, chat.stream, work, self.config.stream_keepalive_s, self.stats)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        live = self._sessions.for_request(request)
        prepared = await self._prepare.completions(request, live)
        completion, plans, n = prepared.completion, prepared.plans, prepared.completion.sampling.n
        head = self._head("cmpl", completion.model, [plan.prompt_ids for plan in plans])

        async def work() -> Answer:
            pairs = zip(plans, prepared.params, strict=True)
            batches = await asyncio.gather(*(self._generate(live, [plan.prompt_ids] * n, p) for plan, p in pairs))
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

        return await answer(request, completion.stream, work, self.config.stream_keepalive_s, self.stats)

    # -- shared steps ---------------------------------------------------------------------------------------

    def _head(self, prefix: str, model: str | None, prompts: list[list[int]]) -> Head:
        total = sum(len(p) for p in prompts)
        return Head(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model or self.config.model_name, total, prompts)

    async def _generate(
        self, live: LiveSession, prompts: Sequence[Sequence[int]], params: SamplingParams
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

    def _record(self, live: LiveSession, plan: Plan, outputs: Sequence[GenerationOutput], keys: Sequence[Any]) -> None:
        if not live.session.record(plan, outputs, keys):
            raise SessionClosedError(f"session {live.session.session_id!r} was closed during the request")


def _context_limit(config: GatewayConfig, engine: object, tokenizer: PreTrainedTokenizerBase) -> int | None:
    """``config.max_model_len``, else the engine's ``max_model_len``, else a plausible tokenizer limit."""
    for candidate in (config.max_model_len, getattr(engine, "max_model_len", None)):
        if isinstance(candidate, int) and candidate > 0:
            return candidate
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**7 else None  # HF's "unset" is ~1e30


def _before_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the earliest stop string (OpenAI leaves the stop string out of the content)."""
    cuts = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return text[: min(cuts)] if cuts else text


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
