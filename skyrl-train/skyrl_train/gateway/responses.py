"""How the gateway answers: a JSON body or server-sent events, and every failure as OpenAI's error body.

A streamed answer sends its status line at once, then an SSE comment every ``keepalive_s`` while the engine works
(clients that time out between bytes keep waiting), then the chunks and ``[DONE]``. A failure after the status line
goes into the stream as an error event. A client that disconnects does not cancel the work: what was sampled is
still recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from skyrl_train.gateway.errors import GatewayError, error_body

if TYPE_CHECKING:
    from skyrl_train.gateway.settings import GatewayStats

__all__ = ["Answer", "answer", "answer_errors", "dumps"]

logger = logging.getLogger(__name__)

Answer = tuple[dict[str, Any], list[dict[str, Any]]]
"""What a request's work produces: the JSON body (non-streamed), or the chunks to stream."""

_DONE = b"data: [DONE]\n\n"
_KEEPALIVE = b": keep-alive\n\n"


async def answer(
    request: web.Request, stream: bool, work: Callable[[], Awaitable[Answer]], keepalive_s: float, stats: GatewayStats
) -> web.StreamResponse:
    """Run ``work`` and answer with its body, or with its chunks as server-sent events when ``stream``."""
    if not stream:
        body, _ = await work()
        return web.json_response(body, dumps=dumps)
    return await _stream(request, work(), keepalive_s, stats)


async def _stream(
    request: web.Request, work: Awaitable[Answer], keepalive_s: float, stats: GatewayStats
) -> web.StreamResponse:
    """Answer as server-sent events: comments while the engine works, then the chunks and ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    task = asyncio.ensure_future(work)
    try:
        while not (await asyncio.wait({task}, timeout=keepalive_s))[0]:
            await response.write(_KEEPALIVE)
        try:
            _, chunks = task.result()
        except GatewayError as exc:  # the status line is sent already: the error goes in the stream
            stats.errors += 1
            await response.write(_event(exc.body()))
            return response
        await response.write(b"".join(_event(chunk) for chunk in chunks) + _DONE)
    except (ConnectionError, asyncio.CancelledError):
        task.add_done_callback(_consume)  # the generation goes on and is recorded; nobody reads its result
        raise
    await response.write_eof()
    return response


def answer_errors(stats: GatewayStats) -> Middleware:
    """A middleware answering every failure as OpenAI's error body with its HTTP status, counted in ``stats``.

    The server never dies on a request: an unexpected exception is logged and answered 500.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as exc:
            stats.errors += 1
            return web.json_response(exc.body(), status=exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            stats.errors += 1
            message = f"{request.method} {request.path}: {exc.reason}"
            return web.json_response(error_body(message, "invalid_request_error"), status=exc.status)
        except Exception as exc:
            stats.errors += 1
            logger.exception("gateway: %s %s failed", request.method, request.path)
            body = error_body(f"internal server error: {type(exc).__name__}: {exc}", "server_error")
            return web.json_response(body, status=500)

    return middleware


def dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept as it is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _event(data: Any) -> bytes:
    return b"data: " + dumps(data).encode() + b"\n\n"


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        with contextlib.suppress(BaseException):
            task.exception()
