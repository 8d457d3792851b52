"""Run a training job end to end; what ``skyrl-train`` (the CLI) calls.

Order: resolve and validate the config (every bad input fails here, before any model loads) → record it in the
run directory → the run's settings (:mod:`skyrl_train.wiring`, the one reader of the config) → seed python, numpy
and torch → tokenizer, datasets → every component (:mod:`skyrl_train.compose`) → resume from the latest checkpoint
when there is one → evaluate → the steps of ``trainer.async_mode``'s loop (:mod:`skyrl_train.modes`), with
periodic evaluation, checkpoints and Hugging Face exports → final checkpoint, export and the metrics plot. Returns
a :class:`RunResult`. At the end, or when the build fails half-way, every component is closed
(:meth:`skyrl_train.compose.Components.close`).

Checkpoints never hold work in flight: ``one_step_off`` starts no rollouts ahead of a checkpoint's step, and
``fully_async``'s stream generates only up to it; a ``fully_async`` checkpoint also records how many groups were
started (their index seeds each group's sampling), so a resumed run continues exactly.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from skyrl_train import checkpoint
from skyrl_train.compose import Components, load_prompts
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.config import Config, record_config, resolve, validate
from skyrl_train.inference.base import InferenceEngine
from skyrl_train.modes import fully_async, one_step_off, sync
from skyrl_train.timeline import PNG_FILE, TRACE_FILE, Timeline
from skyrl_train.tracking import Tracker
from skyrl_train.trainer import Metrics, Trainer, state_for_checkpoint
from skyrl_train.wiring import (
    backend_config,
    components_of,
    critic_backend_config,
    generator_config,
    loop_settings,
    objective_of,
    run_settings,
    training_actors,
)

__all__ = [
    "RunResult",
    "arun",
    "backend_config",
    "critic_backend_config",
    "generator_config",
    "loop_settings",
    "objective_of",
    "run",
    "seed_everything",
    "training_actors",
]

if TYPE_CHECKING:
    from skyrl_train.backends.ray_group import FSDPBackend

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a finished run produced."""

    run_dir: Path
    global_step: int
    eval_history: list[tuple[int, Metrics]] = field(default_factory=list)  # (step, eval metrics)
    last_metrics: Metrics = field(default_factory=dict)
    checkpoint: Path | None = None
    export: Path | None = None
    plot: Path | None = None
    timeline: Path | None = None  # timeline.png (beside trace.json)
    wall_seconds: float = 0.0


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's and torch's global generators (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(config: Config, *, echo_config: bool = True) -> RunResult:
    """Train as ``config`` says (synchronous wrapper around :func:`arun`)."""
    return asyncio.run(arun(config, echo_config=echo_config))


async def arun(config: Config, *, echo_config: bool = True) -> RunResult:
    """Train as ``config`` says; see the module docstring for the order of work."""
    started = time.monotonic()
    config = resolve(config)
    validate(config)
    record_config(config, run_settings(config).outputs.run_dir, echo=print if echo_config else None)
    session = await _Session.open(config)
    try:
        result = await session.train()
    finally:
        await session.close()
    result.wall_seconds = time.monotonic() - started
    return result


class _Session:
    """One run: its components (built by :mod:`skyrl_train.compose`) and the outer loop over steps.

    The session reads no config: :mod:`skyrl_train.wiring` turned it into settings, and the mode's loop
    (:mod:`skyrl_train.modes`) runs the steps, handing each step's metrics back to :meth:`after_step`.
    """

    def __init__(self, config: Config) -> None:
        settings = run_settings(config)
        self.outputs = settings.outputs
        seed_everything(self.outputs.seed)
        self.run_dir = self.outputs.run_dir
        self.prompts = load_prompts(settings.data)
        self.loader = self.prompts.loader
        self.eval_prompts = self.prompts.eval_prompts
        self.parts = components_of(config, total_steps=settings.total_steps(steps_per_epoch=len(self.loader)))
        self.schedule = self.parts.schedule
        self.result = RunResult(run_dir=self.run_dir, global_step=0)
        self.groups_started = 0  # fully_async: groups started before this session (a resumed run's count)
        self.checkpoint_state: Callable[[], dict[str, Any]] | None = None  # fully_async: the stream's state
        self.components: Components | None = None
        self.trainer: Trainer  # set by open()

    @classmethod
    async def open(cls, config: Config) -> _Session:
        """A session with every component built (closed again when building fails)."""
        session = cls(config)
        session.components, session.trainer = await Components.open(session.parts, session.prompts, session.outputs)
        return session

    @property
    def engine(self) -> InferenceEngine | None:
        """The run's engine (or engine group)."""
        return self.components.engine if self.components is not None else None

    @property
    def compute(self) -> ComputeThread | None:
        """The thread every in-process model computes on, if the engine runs in this process."""
        return self.components.compute if self.components is not None else None

    @property
    def worker_groups(self) -> list[FSDPBackend]:
        """``trainer.backend=fsdp``: the policy's (reference's, critic's) Ray worker groups."""
        return self.components.worker_groups if self.components is not None else []

    @property
    def _timeline(self) -> Timeline:
        assert self.components is not None
        return self.components.timeline

    @property
    def tracker(self) -> Tracker:
        """Where the run's metrics go."""
        tracker = self.components.tracker if self.components is not None else None
        assert tracker is not None, "the session is not open"
        return tracker

    async def train(self) -> RunResult:
        """Resume, evaluate, run the mode's loop, then write the final checkpoint, export, plot and timeline."""
        out, result = self.outputs, self.result
        await self._resume()
        if out.eval_before_train and self.trainer.global_step == 0:
            await self._evaluate(result)
        await self._loop()
        if self.eval_prompts and (not result.eval_history or result.eval_history[-1][0] != self.trainer.global_step):
            await self._evaluate(result)
        result.global_step = self.trainer.global_step
        result.checkpoint = self._save(result.last_metrics)
        if result.export != self._export_dir():  # the last step's export may have been written in the loop
            result.export = self._export()
        result.plot = self.tracker.finish()
        result.timeline = self._write_timeline()
        return result

    async def _loop(self) -> None:
        """The steps, as ``trainer.async_mode`` runs them."""
        mode = self.parts.loop.async_mode
        if mode == "fully_async":
            await fully_async.train(self, self.parts.stream)
        elif mode == "one_step_off":
            await one_step_off.train(self)
        else:
            await sync.train(self)

    async def after_step(self, metrics: Metrics) -> None:
        """Evaluate, checkpoint and export when their intervals say so."""
        out, result, step = self.outputs, self.result, self.trainer.global_step
        result.last_metrics = metrics
        if self.eval_prompts and out.eval_interval > 0 and step % out.eval_interval == 0:
            await self._evaluate(result)
        if self.schedule.checkpoint_after(step):
            result.checkpoint = self._save(result.last_metrics)
        if out.export_interval > 0 and step % out.export_interval == 0:
            result.export = self._export()

    def _write_timeline(self) -> Path | None:
        """``trace.json`` and ``timeline.png`` in the run directory (the picture only with matplotlib)."""
        self._timeline.write_trace(self.run_dir / TRACE_FILE)
        try:
            return self._timeline.write_png(self.run_dir / PNG_FILE)
        except ImportError:
            logger.warning("timeline.png needs matplotlib (pip install matplotlib); trace.json was written")
            return None

    async def _evaluate(self, result: RunResult) -> None:
        if not self.eval_prompts:
            return
        metrics = await self.trainer.evaluate(self.eval_prompts)
        result.eval_history.append((self.trainer.global_step, metrics))
        self.tracker.log(metrics, self.trainer.global_step)

    async def _resume(self) -> None:
        out = self.outputs
        path = checkpoint.resolve_resume_dir(out.resume_mode, out.ckpt_path, out.resume_path)
        if path is None:
            return
        state = checkpoint.load_checkpoint(path, read_state=self._read_models)
        self.trainer.global_step = state.global_step
        if state.loader_state is not None:
            self.loader.load_state_dict(state.loader_state)
        self.groups_started = int(state.extra.get("groups_started", state.global_step * out.groups_per_step))
        kl_coef = state.extra.get("kl_coef")
        if kl_coef is not None and self.trainer.kl_controller is not None:
            self.trainer.kl_controller.value = float(kl_coef)
        await self.trainer.sync_weights()
        print(f"resumed from {path} at step {state.global_step}")

    def _save(self, metrics: Metrics) -> Path:
        out = self.outputs
        return checkpoint.save_checkpoint(
            out.ckpt_path,
            self.trainer.global_step,
            write_state=self._write_models,
            config=dict(out.config),
            metrics=metrics,
            extra={**state_for_checkpoint(self.trainer), **(self.checkpoint_state() if self.checkpoint_state else {})},
            loader_state=self.loader.state_dict(),
            max_to_keep=out.max_ckpts_to_keep,
        )

    def _write_models(self, path: Path) -> None:
        checkpoint.save_models(path, self.trainer.policy, critic=self.trainer.critic)

    def _read_models(self, path: Path) -> None:
        checkpoint.load_models(path, self.trainer.policy, critic=self.trainer.critic)

    def _export_dir(self) -> Path:
        return Path(self.outputs.export_path) / f"global_step_{self.trainer.global_step}"

    def _export(self) -> Path:
        path = self._export_dir()
        export = getattr(self.trainer.policy, "export_hf", None)
        if export is None:
            raise TypeError(f"{type(self.trainer.policy).__name__} cannot export a Hugging Face directory")
        export(path, self.outputs.base_model)
        return path

    async def close(self) -> None:
        """Close every component (see :meth:`skyrl_train.compose.Components.close`)."""
        if self.components is not None:
            await self.components.close()
