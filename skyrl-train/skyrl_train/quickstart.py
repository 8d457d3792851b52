"""The job behind ``make quickstart``: everything runs locally on CPU and nothing is downloaded.

Today it exercises the pieces that exist end to end: it builds the deterministic tiny model, asks it generated
arithmetic questions through its chat template, samples answers with the local torch model, and scores each
answer with the gsm8k reward of ``skyrl_gym``. The run's summary is printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_OUT = Path(".cache/quickstart")


@dataclass(frozen=True)
class QuickstartConfig:
    """Settings of the quickstart job."""

    out_dir: Path = DEFAULT_OUT  # where the tiny model and the summary are written
    seed: int = 0  # seeds the model weights, the problems and sampling
    problems: int = 16  # generated "a + b" questions
    max_new_tokens: int = 24  # sampled tokens per answer
    temperature: float = 1.0


@dataclass(frozen=True)
class Sample:
    """One question, the model's answer and its reward."""

    question: str
    answer: str
    ground_truth: str
    reward: float


def make_problems(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` addition questions with their ground-truth answers, asking for the gsm8k ``#### N`` format."""
    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        a, b = rng.randrange(100), rng.randrange(10)
        problems.append((f"What is {a} + {b}? End with '#### <answer>'.", str(a + b)))
    return problems


def run(config: QuickstartConfig) -> list[Sample]:
    """Build the model, sample one answer per problem and score it; return the scored samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from skyrl_gym.envs.gsm8k.utils import compute_score
    from skyrl_train.models.tiny import build_tiny_model

    model_dir = build_tiny_model(config.out_dir / "tiny-model", seed=config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(config.seed)
    samples = []
    for question, truth in make_problems(config.problems, config.seed):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        inputs = tokenizer(text, add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(
                **inputs,
                do_sample=True,
                temperature=config.temperature,
                max_new_tokens=config.max_new_tokens,
            )
        answer = str(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
        samples.append(Sample(question, answer, truth, float(compute_score(answer, truth))))
    return samples


def summarize(samples: Sequence[Sample], seconds: float) -> dict[str, object]:
    """The run's summary: counts, mean reward, wall time and the first few samples."""
    return {
        "problems": len(samples),
        "mean_reward": sum(s.reward for s in samples) / max(len(samples), 1),
        "seconds": round(seconds, 2),
        "examples": [asdict(s) for s in samples[:3]],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the quickstart job from the command line."""
    parser = argparse.ArgumentParser(prog="python -m skyrl_train.quickstart", description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--problems", type=int, default=16)
    args = parser.parse_args(argv)
    config = QuickstartConfig(out_dir=args.out_dir, seed=args.seed, problems=args.problems)
    start = time.monotonic()
    print(f"quickstart: tiny model in {config.out_dir / 'tiny-model'}, {config.problems} problems", flush=True)
    samples = run(config)
    summary = summarize(samples, time.monotonic() - start)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    (config.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    for sample in samples[:3]:
        print(f"  Q: {sample.question}\n  A: {sample.answer!r}  reward={sample.reward}")
    print(
        f"quickstart: mean reward {summary['mean_reward']:.3f} over {len(samples)} problems "
        f"in {summary['seconds']} s; summary in {config.out_dir / 'summary.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
