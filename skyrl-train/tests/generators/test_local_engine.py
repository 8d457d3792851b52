"""The generator with the real local torch engine on the tiny model: the trained ids are the sampled ids."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from skyrl_train.generators import GeneratorInput
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig, SkyRLGymGenerator
from skyrl_train.inference.base import SamplingParams
from skyrl_train.inference.local import LocalEngine


def test_multi_turn_with_local_engine(tiny_model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    engine = LocalEngine.from_pretrained(tiny_model_dir, seed=0)
    n = 4
    batch = GeneratorInput(
        prompts=[[{"role": "user", "content": f"What is {i} + 2? End with #### <number>."}] for i in range(n)],
        env_classes=["gsm8k_multi_turn"] * n,
        env_extras=[{"reward_spec": {"method": "rule", "ground_truth": str(i + 2)}} for i in range(n)],
        trajectory_ids=[f"{i}:0" for i in range(n)],
        sampling_params=SamplingParams(max_tokens=12, temperature=1.0, seed=7),
    )
    generator = SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(max_turns=3, max_input_length=400))

    async def run() -> object:
        try:
            return await generator.generate(batch)
        finally:
            await engine.close()

    out = asyncio.run(run())
    assert isinstance(out.stop_reasons, list)
    assert out.rollout_logprobs is not None
    eot = generator.chat.end_of_turn_token_id
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for i in range(n):
        assert out.stop_reasons[i] in ("stop", "length")
        response, mask, logprobs = out.response_ids[i], out.loss_masks[i], out.rollout_logprobs[i]
        assert len(response) == len(mask) == len(logprobs) == len(out.rewards[i]) > 0
        assert mask[-1] == 1  # the response ends on a generated token
        # A masked segment after a turn that did not sample the end-of-turn token starts with it (added, masked).
        for t in range(1, len(response)):
            if mask[t - 1] == 1 and mask[t] == 0:
                assert response[t - 1] == eot or response[t] == eot
        # The engine's logprobs are the model's log-softmax at the sampled ids (temperature 1, no filters).
        ids = torch.tensor([out.prompt_token_ids[i] + response])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        recomputed = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        start = len(out.prompt_token_ids[i])
        generated = [t for t in range(len(response)) if mask[t] == 1]
        expected = recomputed[[start + t - 1 for t in generated]]
        got = torch.tensor([logprobs[t] for t in generated])
        assert torch.allclose(got, expected, atol=1e-3)
        assert all(logprobs[t] == 0.0 for t in range(len(response)) if mask[t] == 0)
    assert out.metrics["generate/num_turns/max"] <= 3
