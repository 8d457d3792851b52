"""A trace per episode: named spans with start and end times (seconds since the trace began, wall time)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Span", "Trace"]


@dataclass
class Span:
    """One timed piece of work. ``error`` is the exception type's name when the work raised."""

    name: str
    start_s: float
    end_s: float | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def duration_s(self) -> float:
        """Seconds the span lasted (0 while still open)."""
        return 0.0 if self.end_s is None else self.end_s - self.start_s


class Trace:
    """The spans of one episode, in the order they started.

    Span names used by the dispatcher and agents: ``queue_wait`` (attribute ``slot``: ``input``, ``held``,
    ``acquire``, ``run`` or ``grade``), ``sandbox_start``, ``agent``, ``env_init``, ``llm_call``, ``tool_call``,
    ``grade``, ``release``, ``retry_wait``.
    """

    def __init__(self, episode_id: str, time_fn: Callable[[], float] = time.monotonic) -> None:
        self.episode_id = episode_id
        self._time = time_fn
        self._origin = time_fn()
        self.spans: list[Span] = []

    def now_s(self) -> float:
        """Seconds since the trace began."""
        return self._time() - self._origin

    @contextmanager
    def span(self, name: str, **attrs: Any) -> Iterator[Span]:
        """Time the body as a span; the span is closed and kept on every exit path."""
        span = Span(name, self.now_s(), attrs=dict(attrs))
        self.spans.append(span)
        try:
            yield span
        except BaseException as exc:
            span.error = type(exc).__name__
            raise
        finally:
            span.end_s = self.now_s()

    def add(self, name: str, start_s: float, end_s: float, **attrs: Any) -> Span:
        """Record a span measured elsewhere (e.g. a queue wait)."""
        span = Span(name, start_s, end_s, attrs=dict(attrs))
        self.spans.append(span)
        return span

    def named(self, name: str) -> list[Span]:
        """The spans called ``name``."""
        return [s for s in self.spans if s.name == name]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "episode_id": self.episode_id,
            "spans": [
                {"name": s.name, "start_s": s.start_s, "end_s": s.end_s, "attrs": s.attrs, "error": s.error}
                for s in self.spans
            ],
        }
