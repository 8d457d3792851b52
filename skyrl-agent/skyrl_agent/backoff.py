"""Exponential backoff with jitter: how long to wait before the next try of a failed call.

Used by the dispatcher's infrastructure retries (:mod:`skyrl_agent.dispatch.retry`, which re-exports it) and by
the HTTP LLM client (:mod:`skyrl_agent.llm.openai`); it imports nothing from the package, so both can.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: try ``n`` (1-based) waits ``min(max_s, base_s * factor**(n-1))``.

    The wait is then scaled by a uniform factor in ``[1 - jitter, 1]`` so that failed attempts of many
    episodes do not retry in lockstep.
    """

    base_s: float = 0.5  # wait after the first failure
    factor: float = 2.0  # growth per further failure
    max_s: float = 30.0  # no wait is longer
    jitter: float = 0.5  # fraction of the wait that is randomised (0 = none, 1 = full jitter)
    max_attempts: int = 3  # tries in all, the first included

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed try ``attempt`` (1-based)."""
        raw = min(self.max_s, self.base_s * self.factor ** (attempt - 1))
        return raw * (1.0 - self.jitter * rng.random())
