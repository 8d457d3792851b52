"""Experiment tracking: a :class:`Tracker` fans each step's metrics out to the configured backends.

Backends (``trainer.logger``):

=================  ===========================================================================================
``console``        a progress bar and one line per step, at most 160 characters: reward, loss, KL, grad norm,
                   rollout log-prob gap, response length and the step time split into generate / prepare /
                   update / weight sync (``rich`` when installed, else plain); an evaluation adds its own line
``jsonl``          ``{run_dir}/metrics.jsonl`` (one ``{"step", "time", **metrics}`` line per record) and
                   ``{run_dir}/samples.jsonl`` (a few decoded trajectories per step)
``tensorboard``    event files under ``{run_dir}/tensorboard`` (needs the ``tensorboard`` package)
``wandb``          a Weights & Biases run, resumed across restarts of the same run dir (needs ``wandb``)
=================  ===========================================================================================

At :meth:`Tracker.finish` the curves people read are drawn from ``metrics.jsonl`` into ``{run_dir}/metrics.png``
(needs ``matplotlib``): one panel each of ``PLOT_PANELS`` (train and eval reward, policy and value loss, KL,
entropy, grad norm, rollout log-prob gap, response length, the stacked step-time breakdown) whose metrics were
logged; a metric that never changed over the run (a ``reward/max`` stuck at 1, an ``approx_kl`` that is exactly 0)
is left out, except on the reward panels, where a flat line is the news. ``metrics.jsonl`` holds one line per
:meth:`Tracker.log` call, so an evaluation step has two lines (training and ``eval/…``) and a resumed run may repeat
steps logged after its checkpoint; readers merge the lines of a step, later values winning.

Errors::

    RuntimeError
     └── TrackingError   a backend's package is missing or the metrics file is unreadable (says what to install)
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import numbers
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

__all__ = [
    "LOGGERS",
    "PLOT_PANELS",
    "ConsoleBackend",
    "JsonlBackend",
    "PlotPanel",
    "TensorBoardBackend",
    "Tracker",
    "TrackingBackend",
    "TrackingError",
    "WandbBackend",
    "choose_panels",
    "format_console_line",
    "plot_metrics",
    "read_metrics",
]

logger = logging.getLogger(__name__)

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "metrics.png"
CONSOLE_WIDTH = 160
# The console line's columns in order: each is (label, metric) alternatives, the first one logged wins. KL is the
# penalty against the reference when there is one, else the old→new policy estimate.
CONSOLE_COLUMNS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("reward", "reward/mean"),),
    (("eval", "eval/all/reward_mean"),),
    (("pass", "eval/all/pass_rate"),),
    (("loss", "policy/loss"),),
    (("vf_loss", "critic/value_loss"),),
    (("kl", "policy/kl"), ("kl", "reward/kl"), ("approx_kl", "policy/approx_kl")),
    (("entropy", "policy/entropy"),),
    (("grad_norm", "policy/grad_norm"),),
    (("lp_gap", "policy/rollout_logprob_gap"),),
    (("resp_len", "generate/num_tokens/mean"),),
)
# The parts of ``timing/step_s`` shown after it, with their short labels.
TIMING_PARTS = (
    ("gen", "timing/generate_s"),
    ("prep", "timing/prepare_s"),
    ("upd", "timing/update_s"),
    ("sync", "timing/weight_sync_s"),
)


class TrackingError(RuntimeError):
    """A tracking backend cannot run; the message says what to install or change."""


class TrackingBackend(Protocol):
    """One destination of metrics. ``metrics`` values are finite or non-finite floats."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record the metrics of ``step``."""
        ...

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Record a few decoded trajectories of ``step`` (backends without a place for them ignore them)."""
        ...

    def close(self) -> None:
        """Flush and release files or connections; idempotent."""
        ...


def _optional_import(module: str, purpose: str, install: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TrackingError(f"{purpose} needs the `{install}` package: pip install {install}") from exc


# -------------------------------------------------------------------------------------------------- console


class ConsoleBackend:
    """A progress bar over ``total_steps`` and one line per logged record (see :func:`format_console_line`).

    Args:
        total_steps: the bar's length; ``None`` shows a counter without a total.
        stream: where to write (default: standard output at the time of writing).
        width: the longest line written; columns that do not fit are left out (``metrics.jsonl`` has them all).
    """

    def __init__(
        self, total_steps: int | None = None, stream: IO[str] | None = None, width: int = CONSOLE_WIDTH
    ) -> None:
        self.total_steps = total_steps
        self.width = width
        self._stream = stream
        self._progress: Any = None
        self._task: Any = None
        self._closed = False

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Advance the bar to ``step`` and print the step's line."""
        line = format_console_line(metrics, step, self.total_steps, self.width)
        progress = self._ensure_progress()
        if progress is None:
            print(line, file=self._stream, flush=True)
            return
        # soft_wrap: never break the line at the console's width (80 columns when writing to a file or pipe).
        progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        progress.update(self._task, completed=step)
        progress.refresh()

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Samples are not printed: they would drown the metrics lines."""

    def _ensure_progress(self) -> Any:
        if self._progress is not None or self._closed:
            return self._progress
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            return None  # plain lines without a bar
        self._progress = Progress(
            TextColumn("training"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=self._stream),
            auto_refresh=False,  # refreshed on every logged step; no background thread
        )
        self._task = self._progress.add_task("train", total=self.total_steps)
        self._progress.start()
        return self._progress

    def close(self) -> None:
        """Stop the progress bar."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._closed = True


def format_console_line(
    metrics: Mapping[str, float], step: int, total_steps: int | None = None, width: int = CONSOLE_WIDTH
) -> str:
    """One line of at most ``width`` characters for a record of metrics.

    ``step 3/10  reward 0.25  loss -0.0131  approx_kl 0.0002  grad_norm 0.41  lp_gap 0.003  resp_len 42.5
    time 2.51s (gen 1.2 prep 0.1 upd 1.1 sync 0.06)``: the ``CONSOLE_COLUMNS`` that were logged, then the step
    time and its parts. A record with none of them (a custom loop's) shows its own metrics in name order. Columns
    that would pass ``width`` are left out from the end.
    """
    total = f"/{total_steps}" if total_steps else ""
    fields = [f"{label} {_format_number(metrics[key])}" for label, key in _console_columns(metrics)]
    if "timing/step_s" in metrics:
        parts = " ".join(f"{label} {_format_number(metrics[key])}" for label, key in TIMING_PARTS if key in metrics)
        fields.append(f"time {_format_number(metrics['timing/step_s'])}s" + (f" ({parts})" if parts else ""))
    if not fields:
        fields = [f"{key} {_format_number(value)}" for key, value in sorted(metrics.items())]
    line = f"step {step}{total}"
    for field_text in fields:
        if len(line) + 2 + len(field_text) > width:
            break
        line += "  " + field_text
    return line


def _console_columns(metrics: Mapping[str, float]) -> list[tuple[str, str]]:
    """``(label, metric)`` of each ``CONSOLE_COLUMNS`` entry that has a logged alternative."""
    chosen = []
    for alternatives in CONSOLE_COLUMNS:
        present = [(label, key) for label, key in alternatives if key in metrics]
        if present:
            chosen.append(present[0])
    return chosen


def _format_number(value: float) -> str:
    return f"{value:.3g}"


# ---------------------------------------------------------------------------------------------------- jsonl


class JsonlBackend:
    """Appends metrics to ``{run_dir}/metrics.jsonl`` and samples to ``{run_dir}/samples.jsonl``.

    Every line is flushed as written, so the files are readable while the run goes on and survive a crash.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.samples_path = self.run_dir / SAMPLES_FILE
        self._metrics = self.metrics_path.open("a")
        self._samples: IO[str] | None = None

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Append one line for ``step``."""
        self._metrics.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self._metrics.flush()

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Append one line per sample, ``{"step": step, **sample}``."""
        if self._samples is None:
            self._samples = self.samples_path.open("a")
        for sample in samples:
            self._samples.write(json.dumps({"step": step, **sample}, default=str) + "\n")
        self._samples.flush()

    def close(self) -> None:
        """Close both files."""
        self._metrics.close()
        if self._samples is not None:
            self._samples.close()


# ---------------------------------------------------------------------------------------------- tensorboard


class TensorBoardBackend:
    """Scalars and sample text in TensorBoard event files under ``log_dir``.

    Raises:
        TrackingError: the ``tensorboard`` package is not installed.
    """

    def __init__(self, log_dir: str | Path) -> None:
        module = _optional_import("torch.utils.tensorboard", "the tensorboard logger", "tensorboard")
        self.log_dir = Path(log_dir)
        self._writer: Any = module.SummaryWriter(log_dir=str(self.log_dir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One scalar per metric at ``step``."""
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """The samples as one JSON text entry (TensorBoard's text tab renders markdown)."""
        body = "\n\n".join(f"```\n{json.dumps(dict(s), indent=2, default=str)}\n```" for s in samples)
        self._writer.add_text("samples", body, global_step=step)

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


# ---------------------------------------------------------------------------------------------------- wandb


class WandbBackend:
    """A Weights & Biases run; its id is kept in ``{run_dir}/wandb_run_id.txt`` so a resumed run continues it.

    Raises:
        TrackingError: the ``wandb`` package is not installed.
    """

    def __init__(
        self, run_dir: str | Path, project_name: str, run_name: str | None, config: Mapping[str, Any] | None
    ) -> None:
        self._wandb = _optional_import("wandb", "the wandb logger", "wandb")
        id_file = Path(run_dir) / "wandb_run_id.txt"
        run_id = id_file.read_text().strip() if id_file.is_file() else self._wandb.util.generate_id()
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id)
        self._run = self._wandb.init(
            project=project_name,
            name=run_name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=dict(config or {}),
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the metrics at ``step``."""
        self._run.log(dict(metrics), step=step)

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """The samples as a table (columns: the union of the samples' keys)."""
        columns = sorted({key for sample in samples for key in sample})
        rows = [[_table_cell(sample.get(column)) for column in columns] for sample in samples]
        self._run.log({"samples": self._wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        """Finish the run."""
        self._run.finish()


def _table_cell(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else json.dumps(value, default=str)


# -------------------------------------------------------------------------------------------------- tracker


class Tracker:
    """Sends every step's metrics (and a few samples) to each backend; draws the curves at the end.

    Args:
        backends: where metrics go.
        samples_per_step: at most this many samples of a step are logged.
        plot_source: the metrics JSONL to plot at :meth:`finish` (``None``: no plot).
        plot_path: where the PNG goes.
    """

    def __init__(
        self,
        backends: Sequence[TrackingBackend],
        *,
        samples_per_step: int = 4,
        plot_source: Path | None = None,
        plot_path: Path | None = None,
    ) -> None:
        self.backends = list(backends)
        self.samples_per_step = samples_per_step
        self.plot_source = plot_source
        self.plot_path = plot_path
        self._finished = False

    @classmethod
    def create(
        cls,
        loggers: Sequence[str],
        run_dir: str | Path,
        *,
        project_name: str = "skyrl",
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        samples_per_step: int = 4,
        console_stream: IO[str] | None = None,
    ) -> Tracker:
        """A tracker with the named backends (``LOGGERS``), writing under ``run_dir``.

        Raises:
            TrackingError: an unknown logger name, or a backend whose package is missing.
        """
        run_dir = Path(run_dir)
        unknown = [name for name in loggers if name not in LOGGERS]
        if unknown:
            raise TrackingError(f"unknown logger {unknown[0]!r}; available: {', '.join(LOGGERS)}")
        backends: list[TrackingBackend] = []
        try:
            for name in dict.fromkeys(loggers):  # keeps order, drops repeats
                if name == "console":
                    backends.append(ConsoleBackend(total_steps, console_stream))
                elif name == "jsonl":
                    backends.append(JsonlBackend(run_dir))
                elif name == "tensorboard":
                    backends.append(TensorBoardBackend(run_dir / "tensorboard" / (run_name or run_dir.name)))
                else:
                    backends.append(WandbBackend(run_dir, project_name, run_name, config))
        except BaseException:
            for backend in backends:  # do not leak the files of the backends already opened
                backend.close()
            raise
        return cls(
            backends,
            samples_per_step=samples_per_step,
            plot_source=run_dir / METRICS_FILE if "jsonl" in loggers else None,
            plot_path=run_dir / PLOT_FILE,
        )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log the numeric entries of ``metrics`` (numbers, numpy/torch scalars) at ``step``; others are skipped."""
        scalars = _scalars(metrics)
        for backend in self.backends:
            backend.log(scalars, step)

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Log the first ``samples_per_step`` samples (e.g. ``{"prompt", "response", "reward", "stop_reason"}``)."""
        if self.samples_per_step <= 0 or not samples:
            return
        chosen = list(samples[: self.samples_per_step])
        for backend in self.backends:
            backend.log_samples(chosen, step)

    def finish(self) -> Path | None:
        """Close every backend and draw the PNG of key curves; return its path (``None`` if not drawn).

        A missing plotting package or a backend that fails to close is logged, never raised: the run is over.
        """
        if self._finished:
            return None
        self._finished = True
        for backend in self.backends:
            try:
                backend.close()
            except Exception:  # closing is best effort; the metrics are already on disk
                logger.exception("closing tracking backend %s failed", type(backend).__name__)
        if self.plot_source is None or self.plot_path is None or not self.plot_source.is_file():
            return None
        try:
            return plot_metrics(self.plot_source, self.plot_path)
        except TrackingError as exc:
            logger.warning("no metrics plot: %s", exc)
            return None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.finish()


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    result = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()  # numpy / torch scalars
        if isinstance(value, numbers.Real):
            result[key] = float(value)
    return result


# ----------------------------------------------------------------------------------------------------- plot


def read_metrics(path: str | Path) -> dict[int, dict[str, float]]:
    """``step → metrics`` from a metrics JSONL; the lines of one step are merged, a later value winning.

    A step has several lines when it was evaluated (the training and the ``eval/…`` records) or logged again after
    a resume.

    Raises:
        TrackingError: a line is not valid JSON or has no ``step``.
    """
    by_step: dict[int, dict[str, float]] = {}
    with Path(path).open() as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step = int(record.pop("step"))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise TrackingError(f"{path}: line {number} is not a metrics record ({exc})") from exc
            record.pop("time", None)
            values = {k: float(v) for k, v in record.items() if isinstance(v, numbers.Real)}
            by_step.setdefault(step, {}).update(values)
    return dict(sorted(by_step.items()))


@dataclass(frozen=True)
class PlotPanel:
    """One panel of ``metrics.png``: the metrics it draws, in legend order."""

    title: str
    metrics: tuple[str, ...]
    stacked: bool = False  # the metrics are parts of one total: drawn as stacked areas
    keep_flat: bool = False  # drawn even when the metric never changed (a flat reward is what a reader looks for)


PLOT_PANELS = (
    PlotPanel("reward (train mean)", ("reward/mean",), keep_flat=True),
    PlotPanel("eval reward", ("eval/all/reward_mean",), keep_flat=True),
    PlotPanel("policy loss", ("policy/loss",)),
    PlotPanel("value loss", ("critic/value_loss",)),
    PlotPanel("KL", ("policy/kl", "reward/kl", "policy/approx_kl")),
    PlotPanel("entropy", ("policy/entropy",)),
    PlotPanel("grad norm", ("policy/grad_norm", "critic/grad_norm")),
    PlotPanel("rollout log-prob gap", ("policy/rollout_logprob_gap",)),
    PlotPanel("response length (tokens)", ("generate/num_tokens/mean", "generate/num_generated_tokens/mean")),
    PlotPanel("step time (s)", tuple(key for _, key in TIMING_PARTS), stacked=True),
)
FALLBACK_PANELS = 6  # panels of a run that logged none of PLOT_PANELS' metrics (a custom loop)


def choose_panels(by_step: Mapping[int, Mapping[str, float]]) -> list[PlotPanel]:
    """The ``PLOT_PANELS`` worth drawing for ``by_step`` (as :func:`read_metrics` returns), narrowed to their metrics.

    A panel keeps its metrics that were logged, changed over the run (unless ``keep_flat``) and are not the same
    curve as one it already keeps; a stacked panel keeps every logged part while any of them changed (each part is a
    share of the total). A run with none of these metrics gets a panel for each of its first ``FALLBACK_PANELS``
    changing metrics.
    """
    series = _series(by_step)
    panels = []
    for panel in PLOT_PANELS:
        kept = _panel_metrics(panel, series)
        if kept:
            panels.append(replace(panel, metrics=kept))
    if panels:
        return panels
    changing = [key for key in sorted(series) if not _flat(series[key])]
    return [PlotPanel(key, (key,)) for key in changing[:FALLBACK_PANELS]]


def _panel_metrics(panel: PlotPanel, series: Mapping[str, list[tuple[int, float]]]) -> tuple[str, ...]:
    """The metrics of ``panel`` worth drawing (see :func:`choose_panels`)."""
    logged = [key for key in panel.metrics if key in series]
    if panel.stacked:
        return tuple(logged) if not all(_flat(series[key]) for key in logged) else ()
    kept: list[str] = []
    for key in logged:
        if not panel.keep_flat and _flat(series[key]):
            continue
        if any(series[key] == series[other] for other in kept):
            continue  # the same curve under another name (generated tokens = response tokens without env turns)
        kept.append(key)
    return tuple(kept)


def _series(by_step: Mapping[int, Mapping[str, float]]) -> dict[str, list[tuple[int, float]]]:
    """``metric → [(step, value), ...]`` in step order."""
    series: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in sorted(by_step.items()):
        for key, value in metrics.items():
            series.setdefault(key, []).append((step, value))
    return series


def _flat(points: Sequence[tuple[int, float]]) -> bool:
    """Whether a metric logged more than once never changed."""
    return len(points) > 1 and all(value == points[0][1] for _, value in points)


def plot_metrics(
    metrics_path: str | Path, out_path: str | Path, keys: Sequence[str] | None = None, columns: int = 2
) -> Path:
    """Draw the :func:`choose_panels` panels (or one per metric of ``keys``) against the step; return ``out_path``.

    Uses matplotlib's Agg canvas directly, so no display and no global pyplot state are involved.

    Raises:
        TrackingError: matplotlib is missing, the metrics file is unreadable or empty, or none of ``keys`` is in it.
    """
    matplotlib_figure = _optional_import("matplotlib.figure", "plotting metrics", "matplotlib")
    agg = _optional_import("matplotlib.backends.backend_agg", "plotting metrics", "matplotlib")
    by_step = read_metrics(metrics_path)
    if not by_step:
        raise TrackingError(f"{metrics_path} holds no metrics to plot")
    if keys is None:
        panels = choose_panels(by_step)
    else:
        available = {key for metrics in by_step.values() for key in metrics}
        panels = [PlotPanel(key, (key,)) for key in keys if key in available]
    if not panels:
        raise TrackingError(f"none of the requested metrics are in {metrics_path}")
    rows = math.ceil(len(panels) / columns)
    figure = matplotlib_figure.Figure(figsize=(5 * columns, 3 * rows), layout="constrained")
    agg.FigureCanvasAgg(figure)
    series = _series(by_step)
    for index, panel in enumerate(panels):
        axes = figure.add_subplot(rows, columns, index + 1)
        _draw_panel(axes, panel, series)
        axes.set_title(panel.title)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if panel.metrics != (panel.title,):  # name the curves unless the title already does
            axes.legend(fontsize="small")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    return out


def _draw_panel(axes: Any, panel: PlotPanel, series: Mapping[str, list[tuple[int, float]]]) -> None:
    """Lines (or, for a stacked panel, areas over the steps where every part was logged) of the panel's metrics."""
    if panel.stacked:
        values = [dict(series[key]) for key in panel.metrics]
        steps = sorted(set.intersection(*(set(v) for v in values)))
        axes.stackplot(steps, *[[v[step] for step in steps] for v in values], labels=panel.metrics, alpha=0.8)
        return
    for key in panel.metrics:
        points = series[key]
        marker = "." if len(points) < 50 else None
        axes.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=key)
