"""One side of ``benchmarks/ray_bench.py``, run in a fresh interpreter of the venv under test.

Tasks:

- ``--task run --backend torch|fsdp``: the quickstart's GRPO phase (``skyrl_train.quickstart.rl_config``) driven by
  the run's own outer loop (``skyrl_train.run._Session.train``, what ``skyrl_train.run.run`` calls), with the
  policy in this process (``torch``) or in a one-rank FSDP2 worker group on a Ray actor (``fsdp``). The engine is
  the local one in this process in both (``inference.num_engines=1`` keeps it here).
- ``--task components``: weight sync from a policy (in-process, or a one-rank group on Ray) into an engine (in
  this process, or ``EngineGroup`` with one engine actor), through ``get_weights`` or (from the group to the actor)
  by broadcast, and one step's generation through the local engine against the same engine behind an actor.

Lockstep protocol (the parent alternates the two runs step by step, so a shared machine's load hits both alike):
before every step the worker prints ``@ready`` and waits for a ``go`` line on stdin; after the step it prints
``@step {json}`` (the step's ``timing/*`` metrics and its wall time). After the last step it finishes the run
(final checkpoint and export, as a run does), prints ``@report {json}`` and exits. The components task prints only
``@report``. Other stdout lines are ignored by the parent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _machine import Lockstep

# --- task run -----------------------------------------------------------------------------------------------------


def run_config(args: argparse.Namespace) -> Any:
    """The quickstart's GRPO run config with this benchmark's changes (listed in ``ray_bench.py``'s docstring)."""
    from skyrl_train.config import apply_overrides, from_dict, to_dict
    from skyrl_train.quickstart import QuickstartConfig, rl_config

    quick = QuickstartConfig(
        run_dir=args.run_dir,
        rl_steps=args.warmup + args.steps,
        rl_prompts_per_step=args.prompts,
        rl_samples_per_prompt=args.samples,
    )
    config = rl_config(quick, args.model, args.train_data, args.train_data)
    overrides = [
        f"trainer.run_dir={args.run_dir}",
        "data.val_data=[]",  # no evaluation: steps only
        "trainer.eval_before_train=false",
        "trainer.logger=[jsonl]",
    ]
    if args.backend == "fsdp":
        overrides += [
            "trainer.backend=fsdp",
            "trainer.num_training_workers=1",
            f"trainer.num_cpus_per_worker={args.cpus_per_worker}",
        ]
    return from_dict(apply_overrides(to_dict(config), overrides))


def run_task(args: argparse.Namespace, lockstep: Lockstep) -> dict[str, Any]:
    from skyrl_train.config import record_config, resolve, validate
    from skyrl_train.run import _Session

    config = resolve(run_config(args))
    validate(config)
    record_config(config, args.run_dir, echo=None)
    total = args.warmup + args.steps
    records: list[dict[str, Any]] = []
    clock = [0.0]

    def between_steps(_trainer: Any, metrics: dict[str, float]) -> None:
        # Called by the trainer at the end of each train_step (after its timing metrics are final).
        record: dict[str, Any] = {k: v for k, v in metrics.items() if k.startswith("timing/")}
        record["wall_s"] = time.perf_counter() - clock[0]
        record["response_tokens"] = metrics.get("generate/num_generated_tokens/mean")
        records.append(record)
        lockstep.done(record)
        print(f"{args.backend} step {len(records)}/{total}: {record['timing/step_s']:.2f} s", file=sys.stderr)
        if len(records) < total:
            lockstep.wait()
            clock[0] = time.perf_counter()

    async def main() -> dict[str, Any]:
        started = time.perf_counter()
        session = await _Session.open(config)
        setup_s = time.perf_counter() - started
        policy_class = type(session.trainer.policy).__name__  # TorchBackend, or FSDPBackend (trainer.backend=fsdp)
        session.trainer.callbacks.append(between_steps)
        try:
            lockstep.wait()
            clock[0] = time.perf_counter()
            result = await session.train()
        finally:
            await session.close()
        return {
            "setup_s": setup_s,
            "policy_class": policy_class,
            "global_step": result.global_step,
            "run_dir": str(result.run_dir),
        }

    report = asyncio.run(main())
    timed = records[args.warmup :]
    keys = sorted(k for k in timed[0] if k.startswith("timing/")) if timed else []
    report.update(
        backend=args.backend,
        steps=records,
        step_s=[r["timing/step_s"] for r in timed],
        median_s={k: statistics.median(r[k] for r in timed) for k in keys},
        metrics_jsonl=_metrics_jsonl(Path(report["run_dir"]) / "metrics.jsonl"),
        torch_threads=_torch_threads(),
    )
    return report


def _metrics_jsonl(path: Path) -> list[dict[str, Any]]:
    """The ``timing/*`` and ``system/*`` values of each step as the run's jsonl logger wrote them."""
    rows = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in row.items() if k.startswith(("timing/", "system/")) or k == "step"})
    return rows


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# --- task components ----------------------------------------------------------------------------------------------


SyncPath = Callable[[], Awaitable[object]]


async def _sync_rounds(paths: dict[str, SyncPath], args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds of one weight sync per path and round (the order alternating per round), each as the trainer does it:
    pause the engine, move and load the weights, resume it. Warm-up rounds are not kept."""
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for index in range(args.warmup + args.repeats):
        for name in names if index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            await paths[name]()
            if index >= args.warmup:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def _via_get_weights(policy: Any, engine: Any) -> SyncPath:
    """The default sync: ``policy.get_weights()`` (through the driver), loaded into the paused engine."""
    from skyrl_train.inference.weight_sync import sync_weights

    return lambda: sync_weights(policy.get_weights(), engine)


def _by_broadcast(policy: Any, engines: Any) -> SyncPath:
    """The sync of a run on Ray workers: rank 0 broadcasts straight to the paused engines."""
    from skyrl_train.inference.broadcast_sync import BroadcastSync

    broadcast = BroadcastSync(policy, engines)

    async def sync() -> None:
        await engines.pause()
        try:
            await broadcast.push()
        finally:
            await engines.resume()

    return sync


def step_prompts(model: Path, data: Path, prompts: int, samples: int) -> list[list[int]]:
    """One step's prompt token ids (chat template applied), each repeated ``samples`` times."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()][:prompts]
    out = []
    for row in rows:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        out += [list(tokenizer(text, add_special_tokens=False)["input_ids"])] * samples
    return out


async def _generation_rounds(engines: dict[str, Any], prompts: list[list[int]], args: argparse.Namespace) -> Any:
    """Tokens/s of one step's generation per engine, the engines alternating call by call."""
    from skyrl_train.inference.base import SamplingParams

    rates: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for index in range(args.warmup + args.repeats):
        params = SamplingParams(max_tokens=args.max_new_tokens, temperature=1.0, seed=1000 * index)
        for name in names if index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            outputs = await engines[name].generate(prompts, params)
            seconds = time.perf_counter() - start
            if index >= args.warmup:
                rates[name].append(sum(len(o.token_ids) for o in outputs) / seconds)
    return rates


def components_task(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from skyrl_train.backends import BackendConfig, TorchBackend
    from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig
    from skyrl_train.compute_thread import ComputeThread
    from skyrl_train.inference.local import LocalEngine
    from skyrl_train.inference.ray_engines import EngineGroup

    cpus = args.cpus_per_worker
    # The parent's cluster (RAY_ADDRESS) has room for the rank and the engine actor at `cpus` each, so each runs
    # `cpus` torch threads; run alone, this worker starts a local cluster of that size.
    joining = "RAY_ADDRESS" in os.environ
    ray.init(
        num_cpus=None if joining else math.ceil(2 * cpus),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    backend_config = BackendConfig(model_path=str(args.model), remove_padding=False, gradient_checkpointing=False)
    started = time.perf_counter()
    compute = ComputeThread()  # shared by the in-process backend and engine, as in a run (skyrl_train.run)
    in_process = TorchBackend(backend_config, compute)
    group = FSDPBackend(backend_config, WorkerGroupConfig(num_workers=1, num_cpus_per_worker=cpus))
    local = LocalEngine.from_pretrained(args.model, compute=compute, seed=0)
    actor = EngineGroup("local", str(args.model), 1, options={"seed": 0}, num_cpus_per_engine=cpus)
    setup_s = time.perf_counter() - started
    prompts = step_prompts(args.model, args.train_data, args.prompts, args.samples)
    # One broadcast path only: rank 0 is in one broadcast group at a time, and a second path would form its group
    # again on every switch. The run's own sync (broadcast to the engine in the driver) is measured in the runs.
    paths = {
        "torch_to_local": _via_get_weights(in_process, local),
        "fsdp_to_local": _via_get_weights(group, local),
        "fsdp_to_actor": _via_get_weights(group, actor),
        "fsdp_broadcast_to_actor": _by_broadcast(group, actor),
        "torch_to_actor": _via_get_weights(in_process, actor),
    }

    async def main() -> dict[str, Any]:
        try:
            rates = await _generation_rounds({"local": local, "actor": actor}, prompts, args)
            syncs = await _sync_rounds(paths, args)
        finally:
            await local.close()
            await actor.close()
        return {"generation_tokens_per_s": rates, "sync_s": syncs}

    try:
        report = asyncio.run(main())
    finally:
        group.close()
        compute.close()
        ray.shutdown()
    report.update(setup_s=setup_s, sequences=len(prompts))
    return report


# --- main ---------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=("run", "components"), required=True)
    parser.add_argument("--backend", choices=("torch", "fsdp"), default="torch", help="run task: where the policy is")
    parser.add_argument("--cpus-per-worker", type=float, default=2.0, help="run task, fsdp: the rank's Ray CPUs")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--train-data", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12, help="components task: generation length")
    parser.add_argument("--steps", type=int, default=6, help="run task: timed steps")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="components task: timed syncs and generate calls")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = run_task(args, Lockstep()) if args.task == "run" else components_task(args)
    report["python"] = sys.executable
    print("@report " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
