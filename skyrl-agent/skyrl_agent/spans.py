"""Where an episode's time goes, recorded into a timeline the caller owns (skyrl-train's run timeline).

Any object with ``span(lane, name)`` returning a context manager records (``skyrl_train.timeline.Timeline`` has
it); skyrl-agent never imports the trainer for it. The lanes an SWE episode writes::

    sandbox   start (create the episode's sandbox), close
    env       one span per env call (init, step: a tool call run in the sandbox)
    engine    one span per LLM call to the trainer's engine (TrainEngineClient)
    reward    grade (the submitted diff, in a fresh sandbox)
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from skyrl_gym.async_env import ainit, astep

__all__ = ["SpanRecorder", "SpannedEnv", "span_on"]


class SpanRecorder(Protocol):
    """Records the ``with`` block of ``span(lane, name)`` as a span on ``lane``."""

    def span(self, lane: str, name: str) -> AbstractContextManager[None]:
        """A context manager that records its block (also when it raises)."""
        ...


def span_on(spans: SpanRecorder | None, lane: str, name: str) -> AbstractContextManager[None]:
    """``spans.span(lane, name)``, or a context that records nothing when there is no recorder."""
    return spans.span(lane, name) if spans is not None else nullcontext()


class SpannedEnv:
    """``env`` with each ``init`` and ``step`` recorded on the ``env`` lane; everything else is ``env``'s."""

    def __init__(self, env: Any, spans: SpanRecorder) -> None:
        self.env, self.spans = env, spans

    async def ainit(self, prompt: Any) -> Any:
        """The env's init (native or in a thread), as an ``init`` span."""
        with self.spans.span("env", "init"):
            return await ainit(self.env, prompt)

    async def astep(self, action: str) -> Any:
        """The env's step (native or in a thread), as a ``step`` span."""
        with self.spans.span("env", "step"):
            return await astep(self.env, action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)
