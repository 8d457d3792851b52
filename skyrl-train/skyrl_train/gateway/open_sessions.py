"""The gateway's open sessions: opened and closed from any thread, found by the request that names one.

A request names its session by its URL path (``/s/<session>/...``) or, on the bare routes, by its API key
(``Authorization: Bearer <session>``). Closing a session cancels its generations in flight, on the event loop the
registry was bound to.
"""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from skyrl_train.gateway.errors import SessionNotFoundError, UnknownSessionKeyError
from skyrl_train.gateway.limits import SessionBudget
from skyrl_train.gateway.sessions import Sample, Session

if TYPE_CHECKING:
    from aiohttp import web

    from skyrl_train.gateway.settings import GatewayStats
    from skyrl_train.inference.base import GenerationOutput

__all__ = ["SESSION_ID", "LiveSession", "SessionRegistry"]

SESSION_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")
"""What a session id may be: URL-safe, so it fits in a path segment."""


@dataclass
class LiveSession:
    """An open session and its generations in flight."""

    session: Session
    tasks: set[asyncio.Future[list[GenerationOutput]]] = field(default_factory=set)
    budget: SessionBudget = field(default_factory=SessionBudget)  # what its requests asked for so far


class SessionRegistry:
    """Open sessions by id, counted in ``stats``; :meth:`open` and :meth:`close` may be called from any thread.

    ``end_of_turn_token_id``: what each new :class:`~skyrl_train.gateway.sessions.Session` closes unfinished
    replies with.
    """

    def __init__(self, end_of_turn_token_id: int, stats: GatewayStats) -> None:
        self.end_of_turn_token_id = end_of_turn_token_id
        self.stats = stats
        self._live: dict[str, LiveSession] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel in-flight generations on ``loop`` (the loop the server and the engine run on)."""
        self._loop = loop

    def open(self, session_id: str | None = None) -> str:
        """Open a session (a random id when None) and return its id.

        Raises ``ValueError`` for an id in use or not URL-safe.
        """
        session_id = session_id or uuid.uuid4().hex
        if not SESSION_ID.fullmatch(session_id):
            raise ValueError(f"session ids are 1-128 characters of [A-Za-z0-9._~-]; got {session_id!r}")
        with self._lock:
            if session_id in self._live:
                raise ValueError(f"session {session_id!r} is already open")
            self._live[session_id] = LiveSession(Session(session_id, self.end_of_turn_token_id))
            self.stats.sessions_opened += 1
        return session_id

    def close(self, session_id: str) -> list[Sample]:
        """Close a session and return its samples; its requests still in flight are cancelled, unrecorded."""
        with self._lock:
            live = self._live.pop(session_id, None)
            if live is None:
                raise KeyError(f"no open session {session_id!r}")
            self.stats.sessions_closed += 1
        samples = live.session.close()
        for task in list(live.tasks):
            self._cancel_soon(task)
        return samples

    def __getitem__(self, session_id: str) -> LiveSession:
        """The open session ``session_id`` (``KeyError`` when none is open under that id)."""
        return self._live[session_id]

    def for_request(self, request: web.Request) -> LiveSession:
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
        live = self._live.get(session_id)
        if live is None:
            raise missing(f"no open session {session_id!r}: open it with Gateway.open_session before sending requests")
        return live

    def _cancel_soon(self, task: asyncio.Future[Any]) -> None:
        """Cancel ``task`` on the bound loop, from whatever thread this runs on (nothing once the loop closed)."""
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
