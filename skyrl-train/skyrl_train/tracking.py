"""Experiment tracking: a :class:`Tracker` fans each step's metrics out to the configured backends.

Backends (``trainer.logger``):

=================  ===========================================================================================
``console``        a progress bar and one compact metrics line per step (``rich`` when installed, else plain)
``jsonl``          ``{run_dir}/metrics.jsonl`` (one ``{"step", "time", **metrics}`` line per step) and
                   ``{run_dir}/samples.jsonl`` (a few decoded trajectories per step)
``tensorboard``    event files under ``{run_dir}/tensorboard`` (needs the ``tensorboard`` package)
``wandb``          a Weights & Biases run, resumed across restarts of the same run dir (needs ``wandb``)
=================  ===========================================================================================

At :meth:`Tracker.finish` a PNG of the reward and other key curves is drawn from ``metrics.jsonl``
(``{run_dir}/metrics.png``, needs ``matplotlib``). After a resume, ``metrics.jsonl`` may repeat steps logged
after the checkpoint; readers keep the last line of each step.

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
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

__all__ = [
    "LOGGERS",
    "ConsoleBackend",
    "JsonlBackend",
    "TensorBoardBackend",
    "Tracker",
    "TrackingBackend",
    "TrackingError",
    "WandbBackend",
    "plot_metrics",
    "read_metrics",
    "select_plot_keys",
]

logger = logging.getLogger(__name__)

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "metrics.png"
# Substrings that make a metric "key": shown on the console line and plotted, in this order of preference.
KEY_METRIC_PATTERNS = (
    "reward",
    "loss",
    "kl",
    "entropy",
    "grad_norm",
    "response_length",
    "num_tokens",
    "timing",
    "time",
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
    """A progress bar over ``total_steps`` and a line of the key metrics after each step.

    Args:
        total_steps: the bar's length; ``None`` shows a counter without a total.
        keys: metrics shown on the line; ``None`` picks up to ``max_keys`` by ``KEY_METRIC_PATTERNS``.
        stream: where to write (default: standard output at the time of writing).
        max_keys: how many metrics the line shows when ``keys`` is ``None``.
    """

    def __init__(
        self,
        total_steps: int | None = None,
        keys: Sequence[str] | None = None,
        stream: IO[str] | None = None,
        max_keys: int = 8,
    ) -> None:
        self.total_steps = total_steps
        self.keys = list(keys) if keys is not None else None
        self.max_keys = max_keys
        self._stream = stream
        self._progress: Any = None
        self._task: Any = None
        self._closed = False

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Advance the bar to ``step`` and print the metrics line."""
        line = self.format_line(metrics, step)
        progress = self._ensure_progress()
        if progress is None:
            print(line, file=self._stream, flush=True)
            return
        progress.console.print(line, markup=False, highlight=False)
        progress.update(self._task, completed=step)
        progress.refresh()

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Samples are not printed: they would drown the metrics lines."""

    def format_line(self, metrics: Mapping[str, float], step: int) -> str:
        """``step 3/10 | reward/mean=0.25 policy/loss=-0.013 …`` with the chosen keys."""
        keys = self.keys if self.keys is not None else select_plot_keys(metrics, self.max_keys)
        total = f"/{self.total_steps}" if self.total_steps else ""
        shown = " ".join(f"{key}={_format_number(metrics[key])}" for key in keys if key in metrics)
        return f"step {step}{total} | {shown}"

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


def _format_number(value: float) -> str:
    return f"{value:.4g}"


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
                    backends.append(ConsoleBackend(total_steps, stream=console_stream))
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
    """``step → metrics`` from a metrics JSONL; a step logged twice (after a resume) keeps its last line.

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
            by_step[step] = {k: float(v) for k, v in record.items() if isinstance(v, numbers.Real)}
    return dict(sorted(by_step.items()))


def select_plot_keys(metrics: Mapping[str, Any] | Sequence[str], limit: int = 6) -> list[str]:
    """Up to ``limit`` key metrics: those matching ``KEY_METRIC_PATTERNS`` in pattern order, else sorted names."""
    names = sorted(metrics)
    chosen: list[str] = []
    for pattern in KEY_METRIC_PATTERNS:
        chosen.extend(name for name in names if pattern in name and name not in chosen)
    chosen.extend(name for name in names if name not in chosen)
    return chosen[:limit]


def plot_metrics(
    metrics_path: str | Path, out_path: str | Path, keys: Sequence[str] | None = None, columns: int = 2
) -> Path:
    """Draw one panel per metric (reward first) against the step and save a PNG; return ``out_path``.

    Uses matplotlib's Agg canvas directly, so no display and no global pyplot state are involved.

    Raises:
        TrackingError: matplotlib is missing, or the metrics file is unreadable or empty.
    """
    matplotlib_figure = _optional_import("matplotlib.figure", "plotting metrics", "matplotlib")
    agg = _optional_import("matplotlib.backends.backend_agg", "plotting metrics", "matplotlib")
    by_step = read_metrics(metrics_path)
    if not by_step:
        raise TrackingError(f"{metrics_path} holds no metrics to plot")
    available = {key for metrics in by_step.values() for key in metrics}
    keys = [k for k in keys if k in available] if keys is not None else select_plot_keys(sorted(available))
    if not keys:
        raise TrackingError(f"none of the requested metrics are in {metrics_path}")
    rows = math.ceil(len(keys) / columns)
    figure = matplotlib_figure.Figure(figsize=(5 * columns, 3 * rows), layout="constrained")
    agg.FigureCanvasAgg(figure)
    for index, key in enumerate(keys):
        axes = figure.add_subplot(rows, columns, index + 1)
        points = [(step, metrics[key]) for step, metrics in by_step.items() if key in metrics]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None)
        axes.set_title(key)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    return out
