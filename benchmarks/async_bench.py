"""``trainer.async_mode`` side by side: ``sync``, ``one_step_off`` and ``fully_async`` on a slow multi-turn env.

    .venv/bin/python benchmarks/async_bench.py                      # 2 + 20 steps a mode, learning rows (≈14 min)
    .venv/bin/python benchmarks/async_bench.py --quick --json OUT   # 1 + 6 steps a mode, no learning rows (≈1 min)
    .venv/bin/python benchmarks/async_bench.py --tiny --json OUT    # smoke run (tests/test_async_bench_smoke.py)

Part 1, scheduling. The accelerators are modelled, so the run measures how each mode schedules work, not the CPU:

- **Env**: every prompt is a tool-use episode of ``--turns`` model turns, each answered by an env step that waits
  (an I/O wait, like a sandbox call) a log-normal time around ``--env-ms``; ``--tail-p`` of the steps wait
  ``--tail-factor`` times longer. The env's steps take about as long as the model's turns: a "slow environment".
  The waits are drawn per (prompt, sample, turn) from the seed, so every mode sees the same episodes.
- **Engine**: an ``InferenceEngine`` whose ``generate`` queues for a modelled GPU
  (:class:`skyrl_agent.llm.scripted.ModelledGPU`: ``--gpu-slots`` sequences decode at once, ``--call-ms`` +
  ``--decode-ms`` per token, log-normal noise) and answers a fixed reply of ``--reply-tokens`` tokens and EOS. The
  weight sync waits ``--sync-ms``.
- **Trainer**: the real ``Trainer`` (advantages, loss, metrics, weight sync, the rollout stream) over a policy
  backend whose update waits ``--update-ms`` per trajectory on the trainer's compute thread (off the event loop in
  every mode), after computing the real loss on the engine's log-probs. At the defaults one update takes about as
  long as one batch's rollouts without a tail.
- **Settings**: the run config's own wiring (``skyrl_train.wiring``) of ``--prompts-per-step`` prompts ×
  ``--samples`` samples, one mini-batch, GRPO; the async modes' defaults (token-level TIS, ``max_staleness`` 1,
  ``max_inflight_groups`` = ``train_batch_size``). The loop is ``skyrl_train.run``'s: ``train_step`` (one step
  ahead for ``one_step_off``) or ``train_step_from`` a ``RolloutStream`` that generates up to the last step.

Each mode runs ``--warmup`` steps, ``--steps`` timed steps and one more step that is not timed (its batch was
generated during the last timed step, and nothing overlaps it). Throughput is trained trajectories per second over
the timed steps. Busy fractions are the trainer's own metrics, averaged over the timed steps:
``timing/engine_busy_fraction`` is the share of time at least one request was in the engine; the GPU's slot
occupancy (modelled work over what every slot could have done) is reported beside it. Staleness, its histogram,
evictions and refills are the trainer's ``async/*`` metrics.

Part 2, learning (not with ``--quick``). The quickstart task (``skyrl_train.quickstart``): one SFT warm start, then
``--learning-steps`` (default 200, the quickstart's) GRPO steps of 32 prompts × 8 samples from it in each mode, the
same trajectories' worth in each, through ``skyrl_train.run.run`` with the tiny model and its local engine on the
CPU (one compute thread, so the modes overlap nothing here: this part checks learning, not speed). Reported:
held-out reward (greedy, 200 problems) before and after, and whether ``|mode − sync| ≤ 0.05``.
With ``--tiny`` it runs at the quickstart's ``--smoke`` size, which checks the wiring and measures nothing.

Output: the tables on stdout and a JSON report (``--json``, default ``benchmarks/results/async_bench.json``) with
the machine it ran on. Targets (fully_async ≥ 1.6× sync throughput, engine busy ≥ 0.9 in fully_async) are reported,
never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import functools
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from _machine import host_info
from agent_bench import render, targets_table

import skyrl_gym
from skyrl_agent.llm.base import Usage
from skyrl_agent.llm.scripted import ModelledGPU
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType
from skyrl_train.async_buffer import RolloutStream
from skyrl_train.backends.base import LossFn, ModelOutput, TrainingBatch
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.config import Config, apply_overrides, from_dict, load_config, resolve, to_dict
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.data.loader import PromptLoader
from skyrl_train.generators import SkyRLGymGenerator
from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams
from skyrl_train.inference.versioned import VersionedEngine
from skyrl_train.models.tiny import build_tokenizer
from skyrl_train.timeline import Timeline
from skyrl_train.trainer import Metrics, Trainer
from skyrl_train.wiring import generator_config, loop_settings, objective_of, sampling_params, stream_settings

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "async_bench.json"
MODES = ("sync", "one_step_off", "fully_async")
ENV_ID = "async_bench_slow_tool"
REPLY = "I will run the test suite again and read the failures before I change the code. "
OBSERVATION = "tool output: 3 passed, 1 failed"

# Targets (reported, never asserted).
SPEEDUP_TARGET = 1.6  # fully_async trajectories/s over sync's
ENGINE_BUSY_TARGET = 0.9  # timing/engine_busy_fraction in fully_async
REWARD_GAP = 0.05  # learning: |held-out reward of the mode − sync's|


# --- The workload -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """The modelled episodes, GPU and trainer of part 1 (times in milliseconds)."""

    prompts_per_step: int = 8  # trainer.train_batch_size (prompt groups per step)
    samples: int = 4  # trajectories per prompt (a GRPO group)
    turns: int = 3  # model turns per trajectory, each answered by an env step
    reply_tokens: int = 20  # tokens the model writes per turn (then EOS)
    call_ms: float = 16.0  # modelled GPU time per generate request (scheduling, prefill)
    decode_ms: float = 4.0  # modelled GPU time per generated token of one sequence
    gpu_slots: int = 32  # sequences the modelled GPU decodes at once
    env_ms: float = 100.0  # median env step (an I/O wait)
    tail_p: float = 0.05  # share of env steps that take tail_factor times longer
    tail_factor: float = 10.0
    jitter: float = 0.3  # sigma of the log-normal noise on every modelled duration
    update_ms: float = 20.0  # modelled policy update per trained trajectory
    sync_ms: float = 30.0  # modelled weight sync into the engine
    seed: int = 0  # env waits, rewards and GPU noise

    @property
    def trajectories_per_step(self) -> int:
        return self.prompts_per_step * self.samples

    @property
    def turn_ms(self) -> float:
        """The median GPU time of one turn."""
        return self.call_ms + self.decode_ms * (self.reply_tokens + 1)


TINY = Workload(prompts_per_step=2, samples=2, turns=2, call_ms=4.0, decode_ms=1.0, env_ms=25.0, update_ms=10.0)


@dataclass
class EnvLatency:
    """Draws each trajectory's env waits (seconds) and final reward, from the seed and (prompt, sample) alone.

    A prompt's samples are made in order, so the ``k``-th env made for a prompt is its ``k``-th sample: the same
    prompt gets the same episodes in every mode, however the modes interleave their trajectories.
    """

    workload: Workload
    made: dict[str, int] = field(default_factory=dict)  # envs made per prompt so far

    def episode(self, key: str) -> tuple[list[float], float]:
        """The waits of each turn's env step and the episode's reward (0 or 1) for the next sample of ``key``."""
        sample = self.made.get(key, 0)
        self.made[key] = sample + 1
        rng = random.Random(f"{self.workload.seed}:{key}:{sample}")
        w = self.workload
        waits = []
        for _ in range(w.turns):
            wait = w.env_ms / 1000 * rng.lognormvariate(0.0, w.jitter)
            waits.append(wait * w.tail_factor if rng.random() < w.tail_p else wait)
        return waits, float(rng.random() < 0.5)


class SlowToolEnv(BaseTextEnv):
    """A multi-turn tool episode whose every step waits on the event loop (see :class:`EnvLatency`)."""

    def __init__(self, env_config: object = None, extras: dict[str, Any] | None = None, *, latency: EnvLatency) -> None:
        super().__init__()
        extras = extras or {}
        self.max_turns = int(extras.get("max_turns", 1))
        self.waits, self.reward = latency.episode(str(extras["episode_key"]))

    async def ainit(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        return prompt, {}

    async def astep(self, action: str) -> BaseTextEnvStepOutput:
        wait, output = self._advance()
        await asyncio.sleep(wait)
        return output

    def step(self, action: str) -> BaseTextEnvStepOutput:
        wait, output = self._advance()
        time.sleep(wait)
        return output

    async def aclose(self) -> None:
        return None

    def _advance(self) -> tuple[float, BaseTextEnvStepOutput]:
        self.turns += 1
        done = self.turns >= self.max_turns
        observations = [] if done else [{"role": "user", "content": OBSERVATION}]
        wait = self.waits[min(self.turns, len(self.waits)) - 1]
        return wait, BaseTextEnvStepOutput(
            observations=observations, reward=self.reward if done else 0.0, done=done, metadata={}
        )


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
        return {"loss": float(loss.item()), **metrics}

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


# --- Part 1: one mode's run -----------------------------------------------------------------------------------------


def mode_config(mode: str, w: Workload) -> Config:
    """The run config of ``mode`` on the workload (only what the wiring reads matters)."""
    return resolve(
        load_config(
            None,
            [
                f"trainer.async_mode={mode}",
                f"trainer.train_batch_size={w.prompts_per_step}",
                f"trainer.policy_mini_batch_size={w.prompts_per_step}",
                f"trainer.seed={w.seed}",
                f"generator.n_samples_per_prompt={w.samples}",
                f"generator.max_turns={w.turns}",
                f"generator.max_generate_length={w.reply_tokens + 1}",
                "generator.max_input_length=2048",
                f"environment.env_class={ENV_ID}",
            ],
        )
    )


def make_prompts(count: int) -> list[PromptRecord]:
    return [
        PromptRecord(
            [{"role": "user", "content": f"Task {i}: make the failing test pass."}],
            ENV_ID,
            {"episode_key": f"task-{i}", "data_source": "async_bench"},
            str(i),
        )
        for i in range(count)
    ]


@dataclass
class StepRecord:
    """What the benchmark keeps of one step."""

    end: float  # time.monotonic() when the step's metrics were emitted
    gpu_work_s: float  # the modelled GPU's work so far (sequence-seconds)
    metrics: Metrics


class Session:
    """One mode's trainer over the modelled engine and env; :meth:`run` drives the loop as ``skyrl_train.run`` does."""

    def __init__(self, mode: str, w: Workload, tokenizer: Any) -> None:
        self.mode, self.w = mode, w
        config = mode_config(mode, w)
        self.stream_settings = stream_settings(config)
        self.gpu = ModelledGPU(
            capacity=w.gpu_slots,
            decode_s_per_token=w.decode_ms / 1000,
            overhead_s=w.call_ms / 1000,
            jitter=w.jitter,
            seed=w.seed,
        )
        reply = list(tokenizer.encode(REPLY * 4, add_special_tokens=False))[: w.reply_tokens]
        engine: InferenceEngine = ModelledEngine(self.gpu, [*reply, int(tokenizer.eos_token_id)], w.sync_ms / 1000)
        if mode == "fully_async":  # as skyrl_train.run serves it: each turn stamped with its policy version
            engine = VersionedEngine(engine)
        self.timeline = Timeline()
        self.generator = SkyRLGymGenerator(engine, tokenizer, generator_config(config))
        self.generator.timeline = self.timeline
        self.compute = ComputeThread()
        train_params, eval_params = sampling_params(config)
        self.trainer = Trainer(
            settings=loop_settings(config),
            objective=objective_of(config),
            policy=ModelledPolicy(w.update_ms / 1000),
            engine=engine,
            generator=self.generator,
            sampling_params=train_params,
            eval_sampling_params=eval_params,
            pad_token_id=int(tokenizer.pad_token_id),
            compute=self.compute,
            timeline=self.timeline,
        )
        self.records: list[StepRecord] = []
        self.trainer.callbacks.append(self._record)
        self.loader = PromptLoader(make_prompts(4096), w.prompts_per_step, shuffle=False)

    def _record(self, trainer: Trainer, metrics: Metrics) -> None:
        self.records.append(StepRecord(time.monotonic(), self.gpu.stats().work_s, dict(metrics)))

    async def run(self, steps: int) -> None:
        """Train ``steps`` steps."""
        try:
            if self.mode == "fully_async":
                await self._streamed(steps)
            else:
                await self._stepped(steps)
        finally:
            self.generator.close()
            await asyncio.to_thread(self.compute.close)

    async def _stepped(self, steps: int) -> None:
        batches = self.loader.stream()
        ahead: list[PromptRecord] | None = None
        for step in range(steps):
            batch = ahead if ahead is not None else next(batches)
            ahead = next(batches) if self.mode == "one_step_off" and step + 1 < steps else None
            await self.trainer.train_step(batch, upcoming=ahead)

    async def _streamed(self, steps: int) -> None:
        stream = RolloutStream(self.stream_settings, self.trainer.rollout_group, self.loader.items())
        try:
            while self.trainer.global_step < steps:
                stream.generate_until(steps)
                await self.trainer.train_step_from(stream)
        finally:
            await stream.close()


def run_mode(mode: str, w: Workload, tokenizer: Any, warmup: int, timed: int) -> dict[str, Any]:
    """One mode: ``warmup`` + ``timed`` + 1 steps; the summary of the timed ones."""
    latency = EnvLatency(w)
    skyrl_gym.register(ENV_ID, entry_point=functools.partial(SlowToolEnv, latency=latency))
    try:
        session = Session(mode, w, tokenizer)
        asyncio.run(session.run(warmup + timed + 1))
    finally:
        skyrl_gym.deregister(ENV_ID)
    return summarise(mode, w, session.records, warmup, timed)


def summarise(mode: str, w: Workload, records: list[StepRecord], warmup: int, timed: int) -> dict[str, Any]:
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


def scheduling_part(w: Workload, warmup: int, timed: int) -> dict[str, Any]:
    tokenizer = build_tokenizer(0)
    modes = {}
    for mode in MODES:
        print(f"{mode}: {warmup} + {timed} + 1 steps of {w.trajectories_per_step} trajectories", flush=True)
        modes[mode] = run_mode(mode, w, tokenizer, warmup, timed)
        print(f"  {modes[mode]['trajectories_per_s']:.1f} trajectories/s", flush=True)
    return modes


# --- Part 2: learning still works -----------------------------------------------------------------------------------


def learning_part(steps: int, smoke: bool, work: Path) -> dict[str, Any]:
    """The quickstart's GRPO phase in each mode from one SFT warm start; held-out reward before and after."""
    from skyrl_train import quickstart
    from skyrl_train.models.tiny import build_tiny_model

    config = quickstart.QuickstartConfig(run_dir=work, rl_steps=steps)
    if smoke:  # the sizes of `python -m skyrl_train.quickstart --smoke`
        config = dataclasses.replace(
            config, sft_max_steps=4, sft_eval_every=2, rl_prompts_per_step=4, rl_samples_per_prompt=2,
            eval_interval=1, eval_problems=8,
        )  # fmt: skip
    torch.manual_seed(config.seed)
    base = build_tiny_model(work / "base-model", seed=config.seed)
    train, held_out = quickstart.make_problems(config.seed, config.eval_problems)
    train_file = quickstart.write_rows(train, work / "data" / "train.jsonl")
    eval_file = quickstart.write_rows(held_out, work / "data" / "eval.jsonl")
    started = time.monotonic()
    sft = asyncio.run(quickstart.sft_warm_start(config, base, train, held_out))
    result: dict[str, Any] = {"run": True, "smoke": smoke, "steps": steps, "sft_steps": sft["steps"], "modes": {}}
    result["sft_s"] = time.monotonic() - started
    result["trajectories_per_mode"] = steps * config.rl_prompts_per_step * config.rl_samples_per_prompt
    for mode in MODES:
        rl = quickstart.rl_config(
            dataclasses.replace(config, run_dir=work / mode), Path(sft["model"]), train_file, eval_file
        )
        print(f"learning: {mode}, {steps} GRPO steps", flush=True)
        result["modes"][mode] = train_mode(rl, mode)
    sync = result["modes"]["sync"]["after"]
    for row in result["modes"].values():
        row["gap_vs_sync"] = row["after"] - sync
        row["within"] = abs(row["after"] - sync) <= REWARD_GAP
    return result


def train_mode(config: Config, mode: str) -> dict[str, Any]:
    """One quickstart GRPO run in ``mode``: held-out reward at each evaluation (the first one is before RL)."""
    from skyrl_train.run import run

    config = from_dict(apply_overrides(to_dict(config), [f"trainer.async_mode={mode}", "trainer.logger=[jsonl]"]))
    done = run(config, echo_config=False)
    history = [(step, m["eval/all/reward_mean"]) for step, m in done.eval_history]
    return {"before": history[0][1], "after": history[-1][1], "history": history, "wall_s": done.wall_seconds}


# --- Report -----------------------------------------------------------------------------------------------------------


def ratio(modes: dict[str, Any], mode: str) -> float:
    return float(modes[mode]["trajectories_per_s"] / modes["sync"]["trajectories_per_s"])


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    speedup, busy = result["throughput_ratio_fully_async_vs_sync"], result["engine_busy_fraction_fully_async"]
    rows = [
        {"target": "fully_async trajectories/s vs sync", "limit": f"≥ {SPEEDUP_TARGET}×", "value": f"{speedup:.2f}×",
         "met": speedup >= SPEEDUP_TARGET},
        {"target": "engine busy fraction, fully_async", "limit": f"≥ {ENGINE_BUSY_TARGET}", "value": f"{busy:.3f}",
         "met": busy >= ENGINE_BUSY_TARGET},
    ]  # fmt: skip
    learning = result["learning"]
    for mode in MODES[1:]:
        row = learning["modes"].get(mode) if learning["run"] else None
        rows.append({
            "target": f"held-out reward, |{mode} − sync|", "limit": f"≤ {REWARD_GAP}",
            "value": None if row is None else f"{abs(row['gap_vs_sync']):.3f}",
            "met": None if row is None else row["within"],
        })  # fmt: skip
    return rows


def scheduling_table(modes: dict[str, Any]) -> str:
    header = ["mode", "traj/s", "vs sync", "s/step", "engine busy", "GPU slots busy", "trainer busy", "staleness",
              "staleness hist", "evicted", "refilled"]  # fmt: skip
    rows = []
    for mode, m in modes.items():
        hist = " / ".join(f"{lag}: {share:.2f}" for lag, share in m["staleness_hist"].items())
        rows.append([
            mode, f"{m['trajectories_per_s']:.1f}", f"{ratio(modes, mode):.2f}×", f"{m['step_s_mean']:.3f}",
            f"{m['engine_busy_fraction']:.3f}", f"{m['gpu_slot_occupancy']:.3f}", f"{m['trainer_busy_fraction']:.3f}",
            f"{m['staleness']:.2f}", hist, f"{m['evicted']:.0f}", f"{m['refilled']:.0f}",
        ])  # fmt: skip
    return render(header, rows, {1, 2, 3, 4, 5, 6, 7, 9, 10})


def learning_table(learning: dict[str, Any]) -> str:
    header = ["mode", "held-out reward before", "after", "after − sync", f"within {REWARD_GAP}", "wall s"]
    rows = [
        [mode, f"{r['before']:.3f}", f"{r['after']:.3f}", f"{r['gap_vs_sync']:+.3f}", "yes" if r["within"] else "NO",
         f"{r['wall_s']:.0f}"]
        for mode, r in learning["modes"].items()
    ]  # fmt: skip
    return render(header, rows, {1, 2, 3, 5})


def print_report(result: dict[str, Any]) -> None:
    m, w = result["machine"], result["workload"]
    print(f"\nmachine: {m['cpu_count']} CPUs ({m['cpus_usable']} usable), {m['cpu_model']}, {m['platform']}")
    print(f"load average: start {m['loadavg_start']}, end {m['loadavg_end']}")
    if result["tiny"]:
        print("TINY RUN: a smoke test; the numbers below measure nothing")
    print(
        f"\nScheduling: {w['prompts_per_step']} prompts × {w['samples']} samples × {w['turns']} turns per step; "
        f"turn ≈ {result['turn_ms']:.0f} ms of GPU, env step ≈ {w['env_ms']:g} ms ({w['tail_p']:.0%} × "
        f"{w['tail_factor']:g}), update {w['update_ms']:g} ms/trajectory, sync {w['sync_ms']:g} ms; "
        f"{result['warmup']} warm-up + {result['timed']} timed steps a mode\n"
    )
    print(scheduling_table(result["modes"]))
    learning = result["learning"]
    if learning["run"]:
        print(f"\nLearning: the quickstart task, {learning['steps']} GRPO steps "
              f"({learning['trajectories_per_mode']} trajectories) per mode from one SFT warm start"
              f"{' (smoke size: measures nothing)' if learning['smoke'] else ''}\n")  # fmt: skip
        print(learning_table(learning))
    else:
        print(f"\nLearning rows not run: {learning['reason']}")
    print("\nTargets\n")
    print(targets_table(result["targets"]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 warm-up + 6 timed steps a mode, no learning rows")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: tiny workload, smoke-sized learning rows")
    parser.add_argument("--json", "--output", dest="output", type=Path, default=DEFAULT_OUTPUT, help="JSON report")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 2; quick and tiny 1)")
    parser.add_argument("--steps", type=int, help="timed steps a mode (default 20; quick 6, tiny 2)")
    parser.add_argument("--learning-steps", type=int, default=200, help="GRPO steps a mode (the quickstart's 200)")
    parser.add_argument("--skip-learning", action="store_true", help="no learning rows")
    defaults = Workload()
    for name in Workload.__dataclass_fields__:  # one flag per field: --env-ms, --tail-p, …
        default = getattr(defaults, name)
        parser.add_argument(f"--{name.replace('_', '-')}", dest=f"w_{name}", type=type(default), help=f"({default})")
    args = parser.parse_args(argv)
    base = TINY if args.tiny else defaults
    chosen = {name: getattr(args, f"w_{name}") for name in Workload.__dataclass_fields__}
    args.workload = dataclasses.replace(base, **{k: v for k, v in chosen.items() if v is not None})
    small = args.quick or args.tiny
    args.warmup = args.warmup if args.warmup is not None else (1 if small else 2)
    args.steps = args.steps if args.steps is not None else (2 if args.tiny else 6 if args.quick else 20)
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be >= 1")
    return args


def learning_or_reason(args: argparse.Namespace) -> dict[str, Any]:
    if args.skip_learning:
        return {"run": False, "reason": "--skip-learning"}
    if args.quick and not args.tiny:
        return {
            "run": False,
            "reason": "not with --quick (an SFT warm start and 3 × 200 GRPO steps: ≈12 min on 2 cores)",
        }
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        return learning_part(2 if args.tiny else args.learning_steps, args.tiny, Path(tmp))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_start = [round(x, 2) for x in os.getloadavg()]
    started = datetime.datetime.now(datetime.UTC)
    wall0 = time.monotonic()
    w = args.workload
    modes = scheduling_part(w, args.warmup, args.steps)
    result: dict[str, Any] = {
        "benchmark": "async_bench",
        "started_utc": started.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "tiny": args.tiny,
        "workload": dataclasses.asdict(w),
        "turn_ms": w.turn_ms,
        "warmup": args.warmup,
        "timed": args.steps,
        "throughput_ratio_fully_async_vs_sync": ratio(modes, "fully_async"),
        "throughput_ratio_one_step_off_vs_sync": ratio(modes, "one_step_off"),
        "engine_busy_fraction_fully_async": modes["fully_async"]["engine_busy_fraction"],
        "modes": modes,
        "rows": list(modes.values()),
    }
    result["learning"] = learning_or_reason(args)
    result["targets"] = targets(result)
    result["wall_s"] = time.monotonic() - wall0
    result["machine"] = {
        **host_info(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "loadavg_start": load_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    print_report(result)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
