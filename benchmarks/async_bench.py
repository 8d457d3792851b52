"""``trainer.async_mode`` side by side: ``sync``, ``one_step_off`` and ``fully_async`` on a slow multi-turn env.

    .venv/bin/python benchmarks/async_bench.py                      # 2 + 20 steps a mode, learning, 3 seeds (≈45 min)
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

Part 1b, the SWE path (``async_swe.py``; not with ``--skip-swe``). The same three modes on real SWE episodes of
skyrl-agent (process sandboxes, shipped tasks, graded by their hidden tests) with its latency oracle as the policy:
each LLM call waits on a modelled GPU, sandbox starts, tool calls and grading take their real time. Same columns;
``--swe-*`` flags set its sizes.

Part 2, learning (not with ``--quick``). The quickstart task (``skyrl_train.quickstart``) for each of
``--learning-seeds`` seeds (default 3; a mode's row is the mean): one SFT warm start per seed, then
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
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from _async_model import ModelledEngine, ModelledRun, StepRecord, mode_config, modelled_gpu, serving, summarise
from _machine import host_info
from agent_bench import render, targets_table
from async_swe import SWE_TINY, SWEWorkload, swe_part

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType
from skyrl_train.config import Config, apply_overrides, from_dict, to_dict
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.generators import SkyRLGymGenerator
from skyrl_train.models.tiny import build_tokenizer
from skyrl_train.timeline import Timeline
from skyrl_train.wiring import generator_config

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


# --- Part 1: one mode's run -----------------------------------------------------------------------------------------


def bench_config(mode: str, w: Workload) -> Config:
    """The run config of ``mode`` on the workload (only what the wiring reads matters)."""
    overrides = [
        f"generator.max_turns={w.turns}",
        f"generator.max_generate_length={w.reply_tokens + 1}",
        "generator.max_input_length=2048",
        f"environment.env_class={ENV_ID}",
    ]
    return mode_config(mode, w.prompts_per_step, w.samples, w.seed, overrides)


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


class Session:
    """One mode's trainer over the modelled engine and env (a :class:`ModelledRun`)."""

    def __init__(self, mode: str, w: Workload, tokenizer: Any) -> None:
        config = bench_config(mode, w)
        gpu = modelled_gpu(w.gpu_slots, w.call_ms, w.decode_ms, w.jitter, w.seed)
        reply = list(tokenizer.encode(REPLY * 4, add_special_tokens=False))[: w.reply_tokens]
        engine = serving(ModelledEngine(gpu, [*reply, int(tokenizer.eos_token_id)], w.sync_ms / 1000), mode)
        timeline = Timeline()
        self.generator = SkyRLGymGenerator(engine, tokenizer, generator_config(config))
        self.generator.timeline = timeline
        self.modelled = ModelledRun(
            config,
            gpu=gpu,
            engine=engine,
            generator=self.generator,
            update_s_per_row=w.update_ms / 1000,
            pad_token_id=int(tokenizer.pad_token_id),
            prompts=make_prompts(4096),
            timeline=timeline,
        )

    @property
    def records(self) -> list[StepRecord]:
        return self.modelled.records

    async def run(self, steps: int) -> None:
        """Train ``steps`` steps."""

        async def close() -> None:
            self.generator.close()

        await self.modelled.run(steps, close)


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


def scheduling_part(w: Workload, warmup: int, timed: int) -> dict[str, Any]:
    tokenizer = build_tokenizer(0)
    modes = {}
    for mode in MODES:
        print(f"{mode}: {warmup} + {timed} + 1 steps of {w.trajectories_per_step} trajectories", flush=True)
        modes[mode] = run_mode(mode, w, tokenizer, warmup, timed)
        print(f"  {modes[mode]['trajectories_per_s']:.1f} trajectories/s", flush=True)
    return modes


# --- Part 2: learning still works -----------------------------------------------------------------------------------


def learning_part(steps: int, seeds: int, smoke: bool, work: Path) -> dict[str, Any]:
    """The quickstart's GRPO phase in each mode, from one SFT warm start per seed; held-out reward before and after.

    A mode's row is its mean over the seeds. Each seed draws its own model, data split and SFT start, which every
    mode of that seed shares, so a seed's gap against sync compares runs from one start.
    """
    result: dict[str, Any] = {"run": True, "smoke": smoke, "steps": steps, "seeds": seeds, "per_seed": []}
    for seed in range(seeds):
        result["per_seed"].append(learning_seed(steps, seed, smoke, work / f"seed-{seed}"))
    first = result["per_seed"][0]
    result["trajectories_per_mode"] = first["trajectories_per_mode"]
    result["modes"] = {mode: mean_row([run["modes"][mode] for run in result["per_seed"]]) for mode in MODES}
    sync = result["modes"]["sync"]["after"]
    for row in result["modes"].values():
        row["gap_vs_sync"] = row["after"] - sync
        row["within"] = abs(row["after"] - sync) <= REWARD_GAP
    return result


def learning_seed(steps: int, seed: int, smoke: bool, work: Path) -> dict[str, Any]:
    """One seed: an SFT warm start, then ``steps`` GRPO steps from it in each mode."""
    from skyrl_train import quickstart
    from skyrl_train.models.tiny import build_tiny_model

    config = quickstart.QuickstartConfig(run_dir=work, rl_steps=steps, seed=seed)
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
    result: dict[str, Any] = {"seed": seed, "sft_steps": sft["steps"], "sft_s": time.monotonic() - started}
    result["trajectories_per_mode"] = steps * config.rl_prompts_per_step * config.rl_samples_per_prompt
    result["modes"] = {}
    for mode in MODES:
        rl = quickstart.rl_config(
            dataclasses.replace(config, run_dir=work / mode), Path(sft["model"]), train_file, eval_file
        )
        print(f"learning: seed {seed}, {mode}, {steps} GRPO steps", flush=True)
        result["modes"][mode] = train_mode(rl, mode)
    sync = result["modes"]["sync"]["after"]
    for row in result["modes"].values():
        row["gap_vs_sync"] = row["after"] - sync
    return result


def mean_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode over the seeds: mean rewards and wall time, and each seed's gap against sync."""
    return {
        "before": statistics.fmean(r["before"] for r in rows),
        "after": statistics.fmean(r["after"] for r in rows),
        "wall_s": statistics.fmean(r["wall_s"] for r in rows),
        "seed_gaps": [r["gap_vs_sync"] for r in rows],
    }


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
    if result["swe"]["run"]:
        swe_speedup = result["swe_throughput_ratio_fully_async_vs_sync"]
        swe_busy = result["swe_engine_busy_fraction_fully_async"]
        rows += [
            {"target": "SWE path: fully_async episodes/s vs sync", "limit": f"≥ {SPEEDUP_TARGET}×",
             "value": f"{swe_speedup:.2f}×", "met": swe_speedup >= SPEEDUP_TARGET},
            {"target": "SWE path: engine busy fraction, fully_async", "limit": f"≥ {ENGINE_BUSY_TARGET}",
             "value": f"{swe_busy:.3f}", "met": swe_busy >= ENGINE_BUSY_TARGET},
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
    header = ["mode", "held-out reward before", "after", "after − sync", "per seed", f"within {REWARD_GAP}",
              "wall s"]  # fmt: skip
    rows = [
        [mode, f"{r['before']:.3f}", f"{r['after']:.3f}", f"{r['gap_vs_sync']:+.3f}",
         " / ".join(f"{gap:+.3f}" for gap in r["seed_gaps"]), "yes" if r["within"] else "NO", f"{r['wall_s']:.0f}"]
        for mode, r in learning["modes"].items()
    ]  # fmt: skip
    return render(header, rows, {1, 2, 3, 6})


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
    swe = result["swe"]
    if swe["run"]:
        sw = swe["workload"]
        print(
            f"\nSWE path: {sw['prompts_per_step']} tasks × {sw['samples']} episodes per step (process sandboxes, "
            f"latency oracle on {sw['gpu_slots']} modelled GPU slots, {sw['call_ms']:g} ms a call), update "
            f"{sw['update_ms']:g} ms/trajectory; 1 warm-up + {swe['timed']} timed steps a mode\n"
        )
        print(scheduling_table(swe["modes"]))
    else:
        print(f"\nSWE rows not run: {swe['reason']}")
    learning = result["learning"]
    if learning["run"]:
        print(f"\nLearning: the quickstart task, {learning['steps']} GRPO steps "
              f"({learning['trajectories_per_mode']} trajectories) per mode, mean of {learning['seeds']} seeds "
              f"(one SFT warm start each)"
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
    parser.add_argument("--learning-seeds", type=int, default=3, help="seeds a mode, averaged (tiny: 1)")
    parser.add_argument("--skip-learning", action="store_true", help="no learning rows")
    parser.add_argument("--skip-swe", action="store_true", help="no SWE rows (part 1b)")
    parser.add_argument("--swe-steps", type=int, help="timed SWE steps a mode (default 6; quick 3, tiny 2)")
    defaults = Workload()
    for name in Workload.__dataclass_fields__:  # one flag per field: --env-ms, --tail-p, …
        default = getattr(defaults, name)
        parser.add_argument(f"--{name.replace('_', '-')}", dest=f"w_{name}", type=type(default), help=f"({default})")
    swe_defaults = SWEWorkload()
    for name in SWEWorkload.__dataclass_fields__:  # --swe-update-ms, --swe-gpu-slots, …
        default = getattr(swe_defaults, name)
        flag = f"--swe-{name.replace('_', '-')}"
        parser.add_argument(flag, dest=f"swe_{name}", type=type(default), help=f"({default})")
    args = parser.parse_args(argv)
    base = TINY if args.tiny else defaults
    chosen = {name: getattr(args, f"w_{name}") for name in Workload.__dataclass_fields__}
    args.workload = dataclasses.replace(base, **{k: v for k, v in chosen.items() if v is not None})
    swe_chosen = {name: getattr(args, f"swe_{name}") for name in SWEWorkload.__dataclass_fields__}
    swe_base = SWE_TINY if args.tiny else swe_defaults
    args.swe_workload = dataclasses.replace(swe_base, **{k: v for k, v in swe_chosen.items() if v is not None})
    small = args.quick or args.tiny
    args.warmup = args.warmup if args.warmup is not None else (1 if small else 2)
    args.steps = args.steps if args.steps is not None else (2 if args.tiny else 6 if args.quick else 20)
    args.swe_steps = args.swe_steps if args.swe_steps is not None else (2 if args.tiny else 3 if args.quick else 6)
    if min(args.warmup, args.steps, args.swe_steps, args.learning_steps, args.learning_seeds) < 1:
        parser.error("--warmup, --steps, --swe-steps, --learning-steps and --learning-seeds must be >= 1")
    return args


def learning_or_reason(args: argparse.Namespace) -> dict[str, Any]:
    if args.skip_learning:
        return {"run": False, "reason": "--skip-learning"}
    if args.quick and not args.tiny:
        return {
            "run": False,
            "reason": "not with --quick (per seed an SFT warm start and 3 × 200 GRPO steps: ≈12 min on 2 cores)",
        }
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        seeds = 1 if args.tiny else args.learning_seeds
        return learning_part(2 if args.tiny else args.learning_steps, seeds, args.tiny, Path(tmp))


def swe_or_reason(args: argparse.Namespace) -> dict[str, Any]:
    """The SWE part's keys: its workload, modes and ratios, or why it did not run."""
    if args.skip_swe:
        return {"swe": {"run": False, "reason": "--skip-swe"}}
    w = args.swe_workload
    modes = swe_part(w, 1, args.swe_steps, MODES)
    return {
        "swe": {"run": True, "workload": dataclasses.asdict(w), "warmup": 1, "timed": args.swe_steps, "modes": modes},
        "swe_throughput_ratio_fully_async_vs_sync": ratio(modes, "fully_async"),
        "swe_throughput_ratio_one_step_off_vs_sync": ratio(modes, "one_step_off"),
        "swe_engine_busy_fraction_fully_async": modes["fully_async"]["engine_busy_fraction"],
    }


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
    result.update(swe_or_reason(args))
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
