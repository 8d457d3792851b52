r"""The search tool: queries a Search-R1 style retrieval service over HTTP.

``SearchToolGroup().search("Ovel River")`` POSTs ``{"query", "topk", "return_scores"}`` to the service's
``/retrieve`` URL (see :mod:`skyrl_gym.retrieval.server` for one you can run) and returns a JSON string
``{"result": "<text>"}``, where the text is the retrieved passages as ``Doc i: <contents>`` lines, one block per
query joined by ``"\n---\n"``, or ``"No search results found."``, or ``"Search error: <what failed>"``. The tool
never raises for service failures: the model sees the error text instead.

The HTTP call is the module-level :func:`call_search_api`, looked up on every search and called with keyword
arguments, so tests can replace it with ``unittest.mock.patch("skyrl_gym.tools.search.call_search_api")``.
Transient failures (HTTP 500/502/503/504, connection errors, timeouts) are retried :data:`MAX_RETRIES` times in
all, waiting ``INITIAL_RETRY_DELAY * attempt`` seconds between attempts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from skyrl_gym.tools.core import ToolGroup, tool

__all__ = [
    "DEFAULT_SEARCH_URL",
    "DEFAULT_TIMEOUT",
    "INITIAL_RETRY_DELAY",
    "MAX_RETRIES",
    "RETRYABLE_STATUS_CODES",
    "SearchToolGroup",
    "call_search_api",
    "format_search_response",
]

logger = logging.getLogger(__name__)

DEFAULT_SEARCH_URL = "http://127.0.0.1:8000/retrieve"
DEFAULT_TIMEOUT = 30
"""Seconds to wait for each HTTP attempt (connect and read)."""

MAX_RETRIES = 10
"""Attempts per search, the first included. Read at call time, so tests may patch it."""

INITIAL_RETRY_DELAY = 1.0
"""Seconds to wait after the first failed attempt; the wait after attempt ``n`` is ``n`` times this."""

RETRYABLE_STATUS_CODES = frozenset({500, 502, 503, 504})

NO_RESULTS = "No search results found."
SESSION_POOL_SIZE = 256
"""Connections kept alive per retrieval service: one per concurrent search, as rollouts run many at once."""


def call_search_api(
    retrieval_service_url: str,
    query: str,
    topk: int = 3,
    return_scores: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    log_requests: bool = True,
    session: requests.Session | None = None,
) -> tuple[Any | None, str | None]:
    """POST one query to a retrieval service, retrying transient failures.

    Args:
        retrieval_service_url: The service's ``/retrieve`` URL.
        query: The search query.
        topk: How many passages to ask for.
        return_scores: Ask the service to include scores.
        timeout: Seconds per attempt.
        log_requests: Log each attempt and its outcome at INFO level.
        session: A session to send with (connection reuse); ``None`` uses a one-off connection.

    Returns:
        ``(response_json, None)`` on success, ``(None, error_message)`` once retries are exhausted or on a
        non-retryable failure (another HTTP error status, a body that is not JSON, a malformed URL).
    """
    request_id = uuid.uuid4().hex[:8]
    payload = {"query": query, "topk": topk, "return_scores": return_scores}
    post = session.post if session is not None else requests.post
    attempts = max(1, MAX_RETRIES)
    last_error = "no attempt was made"
    for attempt in range(1, attempts + 1):
        if log_requests:
            logger.info("search %s attempt %d/%d: %s %r", request_id, attempt, attempts, retrieval_service_url, query)
        try:
            response = post(retrieval_service_url, json=payload, timeout=timeout)
        except (requests.ConnectionError, requests.Timeout) as exc:
            last_error = f"{type(exc).__name__} on attempt {attempt}/{attempts}: {exc}"
        except requests.RequestException as exc:
            return None, f"Request failed: {type(exc).__name__}: {exc}"
        else:
            if response.status_code not in RETRYABLE_STATUS_CODES:
                return _decode(response, request_id, log_requests)
            last_error = f"Server Error ({response.status_code}) on attempt {attempt}/{attempts}"
        logger.warning("search %s to %s: %s", request_id, retrieval_service_url, last_error)
        if attempt < attempts:
            time.sleep(INITIAL_RETRY_DELAY * attempt)
    return None, f"API call failed after {attempts} attempts; last error: {last_error}"


def _decode(response: requests.Response, request_id: str, log_requests: bool) -> tuple[Any | None, str | None]:
    """The JSON body of a non-retryable response, or an error naming the status and the service's message."""
    if response.status_code >= 400:
        return None, f"HTTP {response.status_code} from the retrieval service: {response.text[:500]}"
    try:
        body = response.json()
    except ValueError as exc:
        return None, f"The retrieval service returned a body that is not JSON: {exc}"
    if log_requests:
        logger.info("search %s: HTTP %d", request_id, response.status_code)
    return body, None


def _document_contents(hit: Any) -> str:
    """The ``contents`` of one hit, given as ``{"document": {...}, "score": s}`` or as the bare document."""
    document = hit.get("document", hit) if isinstance(hit, Mapping) else None
    contents = document.get("contents") if isinstance(document, Mapping) else None
    if not isinstance(contents, str):
        raise ValueError(f"a retrieved passage has no string 'contents': {str(hit)[:200]}")
    return contents


def _passages_to_text(hits: list[Any]) -> str:
    return "".join(f"Doc {number}: {_document_contents(hit)}\n" for number, hit in enumerate(hits, start=1))


def format_search_response(api_response: Any) -> str:
    """The tool's text for a service response ``{"result": [[hit, ...], ...]}`` (one list per query).

    Raises:
        ValueError: The response does not have that shape.
    """
    if not isinstance(api_response, Mapping):
        raise ValueError(f"expected a JSON object with a 'result' list, got {type(api_response).__name__}")
    per_query = api_response.get("result", [])
    if not isinstance(per_query, list) or not all(isinstance(hits, list) for hits in per_query):
        raise ValueError("expected 'result' to be a list with one list of passages per query")
    if not any(per_query):
        return NO_RESULTS
    return "\n---\n".join(_passages_to_text(hits) for hits in per_query)


class SearchToolGroup(ToolGroup):
    """The ``search`` tool, bound to one retrieval service.

    Args:
        search_url: The service's ``/retrieve`` URL.
        topk: Passages per search.
        timeout: Seconds per HTTP attempt.
        log_requests: Log every request at INFO level.

    Attributes:
        search_url: As given.
        topk: As given.
        timeout: As given.
        log_requests: As given.
    """

    # One session per service (scheme://host:port), shared by every group in the process: rollouts create an
    # env, hence a group, per episode, and reusing kept-alive connections avoids a TCP handshake per search.
    _sessions: ClassVar[dict[str, requests.Session]] = {}
    _sessions_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        search_url: str = DEFAULT_SEARCH_URL,
        topk: int = 3,
        timeout: float = DEFAULT_TIMEOUT,
        log_requests: bool = True,
    ) -> None:
        self.search_url = search_url
        self.topk = topk
        self.timeout = timeout
        self.log_requests = log_requests
        super().__init__(name="SearchToolGroup")

    @classmethod
    def _session_for(cls, url: str) -> requests.Session:
        parts = urlsplit(url)
        key = f"{parts.scheme}://{parts.netloc}"
        with cls._sessions_lock:
            session = cls._sessions.get(key)
            if session is None:
                session = requests.Session()
                adapter = HTTPAdapter(pool_connections=1, pool_maxsize=SESSION_POOL_SIZE)
                session.mount("http://", adapter)
                session.mount("https://", adapter)
                cls._sessions[key] = session
            return session

    @tool
    def search(self, query: str | None) -> str:
        """Retrieve passages for ``query``; returns ``{"result": "<text>"}`` as a JSON string (``""`` for ``None``)."""
        if query is None:
            return ""
        query = str(query).strip()
        api_response, error = call_search_api(
            retrieval_service_url=self.search_url,
            query=query,
            topk=self.topk,
            timeout=self.timeout,
            log_requests=self.log_requests,
            session=self._session_for(self.search_url),
        )
        if error is not None:
            text = f"Search error: {error}"
        elif api_response is None:
            text = "Search error: the retrieval service returned no response"
        else:
            try:
                text = format_search_response(api_response)
            except ValueError as exc:
                text = f"Search error: unexpected response from the retrieval service: {exc}"
        return json.dumps({"result": text})
