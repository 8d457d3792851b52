"""The modelled pieces both parts of ``async_bench.py`` share: an engine and a policy whose work is modelled time,
and the summary of one mode's timed steps."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from skyrl_agent.llm.base import Usage
from skyrl_agent.llm.scripted import ModelledGPU
from skyrl_train.backends.base import LossFn, ModelOutput, TrainingBatch
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.config import Config, load_config, resolve
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.data.loader import PromptLoader
from skyrl_train.generators.base import Generator
from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams
from skyrl_train.inference.versioned import VersionedEngine
from skyrl_train.modes import Schedule, fully_async, one_step_off, sync
from skyrl_train.timeline import Timeline
from skyrl_train.trainer import Metrics, Trainer
from skyrl_train.wiring import loop_settings, objective_of, sampling_params, stream_settings


class Sizes(Protocol):
    """What :func:`summarise` reads of a workload."""

    @property
    def trajectories_per_step(self) -> int: ...

    @property
    def gpu_slots(self) -> int: ...


class ModelledEngine:
    """An ``InferenceEngine`` that answers a fixed reply after its time on a shared :class:`ModelledGPU`."""

    def __init__(self, gpu: ModelledGPU, reply_ids: list[int], sync_s: float) -> None:
        self.gpu = gpu
        self.reply_ids = reply_ids
        self.sync_s = sync_s
        self._running = asyncio.Event()
        self._running.set()

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        await self._running.wait()
        return list(await asyncio.gather(*(self._answer(prompt, params) for prompt in prompts)))

    async def _answer(self, prompt: Sequence[int], params: SamplingParams) -> GenerationOutput:
        ids = self.reply_ids[: params.max_tokens]
        await self.gpu.generate(Usage(len(prompt), len(ids)))
        logprobs = [-0.5] * len(ids) if params.logprobs else None
        return GenerationOutput(list(ids), logprobs, "stop" if len(ids) == len(self.reply_ids) else "length")

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _ in weights:
            pass
        await asyncio.sleep(self.sync_s)

    async def pause(self) -> None:
        self._running.clear()

    async def resume(self) -> None:
        self._running.set()

    async def close(self) -> None:
        return None


class ModelledPolicy:
    """A ``TrainingBackend`` whose update computes the real loss on the rollout log-probs, then waits its time.

    The wait (``update_s_per_row`` per trajectory) stands for the GPU's forward, backward and optimizer step; it
    runs where the trainer runs its model work (the compute thread), never on the event loop.
    """

    def __init__(self, update_s_per_row: float) -> None:
        self.update_s_per_row = update_s_per_row
        self._grad_sq = 0.0

    def has_active_dropout(self) -> bool:
        return False  # one update on one mini-batch: the trainer reuses its forward pass for the old log-probs

    def forward(self, batch: TrainingBatch, *, temperature: float = 1.0) -> ModelOutput:
        return ModelOutput(log_probs=self._log_probs(batch))

    def forward_backward(
        self, batch: TrainingBatch, loss_fn: LossFn, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, float]:
        log_probs = self._log_probs(batch).requires_grad_()
        loss, metrics = loss_fn(ModelOutput(log_probs=log_probs), batch)
        torch.autograd.backward(loss)
        assert log_probs.grad is not None
        self._grad_sq += float(log_probs.grad.pow(2).sum())
        time.sleep(self.update_s_per_row * len(batch))
        return {"loss": float(loss.item()), **{name: float(value) for name, value in metrics.items()}}

    def optim_step(self) -> dict[str, float]:
        grad_norm, self._grad_sq = math.sqrt(self._grad_sq), 0.0
        return {"grad_norm": grad_norm, "lr": 1e-6}

    def get_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield "lm_head.weight", torch.zeros(1)

    def save(self, path: Path) -> None:
        return None

    def load(self, path: Path) -> None:
        return None

    @staticmethod
    def _log_probs(batch: TrainingBatch) -> torch.Tensor:
        rollout = batch.tensors.get("rollout_log_probs")
        return (rollout if rollout is not None else torch.zeros_like(batch.response_mask)).clone()


@dataclass
class StepRecord:
    """What the benchmark keeps of one step."""

    end: float  # time.monotonic() when the step's metrics were emitted
    gpu_work_s: float  # the modelled GPU's work so far (sequence-seconds)
    metrics: Metrics


def summarise(mode: str, w: Sizes, records: list[StepRecord], warmup: int, timed: int) -> dict[str, Any]:
    """Throughput and the step metrics' means (sums for counts) over the ``timed`` steps after ``warmup`` (>= 1).

    The window opens when the last warm-up step ends and closes when the last timed step ends.
    """
    start, steps = records[warmup - 1], records[warmup : warmup + timed]
    window = steps[-1].end - start.end
    rows = [r.metrics for r in steps]

    def mean(key: str) -> float:
        return statistics.fmean(row.get(key, 0.0) for row in rows)

    def total(key: str) -> float:
        return sum(row.get(key, 0.0) for row in rows)

    wait_key = {"fully_async": "timing/wait_batch_s", "one_step_off": "timing/wait_ahead_s"}.get(mode)
    return {
        "mode": mode,
        "trajectories_per_s": timed * w.trajectories_per_step / window,
        "window_s": window,
        "step_s": [b.end - a.end for a, b in itertools.pairwise([start, *steps])],
        "step_s_mean": window / timed,
        "engine_busy_fraction": mean("timing/engine_busy_fraction"),
        "trainer_busy_fraction": mean("timing/trainer_busy_fraction"),
        "gpu_slot_occupancy": (steps[-1].gpu_work_s - start.gpu_work_s) / (w.gpu_slots * window),
        "staleness": mean("async/staleness"),
        "staleness_max": max(row.get("async/staleness_max", row["async/staleness"]) for row in rows),
        "staleness_hist": staleness_hist(rows),
        "mixed_versions": mean("async/mixed_versions"),
        "evicted": total("async/evicted"),
        "stale_dropped": total("async/stale_dropped"),
        "refilled": total("async/refilled"),
        "wait_s_mean": mean(wait_key) if wait_key else 0.0,
        "generate_s_mean": mean("timing/generate_s"),
        "update_s_mean": mean("timing/update_s"),
        "weight_sync_s_mean": mean("timing/weight_sync_s"),
        "reward_mean": mean("reward/mean"),
        "timed_steps": timed,
    }


def staleness_hist(rows: Sequence[Metrics]) -> dict[str, float]:
    """Share of the trained trajectories that lag ``k`` versions, over the steps (each step's batch is equal-sized).

    ``fully_async`` logs ``async/staleness_hist/k``; the stepped modes train a whole batch of one version, so
    their ``async/staleness`` is the lag of every trajectory.
    """
    prefix = "async/staleness_hist/"
    hist: dict[str, float] = {}
    for row in rows:
        shares = {k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix)}
        for lag, share in (shares or {str(int(row["async/staleness"])): 1.0}).items():
            hist[lag] = hist.get(lag, 0.0) + share / len(rows)
    return dict(sorted(hist.items(), key=lambda item: int(item[0])))


def modelled_gpu(slots: int, call_ms: float, decode_ms: float, jitter: float, seed: int) -> ModelledGPU:
    """A GPU decoding ``slots`` sequences at once, ``call_ms`` a call and ``decode_ms`` a token (log-normal noise)."""
    return ModelledGPU(
        capacity=slots, decode_s_per_token=decode_ms / 1000, overhead_s=call_ms / 1000, jitter=jitter, seed=seed
    )


def mode_config(mode: str, prompts_per_step: int, samples: int, seed: int, overrides: Sequence[str]) -> Config:
    """The run config of ``mode`` with ``prompts_per_step`` groups of ``samples`` a step (one mini-batch)."""
    common = [
        f"trainer.async_mode={mode}",
        f"trainer.train_batch_size={prompts_per_step}",
        f"trainer.policy_mini_batch_size={prompts_per_step}",
        f"trainer.seed={seed}",
        f"generator.n_samples_per_prompt={samples}",
    ]
    return resolve(load_config(None, [*common, *overrides]))


def serving(engine: InferenceEngine, mode: str) -> InferenceEngine:
    """The engine as ``skyrl_train.run`` serves it: in ``fully_async`` each turn stamped with its policy version."""
    return VersionedEngine(engine) if mode == "fully_async" else engine


@dataclass
class _Host:
    """The run as a mode's loop sees it: no evaluation, checkpoints or exports between steps."""

    trainer: Trainer
    loader: PromptLoader[PromptRecord]
    schedule: Schedule
    groups_started: int = 0
    checkpoint_state: Callable[[], dict[str, Any]] | None = None

    async def after_step(self, metrics: Metrics) -> None:
        """Nothing to do between steps."""


class ModelledRun:
    """One mode's real ``Trainer`` over a modelled policy; :meth:`run` drives the loop as ``skyrl_train.run`` does.

    ``engine`` is what weight syncs pause (the generator's), ``gpu`` what the step records read the work of.
    """

    def __init__(
        self,
        config: Config,
        *,
        gpu: ModelledGPU,
        engine: InferenceEngine,
        generator: Generator,
        update_s_per_row: float,
        pad_token_id: int,
        prompts: list[PromptRecord],
        timeline: Timeline,
    ) -> None:
        self.mode, self.gpu = config.trainer.async_mode, gpu
        self.stream_settings = stream_settings(config)
        self.compute = ComputeThread()
        train_params, eval_params = sampling_params(config)
        self.trainer = Trainer(
            settings=loop_settings(config),
            objective=objective_of(config),
            policy=ModelledPolicy(update_s_per_row),
            engine=engine,
            generator=generator,
            sampling_params=train_params,
            eval_sampling_params=eval_params,
            pad_token_id=pad_token_id,
            compute=self.compute,
            timeline=timeline,
        )
        self.records: list[StepRecord] = []
        self.trainer.callbacks.append(self._record)
        self.loader = PromptLoader(prompts, config.trainer.train_batch_size, shuffle=False)

    def _record(self, trainer: Trainer, metrics: Metrics) -> None:
        self.records.append(StepRecord(time.monotonic(), self.gpu.stats().work_s, dict(metrics)))

    async def run(self, steps: int, close: Callable[[], Awaitable[None]]) -> None:
        """Train ``steps`` steps, then ``close`` the generator's resources and the compute thread."""
        try:
            if self.mode == "fully_async":
                await self._streamed(steps)
            else:
                await self._stepped(steps)
        finally:
            await close()
            await asyncio.to_thread(self.compute.close)

    async def _stepped(self, steps: int) -> None:
        host = _Host(self.trainer, self.loader, Schedule(total_steps=steps))
        await (one_step_off.train(host) if self.mode == "one_step_off" else sync.train(host))

    async def _streamed(self, steps: int) -> None:
        await fully_async.train(_Host(self.trainer, self.loader, Schedule(total_steps=steps)), self.stream_settings)
