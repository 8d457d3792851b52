from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from skyrl_train.tracking import (
    ConsoleBackend,
    Tracker,
    TrackingError,
    plot_metrics,
    read_metrics,
    select_plot_keys,
)


class Recorder:
    """A backend that keeps what it was given."""

    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.samples: list[tuple[int, list[Mapping[str, Any]]]] = []
        self.closed = 0

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        self.samples.append((step, list(samples)))

    def close(self) -> None:
        self.closed += 1


def _run(tracker: Tracker, steps: int = 3) -> None:
    for step in range(1, steps + 1):
        tracker.log(
            {
                "reward/mean": 0.1 * step,
                "policy/loss": np.float32(1.0 / step),
                "grad_norm": torch.tensor(2.0),
                "note": "not a number",
            },
            step,
        )
        tracker.log_samples([{"prompt": "p", "response": f"r{i}", "reward": 1.0} for i in range(6)], step)


def test_fan_out_converts_scalars_and_limits_samples() -> None:
    first, second = Recorder(), Recorder()
    tracker = Tracker([first, second], samples_per_step=2)
    _run(tracker, steps=2)
    tracker.finish()
    tracker.finish()  # idempotent
    assert first.metrics == second.metrics
    step, metrics = first.metrics[0]
    assert step == 1
    assert metrics == {"reward/mean": pytest.approx(0.1), "policy/loss": 1.0, "grad_norm": 2.0}
    assert all(type(v) is float for v in metrics.values())
    assert [len(samples) for _, samples in first.samples] == [2, 2]
    assert first.closed == second.closed == 1


def test_jsonl_and_console(tmp_path: Path) -> None:
    stream = io.StringIO()
    with Tracker.create(["console", "jsonl"], tmp_path, total_steps=3, console_stream=stream) as tracker:
        _run(tracker)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[2])["step"] == 3
    assert read_metrics(tmp_path / "metrics.jsonl")[2]["reward/mean"] == pytest.approx(0.2)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 4  # samples_per_step defaults to 4
    assert samples[0] == {"step": 1, "prompt": "p", "response": "r0", "reward": 1.0}
    output = stream.getvalue()
    assert "step 2/3 | reward/mean=0.2 policy/loss=0.5 grad_norm=2" in output


def test_console_without_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich.console", None)
    stream = io.StringIO()
    console = ConsoleBackend(total_steps=None, keys=["b", "a"], stream=stream)
    console.log({"a": 1.0, "b": 0.123456}, 7)
    console.close()
    assert stream.getvalue() == "step 7 | b=0.1235 a=1\n"


def test_read_metrics_keeps_last_line_of_a_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "r": 0.0}, {"step": 2, "r": 1.0}, {"step": 2, "r": 5.0}, {"step": 3, "r": 2.0, "s": "x"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert read_metrics(path) == {1: {"r": 0.0}, 2: {"r": 5.0}, 3: {"r": 2.0}}
    path.write_text('{"r": 1}\n')
    with pytest.raises(TrackingError, match="line 1 is not a metrics record"):
        read_metrics(path)


def test_select_plot_keys_puts_reward_first() -> None:
    keys = ["zeta", "policy/loss", "reward/mean", "timing/step", "policy/entropy", "alpha"]
    assert select_plot_keys(keys, limit=4) == ["reward/mean", "policy/loss", "policy/entropy", "timing/step"]
    assert select_plot_keys(["b", "a"]) == ["a", "b"]


def test_unknown_logger(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="unknown logger 'mlflow'; available: console, jsonl, tensorboard, wandb"):
        Tracker.create(["jsonl", "mlflow"], tmp_path)


def test_missing_optional_packages_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(TrackingError, match="the tensorboard logger needs the `tensorboard` package"):
        Tracker.create(["jsonl", "tensorboard"], tmp_path)
    with pytest.raises(TrackingError, match="the wandb logger needs the `wandb` package: pip install wandb"):
        Tracker.create(["wandb"], tmp_path)


def test_missing_matplotlib_does_not_fail_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    tracker = Tracker.create(["jsonl"], tmp_path)
    _run(tracker)
    with caplog.at_level(logging.WARNING, logger="skyrl_train.tracking"):
        assert tracker.finish() is None
    assert "plotting metrics needs the `matplotlib` package" in caplog.text
    with pytest.raises(TrackingError, match="pip install matplotlib"):
        plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plot.png")


def test_tensorboard_event_files(tmp_path: Path) -> None:
    tracker = Tracker.create(["tensorboard"], tmp_path, run_name="exp")
    _run(tracker)
    tracker.finish()
    events = list((tmp_path / "tensorboard" / "exp").glob("events.out.tfevents.*"))
    assert len(events) == 1
    assert events[0].stat().st_size > 0


def test_png_of_key_curves(tmp_path: Path) -> None:
    tracker = Tracker.create(["jsonl"], tmp_path)
    _run(tracker)
    png = tracker.finish()
    assert png == tmp_path / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    custom = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "reward.png", keys=["reward/mean"])
    assert custom.stat().st_size > 0
    with pytest.raises(TrackingError, match="none of the requested metrics"):
        plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "x.png", keys=["nope"])
