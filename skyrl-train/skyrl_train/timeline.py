"""Where the time of a run goes: spans per role, busy fractions, a Chrome trace and a picture.

Roles record spans into one :class:`Timeline`, each span on a *lane*:

    step      one span per training step (the window the busy fractions of a step are taken over)
    trainer   prepare (reference / old log-probs, advantages), update (forward, backward, optimizer steps)
    waiting   the trainer waiting for generation: rollouts (a stepped mode's batch), rollouts ahead (one_step_off,
              before the sync), batch (fully_async: until enough groups are ready)
    sync      weight sync, hand-over of colocated memory
    engine    one span per generation call, from request to answer (overlapping calls overlap)
    engine i  with engines as actors (an ``EngineGroup``), one span per request on the engine that served it
    env       one span per env call (init, step, metrics, close)
    sandbox   agent episodes (skyrl-agent): sandbox start and close
    reward    agent episodes: grading a submission (in a sandbox of its own)

A lane's *busy fraction* over a window is the length of the union of its spans in the window over the window's
length: the engine lane's is the share of the time at least one request was in the engines, the trainer lane's the
share of the time the trainer computed. With a lane per engine, the engines' busy fraction is the mean of theirs.
The trainer logs both every step (``timing/engine_busy_fraction``, ``timing/trainer_busy_fraction``); what neither
covers is time the accelerators wait.

:meth:`Timeline.write_trace` writes the Chrome trace-event format (``trace.json``, opened by Perfetto or
``chrome://tracing``): one thread per lane. :meth:`Timeline.write_png` draws one row per lane over the training
steps, with the lanes' busy fractions over the steps in the title (``timeline.png``). A timeline keeps its last
``max_spans`` spans, so a long run's memory stays bounded; busy fractions of earlier windows are computed when their
step ends, so they are unaffected.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LANES", "WAITING", "Span", "Timeline", "span_on", "union_length"]

# Drawn in this order; other lanes follow alphabetically.
LANES = ("step", "trainer", "waiting", "sync", "engine", "env", "sandbox", "reward")
WAITING = "waiting"  # the lane of the trainer's waits (not counted in its busy fraction)
TRACE_FILE = "trace.json"
PNG_FILE = "timeline.png"
COLORS = {
    "step": "#bbbbbb",
    "trainer": "#4c72b0",
    "waiting": "#e5e5e5",
    "sync": "#dd8452",
    "engine": "#55a868",
    "env": "#c44e52",
    "sandbox": "#937860",
    "reward": "#da8bc3",
}


@dataclass(frozen=True)
class Span:
    """``[start, end)`` seconds since the timeline's origin, on ``lane``."""

    lane: str
    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """The span's length."""
        return self.end - self.start


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (overlaps counted once)."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _lane_order(lane: str) -> tuple[str, int]:
    """``engine 2`` before ``engine 10``."""
    stem, _, number = lane.rpartition(" ")
    return (stem, int(number)) if number.isdigit() else (lane, -1)


class Timeline:
    """Spans of every role of one run (see the module docstring). Not thread-safe: record from the event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_spans: int = 500_000) -> None:
        self._clock = clock
        self.origin = clock()
        self.spans: deque[Span] = deque(maxlen=max_spans)

    def now(self) -> float:
        """Seconds since the origin."""
        return self._clock() - self.origin

    def record(self, lane: str, name: str, start: float, end: float) -> None:
        """Add a span measured elsewhere (``start``/``end`` from :meth:`now`)."""
        self.spans.append(Span(lane, name, start, end))

    @contextmanager
    def span(self, lane: str, name: str) -> Iterator[None]:
        """Record the ``with`` block as a span (also when it raises)."""
        start = self.now()
        try:
            yield
        finally:
            self.record(lane, name, start, self.now())

    def busy_fraction(self, lane: str, start: float, end: float) -> float:
        """The share of ``[start, end)`` covered by ``lane``'s spans (0 for an empty window)."""
        if end <= start:
            return 0.0
        clipped = [(max(s.start, start), min(s.end, end)) for s in self.spans if s.lane == lane]
        return union_length((a, b) for a, b in clipped if b > a) / (end - start)

    def lanes(self) -> list[str]:
        """Lanes that have spans: the known ones in :data:`LANES` order, then the rest alphabetically."""
        present = {s.lane for s in self.spans}
        return [lane for lane in LANES if lane in present] + sorted(present - set(LANES), key=_lane_order)

    # --- files ---

    def chrome_trace(self) -> dict[str, Any]:
        """The spans as Chrome trace events (complete events, microseconds), one thread per lane."""
        tids = {lane: index + 1 for index, lane in enumerate(self.lanes())}
        events: list[dict[str, Any]] = [
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": lane}}
            for lane, tid in tids.items()
        ]
        events += [
            {
                "name": s.name,
                "cat": s.lane,
                "ph": "X",
                "ts": round(s.start * 1e6, 1),
                "dur": round(s.seconds * 1e6, 1),
                "pid": 1,
                "tid": tids[s.lane],
            }
            for s in self.spans
        ]
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_trace(self, path: str | Path) -> Path:
        """Write :meth:`chrome_trace` as JSON to ``path``."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.chrome_trace()))
        return out

    def write_png(self, path: str | Path) -> Path:
        """Draw one row per lane over the training steps, their busy fractions in the title (needs matplotlib)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        lanes = self.lanes()
        # The training steps when there are some (start-up and a final evaluation are in the trace), else everything.
        window = [s for s in self.spans if s.lane == "step"] or list(self.spans)
        start = min((s.start for s in window), default=0.0)
        end = max((s.end for s in window), default=1.0)
        figure = Figure(figsize=(12, 1 + 0.6 * max(len(lanes), 1)), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.add_subplot(1, 1, 1)
        for row, lane in enumerate(lanes):
            bars = [(s.start, s.seconds) for s in self.spans if s.lane == lane]
            width = 1.0 if lane == "step" else 0.0  # a white edge keeps consecutive steps apart
            color = COLORS.get(lane, "#8172b3")
            axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=width)
        axes.set_yticks(range(len(lanes)), lanes)
        axes.invert_yaxis()
        axes.set_xlabel("seconds since the run started")
        if end > start:
            axes.set_xlim(start - 0.01 * (end - start), end + 0.01 * (end - start))
        busy = ", ".join(f"{lane} {self.busy_fraction(lane, start, end):.0%}" for lane in lanes)
        axes.set_title(f"busy: {busy}" if lanes else "no spans recorded")
        axes.grid(axis="x", alpha=0.3)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out, dpi=100)
        return out


def span_on(timeline: Timeline | None, lane: str, name: str) -> AbstractContextManager[None]:
    """:meth:`Timeline.span` when there is a timeline; a context that records nothing otherwise."""
    return timeline.span(lane, name) if timeline is not None else nullcontext()


@contextmanager
def timed(timings: dict[str, float], key: str, timeline: Timeline | None, lane: str, name: str) -> Iterator[None]:
    """Add the block's wall seconds to ``timings[key]`` and record it as the span ``name`` on ``lane``.

    The one way the loop times its phases: a phase that runs twice in a step (the colocated hand-over) adds up.
    """
    start = time.monotonic()
    with span_on(timeline, lane, name):
        yield
    timings[key] = timings.get(key, 0.0) + time.monotonic() - start
