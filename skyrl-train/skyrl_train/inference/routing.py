"""Which of several engines answers a request: the one holding the request's prefix, unless it is much busier.

A multi-turn trajectory sends its whole history each turn; the engine that answered the previous turn has that
history in its prefix cache. :class:`PrefixRouter` remembers, per engine, the hashes of the token blocks it has
seen (prompt + completion, in blocks of ``block_size`` tokens, as prefix caches key them) and sends a request to
the engine with the longest matching prefix when the match covers at least ``min_match`` of the prompt (a
continuation, not just a shared system prompt) and that engine has at most ``balance_slack`` more requests in
flight than the least loaded one. Every other request goes to the least loaded engine (the lowest index on ties).

Pure bookkeeping: no I/O, no engines; the caller reports when a request starts and ends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PrefixRouter", "RouterConfig"]


@dataclass(frozen=True)
class RouterConfig:
    """Knobs of :class:`PrefixRouter`."""

    block_size: int = 16  # tokens per hashed block
    min_match: float = 0.5  # share of the prompt a cached prefix must cover to make the request stick
    balance_slack: int = 4  # requests in flight a sticky engine may have beyond the least loaded one
    max_blocks: int = 200_000  # remembered blocks over all engines; the least recently used are forgotten

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_blocks < 1 or self.balance_slack < 0 or not 0 <= self.min_match <= 1:
            raise ValueError(f"invalid router config {self}")


class PrefixRouter:
    """Cache-aware, load-bounded routing over ``num_engines`` engines (see the module docstring)."""

    def __init__(self, num_engines: int, config: RouterConfig | None = None) -> None:
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        self.config = config or RouterConfig()
        self.in_flight = [0] * num_engines
        self._blocks: OrderedDict[int, int] = OrderedDict()  # prefix hash → engine that last saw it

    def route(self, prompt: Sequence[int]) -> int:
        """The engine for ``prompt``; counts the request as in flight there until :meth:`finished`."""
        least = min(range(len(self.in_flight)), key=lambda e: (self.in_flight[e], e))
        engine, matched = self._longest_match(prompt)
        sticky = (
            engine is not None
            and matched >= self.config.min_match * len(prompt)
            and self.in_flight[engine] - self.in_flight[least] <= self.config.balance_slack
        )
        chosen = engine if sticky and engine is not None else least
        self.in_flight[chosen] += 1
        return chosen

    def finished(self, engine: int, sequence: Sequence[int]) -> None:
        """The request on ``engine`` is done; ``sequence`` (prompt + completion) is now in its prefix cache."""
        self.in_flight[engine] -= 1
        for key in self._prefix_hashes(sequence):
            self._blocks[key] = engine
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.config.max_blocks:
            self._blocks.popitem(last=False)

    def _longest_match(self, prompt: Sequence[int]) -> tuple[int | None, int]:
        """The engine holding the longest block prefix of ``prompt``, and that prefix's length in tokens."""
        engine, matched = None, 0
        for blocks, key in enumerate(self._prefix_hashes(prompt), start=1):
            holder = self._blocks.get(key)
            if holder is None:
                break
            engine, matched = holder, blocks * self.config.block_size
        return engine, matched

    def _prefix_hashes(self, tokens: Sequence[int]) -> list[int]:
        """Hashes of ``tokens[:k·block_size]`` for every whole block ``k`` (each chained on the previous one)."""
        size, hashes, running = self.config.block_size, [], 0
        for start in range(0, len(tokens) - size + 1, size):
            running = hash((running, tuple(tokens[start : start + size])))
            hashes.append(running)
        return hashes
