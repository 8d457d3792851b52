"""One side of ``benchmarks/train_bench.py``, run in a fresh interpreter of the venv under test.

Tasks:

- ``--impl ours --task train``: skyrl-train's GRPO step, built through ``skyrl_train.run._Session`` (the same
  wiring as the ``skyrl-train`` CLI: TorchBackend, LocalEngine, SkyRLGymGenerator, Trainer); times
  ``trainer.train_step``.
- ``--impl trl --task train``: TRL's ``GRPOTrainer`` on the same model, prompts and reward; times each optimizer
  step from ``on_step_begin`` to ``on_step_end`` of a ``TrainerCallback``.
- ``--impl ours --task engine --engine local|vllm``: one ``generate`` of the same 64 sequences × 64 tokens per step,
  then ``sync_weights`` of a policy backend into the engine (vLLM: the in-process CPU engine, ``direct`` transport).

Lockstep protocol, so that the parent can alternate implementations step by step (a shared machine's load then hits
both alike): before every step (warm-up ones included) the worker prints ``@ready`` and waits for a ``go`` line on
stdin; after the step it prints ``@step {json}`` (wall and CPU seconds, …). After the last step it prints
``@report {json}`` and exits. Other stdout lines (libraries print there) are ignored by the parent. Only the
standard library is imported at module level, so the same file runs in every venv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _machine import Lockstep

_STRICT_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k_reward(text: str, answer: str) -> float:
    """skyrl-gym's gsm8k rule (strict ``#### N`` match, 1.0 or 0.0), copied so the TRL venv needs no skyrl_gym."""
    match = _STRICT_ANSWER.search(text)
    if match is None:
        return 0.0
    return 1.0 if match.group(1).replace(",", "").replace("$", "") == answer else 0.0


def load_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class StepClock:
    """Wall and process-CPU seconds of one step (CPU counts every thread of the process)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict[str, float]:
        return {"wall_s": time.perf_counter() - self.wall, "cpu_s": time.process_time() - self.cpu}


def timed_records(records: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    return records[warmup:]


# --- ours: training steps -----------------------------------------------------------------------------------------


def ours_overrides(args: argparse.Namespace) -> list[str]:
    """The run config of our side (everything else at its default)."""
    rows = args.prompts * args.samples
    return [
        f"model.path={args.model}",
        "model.gradient_checkpointing=false",
        "trainer.remove_padding=false",  # padded micro-batches: packing's block-diagonal mask is slower on a CPU
        f"data.train_data=[{args.data}]",
        "data.seed=0",
        "trainer.seed=0",
        f"trainer.run_dir={args.run_dir}",
        f"trainer.train_batch_size={args.prompts}",
        f"trainer.policy_mini_batch_size={args.prompts}",  # one optimizer step per training step
        f"trainer.micro_train_batch_size={rows}",
        f"trainer.micro_forward_batch_size={rows}",
        f"trainer.max_training_steps={args.warmup + args.steps}",
        "trainer.eval_before_train=false",
        "trainer.eval_interval=0",
        "trainer.ckpt_interval=0",
        "trainer.resume_mode=none",
        "trainer.logger=[jsonl]",
        f"generator.n_samples_per_prompt={args.samples}",
        f"generator.max_generate_length={args.max_new_tokens}",
        "generator.temperature=1.0",
        "generator.batched=true",
        "algorithm.advantage_estimator=grpo",
        "optim.lr=1e-6",
        "optim.scheduler=constant",
        "environment.env_class=gsm8k",
    ]


def ours_train(args: argparse.Namespace, lockstep: Lockstep) -> dict[str, Any]:
    import skyrl_train
    from skyrl_train.config import load_config, resolve, validate
    from skyrl_train.run import _Session

    config = resolve(load_config(None, ours_overrides(args)))
    validate(config)

    async def main() -> dict[str, Any]:
        session = await _Session.open(config)
        trainer = session.trainer
        generate = trainer.generator.generate
        lengths: list[int] = []

        async def counting_generate(batch: Any) -> Any:
            output = await generate(batch)
            lengths[:] = [len(r) for r in output.response_ids]
            return output

        trainer.generator.generate = counting_generate  # type: ignore[method-assign]
        records: list[dict[str, Any]] = []
        batches = session.loader.stream()
        try:
            for index in range(args.warmup + args.steps):
                prompts = next(batches)
                lockstep.wait()
                clock = StepClock()
                metrics = await trainer.train_step(prompts)
                record = clock.read()
                record["breakdown_s"] = {k: v for k, v in metrics.items() if k.startswith("timing/")}
                record["tokens"] = sum(lengths)
                record["completions"] = len(lengths)
                records.append(record)
                lockstep.done(record)
                print(f"ours step {index + 1}: {record['wall_s']:.2f} s", file=sys.stderr, flush=True)
        finally:
            await session.close()
        timed = timed_records(records, args.warmup)
        keys = sorted(timed[0]["breakdown_s"]) if timed else []
        return {
            "impl": "ours",
            "task": "train",
            "version": getattr(skyrl_train, "__version__", "dev"),
            "skyrl_train_file": skyrl_train.__file__,
            "steps": records,
            "step_s": [r["wall_s"] for r in timed],
            "median_step_s": statistics.median(r["wall_s"] for r in timed),
            "median_cpu_s": statistics.median(r["cpu_s"] for r in timed),
            "breakdown_median_s": {k: statistics.median(r["breakdown_s"][k] for r in timed) for k in keys},
            "completions_per_step": timed[0]["completions"] if timed else 0,
            "mean_completion_tokens": statistics.mean(r["tokens"] / r["completions"] for r in timed),
            "gen_tokens_per_s": statistics.median(r["tokens"] / r["breakdown_s"]["timing/generate_s"] for r in timed),
            "torch_threads": _torch_threads(),
        }

    return asyncio.run(main())


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# --- ours: engines ------------------------------------------------------------------------------------------------


def ours_engine(args: argparse.Namespace, lockstep: Lockstep) -> dict[str, Any]:
    """Generation throughput and weight-sync time of one engine, one lockstep step per generate call."""
    from transformers import AutoTokenizer

    from skyrl_train.backends import BackendConfig, TorchBackend
    from skyrl_train.inference.base import SamplingParams
    from skyrl_train.inference.factory import create_engine
    from skyrl_train.inference.weight_sync import sync_weights

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = []
    for row in load_rows(args.data)[: args.prompts]:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        prompts += [ids] * args.samples
    backend = TorchBackend(BackendConfig(model_path=str(args.model), seed=0))
    report: dict[str, Any] = {"impl": "ours", "task": "engine", "engine": args.engine, "sequences": len(prompts)}

    async def main() -> dict[str, Any]:
        started = time.perf_counter()
        if args.engine == "local":
            engine = create_engine("local", args.model, seed=0)
        else:
            engine = create_engine(
                "vllm", args.model, seed=0, max_model_len=512, weight_transport="direct", kv_cache_memory_bytes=1 << 30
            )
            await engine.wait_ready()  # type: ignore[attr-defined]
        report["start_s"] = time.perf_counter() - started
        records: list[dict[str, Any]] = []
        try:
            for index in range(args.warmup + args.steps):
                params = SamplingParams(max_tokens=args.max_new_tokens, temperature=1.0, seed=1000 * index)
                lockstep.wait()
                clock = StepClock()
                outputs = await engine.generate(prompts, params)
                record = clock.read()
                record["tokens"] = sum(len(o.token_ids) for o in outputs)
                record["sync_s"] = await sync_weights(backend, engine)
                records.append(record)
                lockstep.done(record)
        finally:
            await engine.close()
        timed = timed_records(records, args.warmup)
        result = {
            "steps": records,
            "gen_tokens_per_s": statistics.median(r["tokens"] / r["wall_s"] for r in timed),
            "gen_tokens_per_cpu_s": statistics.median(r["tokens"] / r["cpu_s"] for r in timed),
            "mean_completion_tokens": statistics.mean(r["tokens"] / len(prompts) for r in timed),
            "weight_sync_s": statistics.median(r["sync_s"] for r in timed),
        }
        if args.engine == "vllm":
            import vllm

            result.update(transport=engine.weight_transport, version=vllm.__version__)  # type: ignore[attr-defined]
        return result

    report.update(asyncio.run(main()))
    return report


# --- TRL ----------------------------------------------------------------------------------------------------------


def trl_train(args: argparse.Namespace, lockstep: Lockstep) -> dict[str, Any]:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    rows = load_rows(args.data)[: args.prompts]
    dataset = Dataset.from_list(
        [{"prompt": row["prompt"], "answer": row["reward_spec"]["ground_truth"]} for row in rows]
    )

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [gsm8k_reward(t, a) for t, a in zip(texts, answer, strict=True)]

    total = args.warmup + args.steps
    n_completions = args.prompts * args.samples
    config = GRPOConfig(
        output_dir=str(args.run_dir),
        per_device_train_batch_size=n_completions,  # completions per device batch: the whole step
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,  # one update per generation batch (TRL then skips its old-log-prob forward)
        num_generations=args.samples,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        beta=0.0,  # no reference model (ours: no KL term either)
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        max_steps=total,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    records: list[dict[str, Any]] = []
    gen_s: list[float] = []
    lengths: list[float] = []

    class Lockstepped(TrainerCallback):
        def __init__(self) -> None:
            self._clock: StepClock | None = None

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            lockstep.wait()
            self._clock = StepClock()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            assert self._clock is not None
            record: dict[str, Any] = self._clock.read()
            record["generate_s"] = gen_s[-1] if len(gen_s) == len(records) + 1 else None
            records.append(record)
            lockstep.done(record)
            print(f"trl step {len(records)}/{total}: {record['wall_s']:.2f} s", file=sys.stderr, flush=True)

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict[str, Any] | None = None, **__: Any) -> None:
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Lockstepped()],
    )
    trainer.model.generate = _timed(trainer.model.generate, gen_s)  # type: ignore[method-assign]
    trainer.train()
    timed = timed_records(records, args.warmup)
    timed_lengths = lengths[args.warmup :]
    report: dict[str, Any] = {
        "impl": "trl",
        "task": "train",
        "version": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "steps": records,
        "step_s": [r["wall_s"] for r in timed],
        "median_step_s": statistics.median(r["wall_s"] for r in timed),
        "median_cpu_s": statistics.median(r["cpu_s"] for r in timed),
        "completions_per_step": n_completions,
        "mean_completion_tokens": statistics.mean(timed_lengths) if timed_lengths else None,
        "generate_calls": len(gen_s),
        "torch_threads": torch.get_num_threads(),
    }
    generate_s = [r["generate_s"] for r in timed]
    if timed_lengths and all(s is not None for s in generate_s) and len(timed_lengths) == len(generate_s):
        report["breakdown_median_s"] = {"timing/generate_s": statistics.median(generate_s)}
        report["gen_tokens_per_s"] = statistics.median(
            n_completions * length / s for length, s in zip(timed_lengths, generate_s, strict=True)
        )
    return report


def _timed(fn: Callable[..., Any], seconds: list[float]) -> Callable[..., Any]:
    def timed(*a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        out = fn(*a, **kw)
        seconds.append(time.perf_counter() - start)
        return out

    return timed


# --- main ---------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=("ours", "trl"), required=True)
    parser.add_argument("--task", choices=("train", "engine"), required=True)
    parser.add_argument("--engine", choices=("local", "vllm"), default="local", help="engine task: which engine")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="timed steps (engine task: generate calls)")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    lockstep = Lockstep()
    if args.impl == "trl":
        report = trl_train(args, lockstep)
    elif args.task == "train":
        report = ours_train(args, lockstep)
    else:
        report = ours_engine(args, lockstep)
    report["python"] = sys.executable
    print("@report " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
