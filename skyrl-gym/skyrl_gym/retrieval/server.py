"""An HTTP retrieval service with the Search-R1 ``/retrieve`` API, backed by a BM25 index.

Endpoints:

``POST /retrieve``
    Body: ``{"query": str}`` or ``{"queries": [str, ...]}``, plus optional ``"topk"`` (int >= 1, default: the
    server's) and ``"return_scores"`` (bool, default false). Answer: ``{"result": [hits, ...]}``, one list per
    query, best first. With ``return_scores`` a hit is ``{"document": {"id", "contents"}, "score": float}``,
    without it just the document ``{"id", "contents"}``, as Search-R1's server answers.
    A malformed request gets ``400 {"error": "<what is wrong>"}``; an oversized one ``413``.
``GET /health``
    ``{"status": "ok", "num_documents": N}``.

:class:`RetrievalServer` runs the service on a background thread (port 0 picks a free port)::

    with RetrievalServer(BM25Index.load("index/")) as server:
        requests.post(server.url, json={"query": "Ovel River", "topk": 3})
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final, Literal, Self, cast

from skyrl_gym.retrieval.bm25 import BM25Index, SearchHit

__all__ = ["MAX_BODY_BYTES", "MAX_TOPK", "BadRequest", "RetrievalServer", "parse_retrieve_request"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES: Final = 8 * 1024 * 1024
"""Largest request body accepted; larger ones get 413 without being read."""

MAX_TOPK: Final = 1000
"""Largest ``topk`` a request may ask for."""

IDLE_CONNECTION_TIMEOUT_S: Final = 60.0
"""Seconds a kept-alive connection may sit idle before its handler thread gives up on it."""


class BadRequest(ValueError):
    """A ``/retrieve`` request the server cannot answer; the message is sent back as the 400 ``error``."""


def parse_retrieve_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    """Validate a ``/retrieve`` body.

    Returns:
        ``(queries, topk, return_scores)``.

    Raises:
        BadRequest: The body is not a JSON object of the documented shape; the message says what is wrong.
    """
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(payload).__name__}")
    return _queries_of(payload), _topk_of(payload, default_topk), _return_scores_of(payload)


def _queries_of(payload: dict[str, Any]) -> list[str]:
    if ("query" in payload) == ("queries" in payload):
        raise BadRequest('give exactly one of "query" (a string) or "queries" (a list of strings)')
    if "query" in payload:
        if not isinstance(payload["query"], str):
            raise BadRequest(f'"query" must be a string, got {type(payload["query"]).__name__}')
        return [payload["query"]]
    queries = payload["queries"]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest('"queries" must be a list of strings')
    return queries


def _topk_of(payload: dict[str, Any], default_topk: int) -> int:
    topk = payload.get("topk")
    if topk is None:
        return default_topk
    # bool is an int subclass; `"topk": true` is a client bug, not 1.
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise BadRequest(f'"topk" must be an integer between 1 and {MAX_TOPK}, got {topk!r}')
    return topk


def _return_scores_of(payload: dict[str, Any]) -> bool:
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BadRequest(f'"return_scores" must be true or false, got {return_scores!r}')
    return return_scores


class _Server(ThreadingHTTPServer):
    """The HTTP server plus what handlers need: the index, the default topk and the open connections."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], index: BM25Index, default_topk: int) -> None:
        super().__init__(address, _Handler)
        self.index = index
        self.default_topk = default_topk
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to stderr; a client hanging up mid-response is routine.
        logger.debug("error while serving %s", client_address, exc_info=True)

    def close_connections(self) -> None:
        """Shut every open client connection, so no handler thread outlives the server."""
        with self.connections_lock:
            connections = list(self.connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # already closed by the peer
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 so clients (requests.Session) keep connections alive between searches.
    protocol_version = "HTTP/1.1"
    server_version = "skyrl-gym-retriever"
    timeout = IDLE_CONNECTION_TIMEOUT_S

    @property
    def _server(self) -> _Server:
        return cast(_Server, self.server)

    def setup(self) -> None:
        super().setup()
        with self._server.connections_lock:
            self._server.connections.add(self.connection)

    def finish(self) -> None:
        with self._server.connections_lock:
            self._server.connections.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        if self._route() == "/health":
            self._send_json(HTTPStatus.OK, {"status": "ok", "num_documents": self._server.index.num_documents})
        else:
            self._send_error(HTTPStatus.NOT_FOUND, f"no such endpoint: GET {self.path}; try GET /health")

    def do_POST(self) -> None:
        if self._route() != "/retrieve":
            self._send_error(HTTPStatus.NOT_FOUND, f"no such endpoint: POST {self.path}; try POST /retrieve")
            return
        body = self._read_body()
        if body is None:
            return
        try:
            queries, topk, return_scores = parse_retrieve_request(body, self._server.default_topk)
        except BadRequest as exc:
            self._send_error(HTTPStatus.BAD_REQUEST, str(exc), keep_alive=True)
            return
        index = self._server.index
        try:
            result = [[_hit_json(index, hit, return_scores) for hit in index.search(q, topk)] for q in queries]
        except Exception as exc:  # a bug, not a client error: answer 500 rather than drop the connection
            logger.exception("retrieval failed for %d queries", len(queries))
            self._send_error(HTTPStatus.INTERNAL_SERVER_ERROR, f"retrieval failed: {type(exc).__name__}: {exc}")
            return
        self._send_json(HTTPStatus.OK, {"result": result})

    def _route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering a request whose length is missing or too large."""
        length_header = self.headers.get("Content-Length")
        try:
            length = int(length_header) if length_header is not None else -1
        except ValueError:
            length = -1
        if length < 0:
            self._send_error(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header with the body size is required")
            return None
        if length > MAX_BODY_BYTES:
            self._send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
            return None
        return self.rfile.read(length)

    def _send_error(self, status: HTTPStatus, message: str, *, keep_alive: bool = False) -> None:
        # Unless the body was consumed, the connection cannot be reused: its unread bytes would be taken for the
        # next request.
        if not keep_alive:
            self.close_connection = True
        self._send_json(status, {"error": message})

    def _send_json(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        # The default writes every request to stderr; route it to logging so embedding code decides.
        logger.debug("%s - %s", self.address_string(), format % args)


def _hit_json(index: BM25Index, hit: SearchHit, return_scores: bool) -> dict[str, Any]:
    document = index.documents[hit.row]
    return {"document": document, "score": hit.score} if return_scores else document


class RetrievalServer:
    """The retrieval service on a background thread: start it, use :attr:`url`, stop it.

    ``RetrievalServer(index, port=0)`` binds immediately (port 0: a free port, see :attr:`port`); :meth:`start`
    begins serving and :meth:`stop` shuts the listener and every open connection and joins the thread. As a
    context manager it starts on entry and stops on exit. The caller owns the index; the server only reads it.

    Args:
        index: The index to serve.
        host: The address to bind (IPv4).
        port: The port to bind; 0 picks a free one.
        default_topk: ``topk`` for requests that give none.
    """

    def __init__(self, index: BM25Index, host: str = "127.0.0.1", port: int = 0, default_topk: int = 3) -> None:
        if not 1 <= default_topk <= MAX_TOPK:
            raise ValueError(f"default_topk must be between 1 and {MAX_TOPK}, got {default_topk}")
        self.index = index
        self._httpd = _Server((host, port), index, default_topk)
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        """The bound address."""
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0)."""
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://host:port``; a wildcard bind address is reported as 127.0.0.1."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The ``/retrieve`` endpoint, ready for ``SearchToolGroup(search_url=...)``."""
        return f"{self.base_url}/retrieve"

    def start(self) -> Self:
        """Serve on a daemon thread; returns immediately. Calling it twice is an error."""
        if self._thread is not None:
            raise RuntimeError("RetrievalServer.start() called twice")
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="retrieval-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the socket and every client connection. Idempotent."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.close_connections()
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        self.stop()
        return False
