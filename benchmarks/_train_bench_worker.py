"""One measurement of ``benchmarks/train_bench.py``, run in a fresh interpreter of the venv under test.

Tasks:

- ``--impl ours --task train``: skyrl-train's GRPO step, built through ``skyrl_train.run._Session`` (the same
  wiring as the ``skyrl-train`` CLI: TorchBackend, LocalEngine, SkyRLGymGenerator, Trainer); times
  ``trainer.train_step``.
- ``--impl ours --task engines``: generation throughput of the local engine and the vLLM engine (in-process CPU
  engine) on the same 64 sequences × 64 tokens, and the weight-sync time into each (vLLM: ``direct`` transport).
- ``--impl trl --task train``: TRL's ``GRPOTrainer`` on the same model, prompts and reward; times each step with a
  ``TrainerCallback``.

The last line of stdout is the JSON report. Only the standard library is imported at module level, so the same
file runs in both venvs.
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
from pathlib import Path
from typing import Any

_STRICT_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k_reward(text: str, answer: str) -> float:
    """skyrl-gym's gsm8k rule (strict ``#### N`` match, 1.0 or 0.0), copied so the TRL venv needs no skyrl_gym."""
    match = _STRICT_ANSWER.search(text)
    if match is None:
        return 0.0
    return 1.0 if match.group(1).replace(",", "").replace("$", "") == answer else 0.0


def load_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- ours: training steps -----------------------------------------------------------------------------------------


def ours_train(args: argparse.Namespace) -> dict[str, Any]:
    import skyrl_train
    from skyrl_train.config import load_config, resolve, validate
    from skyrl_train.run import _Session

    total = args.warmup + args.steps
    config = load_config(
        None,
        [
            f"model.path={args.model}",
            "model.gradient_checkpointing=false",
            "trainer.remove_padding=false",  # padded micro-batches (what the quickstart uses on CPU)
            f"data.train_data=[{args.data}]",
            "data.seed=0",
            "trainer.seed=0",
            f"trainer.run_dir={args.run_dir}",
            f"trainer.train_batch_size={args.prompts}",
            f"trainer.policy_mini_batch_size={args.prompts}",  # one optimizer step per training step
            f"trainer.micro_train_batch_size={args.prompts * args.samples}",
            f"trainer.micro_forward_batch_size={args.prompts * args.samples}",
            f"trainer.max_training_steps={total}",
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
        ],
    )
    config = resolve(config)
    validate(config)

    async def main() -> dict[str, Any]:
        session = await _Session.open(config)
        trainer = session.trainer
        generate = trainer.generator.generate
        lengths: list[list[int]] = []

        async def counting_generate(batch: Any) -> Any:
            output = await generate(batch)
            lengths.append([len(r) for r in output.response_ids])
            return output

        trainer.generator.generate = counting_generate  # type: ignore[method-assign]
        step_s: list[float] = []
        breakdown: list[dict[str, float]] = []
        batches = session.loader.stream()
        try:
            for index in range(total):
                prompts = next(batches)
                start = time.perf_counter()
                metrics = await trainer.train_step(prompts)
                elapsed = time.perf_counter() - start
                if index >= args.warmup:
                    step_s.append(elapsed)
                    breakdown.append({k: v for k, v in metrics.items() if k.startswith("timing/")})
                print(f"ours step {index + 1}/{total}: {elapsed:.2f} s", file=sys.stderr, flush=True)
        finally:
            await session.close()
        timed_lengths = lengths[args.warmup :]
        tokens = [sum(x) for x in timed_lengths]
        gen_s = [b["timing/generate_s"] for b in breakdown]
        keys = sorted(breakdown[0]) if breakdown else []
        return {
            "impl": "ours",
            "task": "train",
            "version": getattr(skyrl_train, "__version__", "dev"),
            "skyrl_train_file": skyrl_train.__file__,
            "step_s": step_s,
            "median_step_s": statistics.median(step_s),
            "breakdown_median_s": {k: statistics.median(b[k] for b in breakdown) for k in keys},
            "completions_per_step": len(timed_lengths[0]) if timed_lengths else 0,
            "mean_completion_tokens": statistics.mean(t / len(x) for t, x in zip(tokens, timed_lengths, strict=True)),
            "gen_tokens_per_s": statistics.median(t / s for t, s in zip(tokens, gen_s, strict=True)),
            "torch_threads": _torch_threads(),
        }

    return asyncio.run(main())


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# --- ours: engines ------------------------------------------------------------------------------------------------


def ours_engines(args: argparse.Namespace) -> dict[str, Any]:
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
    report: dict[str, Any] = {"impl": "ours", "task": "engines", "sequences": len(prompts)}

    async def measure(engine: Any) -> dict[str, Any]:
        rates, lengths, syncs = [], [], []
        for index in range(args.warmup + args.repeats):
            params = SamplingParams(max_tokens=args.max_new_tokens, temperature=1.0, seed=1000 * index)
            start = time.perf_counter()
            outputs = await engine.generate(prompts, params)
            elapsed = time.perf_counter() - start
            count = sum(len(o.token_ids) for o in outputs)
            sync = await sync_weights(backend, engine)
            if index >= args.warmup:
                rates.append(count / elapsed)
                lengths.append(count / len(outputs))
                syncs.append(sync)
        return {
            "gen_tokens_per_s": statistics.median(rates),
            "gen_tokens_per_s_all": rates,
            "mean_completion_tokens": statistics.mean(lengths),
            "weight_sync_s": statistics.median(syncs),
            "weight_sync_s_all": syncs,
        }

    async def run_local() -> dict[str, Any]:
        engine = create_engine("local", args.model, seed=0)
        try:
            return await measure(engine)
        finally:
            await engine.close()

    report["local"] = asyncio.run(run_local())
    print(f"local engine: {report['local']}", file=sys.stderr, flush=True)

    try:
        import vllm
    except Exception as exc:
        report["vllm"] = None
        report["vllm_note"] = f"vLLM not importable ({type(exc).__name__}: {exc})"
        return report

    async def run_vllm() -> dict[str, Any]:
        started = time.perf_counter()
        engine = create_engine(
            "vllm",
            args.model,
            seed=0,
            max_model_len=512,
            weight_transport="direct",
            kv_cache_memory_bytes=1 << 30,
        )
        try:
            await engine.wait_ready()  # type: ignore[attr-defined]
            start_s = time.perf_counter() - started
            result = await measure(engine)
            result.update(start_s=start_s, transport=engine.weight_transport, version=vllm.__version__)  # type: ignore[attr-defined]
            return result
        finally:
            await engine.close()

    try:
        report["vllm"] = asyncio.run(run_vllm())
    except Exception as exc:
        report["vllm"] = None
        report["vllm_note"] = f"vLLM engine failed ({type(exc).__name__}: {exc})"
    return report


# --- TRL ----------------------------------------------------------------------------------------------------------


def trl_train(args: argparse.Namespace) -> dict[str, Any]:
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
        num_iterations=1,  # one update per generation batch
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

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.logs: list[dict[str, float]] = []
            self._start = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self._start = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.step_s.append(time.perf_counter() - self._start)
            print(f"trl step {len(self.step_s)}/{total}: {self.step_s[-1]:.2f} s", file=sys.stderr, flush=True)

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict[str, Any] | None = None, **__: Any) -> None:
            if logs and "completions/mean_length" in logs:
                self.logs.append(dict(logs))

    timer = Timer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    generate = trainer.model.generate
    gen_s: list[float] = []

    def timed_generate(*a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        out = generate(*a, **kw)
        gen_s.append(time.perf_counter() - start)
        return out

    trainer.model.generate = timed_generate  # type: ignore[method-assign]
    trainer.train()
    step_s = timer.step_s[args.warmup :]
    logs = timer.logs[args.warmup :]
    lengths = [float(log["completions/mean_length"]) for log in logs]
    timed_gen = gen_s[args.warmup :] if len(gen_s) == total else []
    report: dict[str, Any] = {
        "impl": "trl",
        "task": "train",
        "version": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "step_s": step_s,
        "median_step_s": statistics.median(step_s),
        "completions_per_step": n_completions,
        "mean_completion_tokens": statistics.mean(lengths) if lengths else None,
        "generate_calls": len(gen_s),
        "torch_threads": torch.get_num_threads(),
    }
    if timed_gen and lengths:
        report["breakdown_median_s"] = {"timing/generate_s": statistics.median(timed_gen)}
        report["gen_tokens_per_s"] = statistics.median(
            n_completions * length / s for length, s in zip(lengths, timed_gen, strict=True)
        )
    return report


# --- main ---------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=("ours", "trl"), required=True)
    parser.add_argument("--task", choices=("train", "engines"), required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="engines task: timed generate calls")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.impl == "trl":
        report = trl_train(args)
    elif args.task == "train":
        report = ours_train(args)
    else:
        report = ours_engines(args)
    report["python"] = sys.executable
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
