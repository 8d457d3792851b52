"""A harness that rewrites its context, trained: skyrl-train's loop over ``HarnessGenerator`` step-wise rows.

The oracle engine answers (so rewards are the hidden tests' verdicts); the tiny policy trains on the recorded rows.
A sample of each prompt that skips the fix fails its tests, so every group has reward variance and each row's
advantage says which episode it came from.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai", reason="the openai SDK is not installed (the dev group)")
pytest.importorskip("skyrl_train.gateway", reason="the gateway lives in skyrl-train, which is not installed")

from transformers import AutoTokenizer

from skyrl_agent.harness.base import HarnessJob, HarnessResult
from skyrl_agent.integrations.harness import HarnessGenerator, OracleEngine
from skyrl_agent.integrations.skyrl_train import AgentGeneratorConfig
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import load_suite
from skyrl_train.algorithms import PolicyLossConfig
from skyrl_train.backends import BackendConfig, LossFn, TorchBackend, TrainingBatch
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.generators.chat import ChatEncoder
from skyrl_train.inference.base import SamplingParams
from skyrl_train.models.tiny import TinyModelSpec, build_tiny_model
from skyrl_train.objective import Objective
from skyrl_train.trainer import LoopSettings, Trainer


class SplittingHarness:
    """Two model calls per episode, the second on a rewritten context (so two samples); sample 1 of each prompt
    does not run the fix the first reply holds, so it fails its tests."""

    name = "splitting"

    def __call__(self, job: HarnessJob) -> HarnessResult:
        from openai import OpenAI

        client = OpenAI(base_url=job.endpoint.base_url, api_key=job.endpoint.api_key, max_retries=0)
        task = {"role": "user", "content": job.problem_statement}
        action = client.chat.completions.create(model=job.endpoint.model, messages=[task]).choices[0].message.content
        if not job.episode_id.endswith(":1"):
            job.shell.run((action or "").split("```mswea_bash_command\n", 1)[1].rsplit("```", 1)[0])
        summary = {"role": "user", "content": f"{job.problem_statement}\n\nSo far:\n{action}"}
        client.chat.completions.create(model=job.endpoint.model, messages=[summary])
        return HarnessResult("Submitted", submitted=True)


def test_every_sample_of_a_split_episode_trains_with_the_episodes_advantage(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny", spec=TinyModelSpec(max_position_embeddings=4096))
    tasks = load_suite()[:2]
    policy = TorchBackend(BackendConfig(str(model), gradient_checkpointing=False, micro_train_batch_size=3))
    trained: list[TrainingBatch] = []
    forward_backward = policy.forward_backward

    def recording(batch: TrainingBatch, loss_fn: LossFn, **kwargs: Any) -> dict[str, float]:
        trained.append(batch)
        return forward_backward(batch, loss_fn, **kwargs)

    policy.forward_backward = recording  # type: ignore[method-assign]
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.model_max_length = 1 << 20
    generator = HarnessGenerator(
        ProcessBackend(), ChatEncoder(tokenizer), engine=OracleEngine(tokenizer, tasks), tokenizer=tokenizer,
        harness=SplittingHarness(), config=AgentGeneratorConfig(max_turns=4, max_input_length=4096),
    )  # fmt: skip
    trainer = Trainer(
        settings=LoopSettings(n_samples_per_prompt=2, policy_mini_batch_size=2),
        objective=Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig()),
        policy=policy,
        engine=generator.engine,
        generator=generator,
        sampling_params=SamplingParams(max_tokens=1024, logprobs=True),
        eval_sampling_params=SamplingParams(max_tokens=1024),
        pad_token_id=int(tokenizer.pad_token_id),
    )
    prompts = [PromptRecord([], "swe", {"task": task}, task.id) for task in tasks]

    async def step() -> dict[str, float]:
        try:
            return await trainer.train_step(prompts)
        finally:
            await generator.close()

    metrics = asyncio.run(step())
    assert metrics["harness/rows"] == 8.0  # four episodes of two samples each
    assert metrics["generate/num_trajectories"] == 4.0
    assert metrics["reward/mean"] == 0.5  # per episode: sample 0 of each prompt resolved, sample 1 not
    assert metrics["policy/optimizer_steps"] == 1.0
    (batch,) = trained  # one mini-batch of both groups; 8 rows in micro-batches of 3, 3 and 2
    advantages = [float(row[mask.bool()].mean()) for row, mask in zip(
        batch.tensors["advantages"], batch.response_mask, strict=True
    )]  # fmt: skip
    a = 1 / 2**0.5  # GRPO over two episodes with rewards 1 and 0
    assert advantages == pytest.approx([a, a, -a, -a, a, a, -a, -a], abs=1e-4)
