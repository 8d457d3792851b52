"""The job behind ``make quickstart``: teach the tiny model addition with GRPO, on two CPU cores, offline.

1. **Model.** Build the deterministic tiny Qwen2 model (:mod:`skyrl_train.models.tiny`) from the seed.
2. **Task.** "What is x + y?" for x in 0–99, y in 0–9, answered gsm8k-style as ``#### z``; 200 problems are held
   out for evaluation, the other 800 are training prompts. Rewards come from skyrl-gym's ``gsm8k`` env.
3. **SFT warm start.** Supervised steps on correct answers until the held-out accuracy (greedy) first reaches
   ``sft_target_accuracy`` with well-formed answers, so RL starts from a policy that sometimes succeeds.
4. **GRPO.** The regular training entry point (:func:`skyrl_train.run.run`) with the run config written to
   ``{run_dir}/rl/config.yaml``: 32 prompts × 8 samples per step, PPO clip, no KL, zero-variance groups masked,
   evaluation every ``eval_interval`` steps.

Everything lands in ``run_dir`` (default ``runs/quickstart``): the SFT model, the RL run (metrics, TensorBoard,
``metrics.png``, checkpoints, the Hugging Face export) and ``summary.json`` with ``eval_reward_before_rl``,
``eval_reward_after_rl``, ``wall_seconds`` and the paths written. Same seed, same machine: same numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

DEFAULT_RUN_DIR = Path("runs/quickstart")
DATA_SOURCE = "quickstart_addition"


@dataclass(frozen=True)
class QuickstartConfig:
    """Settings of the quickstart job (the defaults are the embedded default run)."""

    run_dir: Path = DEFAULT_RUN_DIR  # everything the job writes
    seed: int = 0  # model weights, data split, sampling
    eval_problems: int = 200  # held-out problems
    sft_batch_size: int = 32
    sft_lr: float = 1e-3
    sft_warmup_steps: int = 50
    sft_eval_every: int = 10  # SFT steps between held-out evaluations (accuracy can jump within 50 steps)
    sft_max_steps: int = 800  # give up warming up after this many steps
    sft_target_accuracy: float = 0.2  # stop SFT once greedy held-out accuracy reaches this …
    sft_target_format: float = 0.9  # … and this fraction of answers is well formed
    rl_steps: int = 200  # GRPO steps (≈2.5 s each on 2 cores)
    rl_prompts_per_step: int = 32
    rl_samples_per_prompt: int = 8
    rl_lr: float = 1e-4
    eval_interval: int = 25  # GRPO steps between evaluations


@dataclass(frozen=True)
class Problem:
    """One addition problem."""

    question: str
    answer: str

    def row(self) -> dict[str, Any]:
        """The dataset row (trainer format) of this problem."""
        return {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": self.question}],
            "env_class": "gsm8k",
            "reward_spec": {"method": "rule", "ground_truth": self.answer},
            "extra_info": {},
        }


def make_problems(seed: int, eval_problems: int) -> tuple[list[Problem], list[Problem]]:
    """All 1,000 problems split into (train, held-out eval), shuffled by ``seed``."""
    problems = [Problem(f"What is {x} + {y}?", str(x + y)) for x in range(100) for y in range(10)]
    random.Random(seed).shuffle(problems)
    return problems[eval_problems:], problems[:eval_problems]


def write_rows(problems: Sequence[Problem], path: Path) -> Path:
    """Write ``problems`` as a JSONL dataset."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p.row()) + "\n" for p in problems))
    return path


# --------------------------------------------------------------------------------------------- SFT warm start


class _Tokens:
    """Prompt and answer token ids of problems under the model's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def prompt(self, problem: Problem) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": problem.question}], add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def answer(self, problem: Problem) -> list[int]:
        ids = self.tokenizer(f"#### {problem.answer}", add_special_tokens=False)["input_ids"]
        return [*ids, int(self.tokenizer.eos_token_id)]


async def greedy_accuracy(engine: Any, tokens: _Tokens, problems: Sequence[Problem]) -> tuple[float, float]:
    """``(accuracy, well-formed fraction)`` of greedy answers, scored by the gsm8k reward."""
    from skyrl_gym.envs.gsm8k.utils import compute_score, extract_solution
    from skyrl_train.inference.base import SamplingParams

    outputs = await engine.generate(
        [tokens.prompt(p) for p in problems], SamplingParams(max_tokens=12, temperature=0.0)
    )
    texts = [tokens.tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outputs]
    correct = sum(float(compute_score(t, p.answer)) for t, p in zip(texts, problems, strict=True))
    formed = sum(extract_solution(t) is not None for t in texts)
    return correct / len(problems), formed / len(problems)


async def sft_warm_start(
    config: QuickstartConfig, base: Path, train: list[Problem], held_out: list[Problem]
) -> dict[str, Any]:
    """Supervised steps until the target accuracy; exports the model to ``{run_dir}/sft-model``."""
    from transformers import AutoTokenizer

    from skyrl_train.algorithms import PolicyLossConfig, get_policy_loss
    from skyrl_train.backends import BackendConfig, OptimizerConfig, TorchBackend
    from skyrl_train.batch import collate
    from skyrl_train.inference.local import LocalEngine

    tokens = _Tokens(AutoTokenizer.from_pretrained(base))
    backend = TorchBackend(
        BackendConfig(
            model_path=str(base),
            micro_train_batch_size=config.sft_batch_size,
            remove_padding=False,
            gradient_checkpointing=False,
            seed=config.seed,
            optimizer=OptimizerConfig(lr=config.sft_lr, num_warmup_steps=config.sft_warmup_steps),
        )
    )
    engine = LocalEngine.from_pretrained(base, seed=config.seed)
    loss = get_policy_loss("cross_entropy")
    loss_config = PolicyLossConfig()
    rng = random.Random(config.seed)
    history: list[dict[str, float]] = []
    step = 0
    try:
        while step < config.sft_max_steps:
            batch_problems = rng.sample(train, config.sft_batch_size)
            batch = collate(
                [tokens.prompt(p) for p in batch_problems],
                [tokens.answer(p) for p in batch_problems],
                pad_token_id=int(tokens.tokenizer.pad_token_id),
            )
            batch.tensors.update(old_log_probs=torch.zeros_like(batch.response_mask))
            batch.tensors.update(advantages=torch.zeros_like(batch.response_mask))
            backend.forward_backward(
                batch,
                lambda out, mb: loss(
                    out.log_probs, mb.tensors["old_log_probs"], mb.tensors["advantages"], mb.response_mask, loss_config
                ),
            )
            backend.optim_step()
            step += 1
            if step % config.sft_eval_every == 0:
                await engine.update_weights(backend.get_weights())
                accuracy, formed = await greedy_accuracy(engine, tokens, held_out)
                history.append({"step": step, "accuracy": accuracy, "well_formed": formed})
                print(f"sft: step {step} held-out accuracy {accuracy:.3f}, well-formed {formed:.3f}", flush=True)
                if accuracy >= config.sft_target_accuracy and formed >= config.sft_target_format:
                    break
    finally:
        await engine.close()
    out = config.run_dir / "sft-model"
    backend.export_hf(out, base)
    return {"steps": step, "history": history, "model": str(out)}


# --------------------------------------------------------------------------------------------------- GRPO


def rl_config(config: QuickstartConfig, model: Path, train_file: Path, eval_file: Path) -> Any:
    """The run config of the GRPO phase (what ``skyrl-train`` would read from a YAML file)."""
    from skyrl_train.config import load_config

    n = config.rl_samples_per_prompt
    return load_config(
        None,
        [
            f"model.path={model}",
            "model.gradient_checkpointing=false",
            # Padded micro-batches: packing builds an N×N attention mask on CPU, slower for short rows.
            "trainer.remove_padding=false",
            f"data.train_data=[{train_file}]",
            f"data.val_data=[{eval_file}]",
            f"data.seed={config.seed}",
            f"trainer.seed={config.seed}",
            f"trainer.run_dir={config.run_dir / 'rl'}",
            f"trainer.train_batch_size={config.rl_prompts_per_step}",
            f"trainer.policy_mini_batch_size={config.rl_prompts_per_step}",
            f"trainer.micro_train_batch_size={config.rl_prompts_per_step * n}",
            f"trainer.micro_forward_batch_size={config.rl_prompts_per_step * n}",
            f"trainer.max_training_steps={config.rl_steps}",
            f"trainer.eval_interval={config.eval_interval}",
            "trainer.ckpt_interval=0",
            "trainer.resume_mode=none",
            "trainer.logger=[console,jsonl,tensorboard]",
            f"generator.n_samples_per_prompt={n}",
            "generator.max_generate_length=12",
            "generator.temperature=1.0",
            "generator.batched=true",
            "algorithm.advantage_estimator=grpo",
            "algorithm.zero_variance_filter=true",
            f"optim.lr={config.rl_lr}",
            "optim.adam_betas=[0.9,0.99]",
            "optim.weight_decay=0.0",
            "optim.scheduler=constant",
            "environment.env_class=gsm8k",
        ],
    )


def run(config: QuickstartConfig) -> dict[str, Any]:
    """The whole job; returns (and writes) the summary."""
    from skyrl_train import run as training
    from skyrl_train.models.tiny import build_tiny_model

    started = time.monotonic()
    torch.manual_seed(config.seed)
    base = build_tiny_model(config.run_dir / "base-model", seed=config.seed)
    train, held_out = make_problems(config.seed, config.eval_problems)
    train_file = write_rows(train, config.run_dir / "data" / "train.jsonl")
    eval_file = write_rows(held_out, config.run_dir / "data" / "eval.jsonl")
    sft = asyncio.run(sft_warm_start(config, base, train, held_out))
    rl_started = time.monotonic()
    result = training.run(rl_config(config, Path(sft["model"]), train_file, eval_file), echo_config=False)
    history = [(step, m["eval/all/reward_mean"]) for step, m in result.eval_history]
    summary = {
        "eval_reward_before_rl": history[0][1],
        "eval_reward_after_rl": history[-1][1],
        "eval_history": history,
        "rl_steps": result.global_step,
        "rl_seconds": round(time.monotonic() - rl_started, 1),
        "sft": sft,
        "wall_seconds": round(time.monotonic() - started, 1),
        "paths": {
            "run_dir": str(config.run_dir),
            "sft_model": sft["model"],
            "rl_run": str(result.run_dir),
            "checkpoint": str(result.checkpoint),
            "export": str(result.export),
            "plot": str(result.plot),
            "metrics": str(result.run_dir / "metrics.jsonl"),
        },
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
    }
    (config.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Run the quickstart from the command line."""
    parser = argparse.ArgumentParser(prog="python -m skyrl_train.quickstart", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rl-steps", type=int, default=QuickstartConfig.rl_steps)
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run that only checks the wiring")
    args = parser.parse_args(argv)
    config = QuickstartConfig(run_dir=args.run_dir, seed=args.seed, rl_steps=args.rl_steps)
    if args.smoke:
        config = replace(
            config,
            sft_max_steps=4,
            sft_eval_every=2,
            rl_steps=2,
            rl_prompts_per_step=4,
            rl_samples_per_prompt=2,
            eval_interval=1,
            eval_problems=8,
        )
    summary = run(config)
    print(
        f"quickstart: held-out reward {summary['eval_reward_before_rl']:.3f} before RL -> "
        f"{summary['eval_reward_after_rl']:.3f} after {summary['rl_steps']} GRPO steps "
        f"({summary['rl_seconds']} s of RL, {summary['wall_seconds']} s in all)"
    )
    print(f"quickstart: summary in {config.run_dir / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
