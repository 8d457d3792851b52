"""Spans, busy fractions, the Chrome trace and the picture; and what a training step records."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from skyrl_train.timeline import Timeline, union_length

from .test_trainer import _prompts, _trainer


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_overlapping_spans_count_once() -> None:
    assert union_length([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4)
    assert union_length([(0, 10), (2, 3)]) == pytest.approx(10)
    assert union_length([]) == 0


def test_a_busy_fraction_is_the_union_of_the_lanes_spans_inside_the_window() -> None:
    clock = FakeClock()
    timeline = Timeline(clock)
    timeline.record("engine", "generate", 0.0, 2.0)
    timeline.record("engine", "generate", 1.0, 3.0)  # overlaps the first: two requests in flight
    timeline.record("engine", "generate", 8.0, 12.0)  # half inside the window
    timeline.record("trainer", "update", 3.0, 8.0)
    assert timeline.busy_fraction("engine", 0.0, 10.0) == pytest.approx(0.5)  # [0,3) and [8,10)
    assert timeline.busy_fraction("trainer", 0.0, 10.0) == pytest.approx(0.5)
    assert timeline.busy_fraction("env", 0.0, 10.0) == 0
    assert timeline.busy_fraction("engine", 5.0, 5.0) == 0
    clock.t += 1.5
    with timeline.span("sync", "weight sync"):
        clock.t += 0.25
    assert timeline.spans[-1].start == pytest.approx(1.5)
    assert timeline.spans[-1].seconds == pytest.approx(0.25)
    assert timeline.lanes() == ["trainer", "sync", "engine"]


def test_the_trace_is_chrome_trace_events_one_thread_per_lane(tmp_path: Path) -> None:
    timeline = Timeline(FakeClock())
    timeline.record("engine", "generate", 0.5, 1.25)
    timeline.record("custom", "work", 0.0, 1.0)
    trace = json.loads(timeline.write_trace(tmp_path / "trace.json").read_text())
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert sorted(threads.values()) == ["custom", "engine"]
    (event,) = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "generate"]
    assert (event["ts"], event["dur"]) == (500_000.0, 750_000.0)  # microseconds
    assert threads[event["tid"]] == "engine"


def test_the_picture_is_a_png(tmp_path: Path) -> None:
    timeline = Timeline(FakeClock())
    timeline.record("trainer", "update", 0.0, 1.0)
    out = timeline.write_png(tmp_path / "timeline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Timeline(FakeClock()).write_png(tmp_path / "empty.png").exists()  # a run without spans still draws


def test_only_the_latest_spans_are_kept() -> None:
    timeline = Timeline(FakeClock(), max_spans=3)
    for index in range(5):
        timeline.record("env", "step", index, index + 0.5)
    assert [s.start for s in timeline.spans] == [2, 3, 4]


def test_a_step_logs_busy_fractions_that_agree_with_its_spans(tiny_model_dir: Path) -> None:
    trainer, _ = _trainer(tiny_model_dir, flat=set())
    trainer.timeline = timeline = Timeline()
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    names = {(s.lane, s.name) for s in timeline.spans}
    assert {("waiting", "rollouts"), ("trainer", "prepare"), ("trainer", "update"), ("sync", "weight sync")} <= names
    (step,) = [s for s in timeline.spans if s.name == "step"]
    assert metrics["timing/trainer_busy_fraction"] == pytest.approx(
        timeline.busy_fraction("trainer", step.start, step.end), abs=1e-3
    )
    assert 0 < metrics["timing/trainer_busy_fraction"] <= 1
    assert metrics["timing/engine_busy_fraction"] == 0  # the scripted generator never calls the engine
