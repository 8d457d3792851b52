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
    choose_panels,
    format_console_line,
    plot_metrics,
    read_metrics,
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
                "policy/grad_norm": torch.tensor(2.0),
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
    assert metrics == {"reward/mean": pytest.approx(0.1), "policy/loss": 1.0, "policy/grad_norm": 2.0}
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
    assert "step 2/3  reward 0.2  loss 0.5  grad_norm 2\n" in output


def test_console_without_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich.console", None)
    stream = io.StringIO()
    console = ConsoleBackend(total_steps=None, stream=stream)
    console.log({"b": 0.123456, "a": 1.0}, 7)  # a custom loop's names: shown as they are, in name order
    console.close()
    assert stream.getvalue() == "step 7  a 1  b 0.123\n"


GENERATOR_STATS = ("num_tokens", "num_prompt_tokens", "num_generated_tokens", "num_turns", "llm_time_s")


def _trainer_record(step: int) -> dict[str, float]:
    """A training step's metrics as the trainer logs them (the names of a real search-example run)."""
    record = {f"generate/{name}/{stat}": 40.0 + step for name in GENERATOR_STATS for stat in ("min", "max", "mean")}
    record["generate/num_generated_tokens/mean"] = 20.0 + step  # retrieved documents make responses longer
    record.update({f"generate/stop_reason/{reason}": 0.0 for reason in ("stop", "length", "context", "timeout")})
    record.update(
        {
            "generate/num_trajectories": 32.0,
            "environment/search/avg_reward": 0.25,
            "rollout/stop_stop": 1.0,
            "reward/mean": 0.1 * step,
            "reward/max": 1.0,
            "reward/min": 0.0,
            "policy/advantage_abs_mean": 0.61,
            "policy/approx_kl": 0.0,
            "policy/ratio_max": 1.0,
            "policy/clip_frac": 0.0,
            "policy/pg_loss": -0.0131 * step,
            "policy/loss": -0.0131 * step,
            "policy/kl": 0.002 * step,
            "policy/entropy": 2.0 - 0.1 * step,
            "policy/grad_norm": 0.4 + step,
            "policy/lr": 1e-05,
            "policy/optimizer_steps": 1.0,
            "policy/rollout_logprob_gap": 1.27e-06 * step,
            "timing/generate_s": 27.2 + step,
            "timing/prepare_s": 0.0037,
            "timing/update_s": 22.6,
            "timing/weight_sync_s": 0.16 + 0.01 * step,
        }
    )
    record["timing/step_s"] = sum(v for k, v in record.items() if k.startswith("timing/"))
    return record


def test_console_prints_one_bounded_line_per_step() -> None:
    stream = io.StringIO()
    with Tracker.create(["console"], "unused", total_steps=200, console_stream=stream) as tracker:
        tracker.log({"eval/all/reward_mean": 0.205, "eval/all/pass_rate": 0.205, "eval/demo/reward_mean": 0.2}, 0)
        for step in (1, 2, 199):
            tracker.log(_trainer_record(step), step)
    lines = [line for line in stream.getvalue().splitlines() if not line.startswith("training")]  # the bar
    assert [line.split()[1] for line in lines] == ["0/200", "1/200", "2/200", "199/200"]  # nothing wrapped
    assert max(len(line) for line in lines) <= 160
    assert lines[0] == "step 0/200  eval 0.205  pass 0.205"
    assert lines[2] == (
        "step 2/200  reward 0.2  loss -0.0262  kl 0.004  entropy 1.8  grad_norm 2.4  lp_gap 2.54e-06  resp_len 42"
        "  time 52s (gen 29.2 prep 0.0037 upd 22.6 sync 0.18)"
    )


def test_console_line_leaves_out_what_does_not_fit() -> None:
    record = {**_trainer_record(3), "critic/value_loss": -1.23456e-05, "policy/grad_norm": -1.23456e-05}
    wide = format_console_line(record, 123456, 1234567)
    assert len(wide) <= 160
    assert wide.startswith("step 123456/1234567  reward 0.3  loss -0.0393  vf_loss -1.23e-05  kl 0.006")
    assert format_console_line(record, 3, 10, width=40) == "step 3/10  reward 0.3  loss -0.0393"
    without_kl_loss = {k: v for k, v in record.items() if k != "policy/kl"}
    assert "  approx_kl 0  " in format_console_line(without_kl_loss, 3)


def test_read_metrics_merges_the_lines_of_a_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "r": 0.0},
        {"step": 2, "r": 1.0},
        {"step": 2, "eval/all/reward_mean": 0.5},  # an evaluation after the step's training line
        {"step": 2, "r": 5.0},  # the step again after a resume
        {"step": 3, "r": 2.0, "s": "x"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert read_metrics(path) == {1: {"r": 0.0}, 2: {"r": 5.0, "eval/all/reward_mean": 0.5}, 3: {"r": 2.0}}
    path.write_text('{"r": 1}\n')
    with pytest.raises(TrackingError, match="line 1 is not a metrics record"):
        read_metrics(path)


def test_panels_are_the_curves_people_read() -> None:
    by_step = {step: _trainer_record(step) for step in range(1, 6)}
    by_step[1].update({"critic/value_loss": 0.3, "critic/grad_norm": 1.0})
    by_step[5].update({"critic/value_loss": 0.1, "critic/grad_norm": 0.5})
    for step in (1, 5):
        by_step[step].update({"eval/all/reward_mean": 0.1 * step, "eval/all/pass_rate": 0.1 * step})
    panels = {panel.title: panel.metrics for panel in choose_panels(by_step)}
    assert panels == {
        "reward (train mean)": ("reward/mean",),
        "eval reward": ("eval/all/reward_mean",),
        "policy loss": ("policy/loss",),
        "value loss": ("critic/value_loss",),
        "KL": ("policy/kl",),  # approx_kl is exactly 0 on every step: a constant says nothing
        "entropy": ("policy/entropy",),
        "grad norm": ("policy/grad_norm", "critic/grad_norm"),
        "rollout log-prob gap": ("policy/rollout_logprob_gap",),
        "response length (tokens)": ("generate/num_tokens/mean", "generate/num_generated_tokens/mean"),
        "step time (s)": ("timing/generate_s", "timing/prepare_s", "timing/update_s", "timing/weight_sync_s"),
    }
    plotted = {key for metrics in panels.values() for key in metrics}
    assert not plotted & {"reward/max", "reward/min", "policy/lr", "policy/optimizer_steps", "rollout/stop_stop"}


def test_panels_keep_a_flat_reward_and_drop_what_was_not_logged() -> None:
    by_step = {step: {**_trainer_record(step), "reward/mean": 0.0} for step in (1, 2)}
    for record in by_step.values():
        for key in ("policy/kl", "policy/entropy", "timing/generate_s", "timing/update_s"):
            del record[key]
        record["generate/num_generated_tokens/mean"] = record["generate/num_tokens/mean"]  # single-turn
    panels = {panel.title: panel.metrics for panel in choose_panels(by_step)}
    assert panels["reward (train mean)"] == ("reward/mean",)  # no learning is what a reader looks for
    assert panels["response length (tokens)"] == ("generate/num_tokens/mean",)  # one curve, not two on top
    assert panels["step time (s)"] == ("timing/prepare_s", "timing/weight_sync_s")  # flat parts of the total too
    assert not {"eval reward", "KL", "entropy", "value loss"} & panels.keys()


def test_panels_of_a_custom_loop_are_its_changing_metrics() -> None:
    by_step = {1: {"b": 1.0, "a": 0.0, "flat": 1.0}, 2: {"b": 2.0, "a": 1.0, "flat": 1.0}}
    assert [(panel.title, panel.metrics) for panel in choose_panels(by_step)] == [("a", ("a",)), ("b", ("b",))]


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
    tracker.log(_trainer_record(4), 4)
    tracker.log({"eval/all/reward_mean": 0.5}, 4)  # same step: the plot still has the step's training curves
    tracker.log(_trainer_record(5), 5)
    png = tracker.finish()
    assert png == tmp_path / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    custom = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "reward.png", keys=["reward/mean"])
    assert custom.stat().st_size > 0
    with pytest.raises(TrackingError, match="none of the requested metrics"):
        plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "x.png", keys=["nope"])
