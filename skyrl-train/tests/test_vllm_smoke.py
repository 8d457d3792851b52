"""The vLLM engine (CPU build in CI) generates from token ids, and its logprobs match the model's forward pass."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_logprobs_match_forward_pass(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The in-process engine starts in seconds instead of spawning a separate engine-core process.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True, tokenize=False
        )
        for a, b in [(3, 4), (12, 7), (40, 2)]
    ]
    prompts: list[list[int]] = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    llm = LLM(
        model=str(tiny_model_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        # A small explicit KV cache: a RAM share would hold gigabytes for the whole test session.
        kv_cache_memory_bytes=128 * 2**20,
        logprobs_mode="processed_logprobs",
        seed=0,
    )
    try:
        params = SamplingParams(temperature=1.0, max_tokens=16, logprobs=0, seed=1, detokenize=False, ignore_eos=True)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    finally:
        del llm

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    max_diff = 0.0
    for prompt, out in zip(prompts, outputs, strict=True):
        completion = out.outputs[0]
        generated = list(completion.token_ids)
        assert len(generated) == 16
        engine_lp = torch.tensor(
            [step[token].logprob for step, token in zip(completion.logprobs, generated, strict=True)]
        )
        ids = torch.tensor([prompt + generated])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
        forward_lp = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(generated)[:, None])[:, 0]
        max_diff = max(max_diff, (engine_lp - forward_lp).abs().max().item())
    assert max_diff < 1e-3, f"vLLM logprobs differ from the forward pass by up to {max_diff:.2e}"
