"""A LoRA-trained policy exported with ``export_hf`` serves in vLLM with the trainer's log-probabilities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.backends.base import TrainingBatch
from skyrl_train.backends.config import BackendConfig, LoraConfig, OptimizerConfig
from skyrl_train.backends.torch_backend import TorchBackend

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_serves_the_merged_export(
    tiny_model_dir: Path, make_batch: Any, sft_loss: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: seconds, not a subprocess
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    config = BackendConfig(
        str(tiny_model_dir),
        micro_train_batch_size=4,
        gradient_checkpointing=False,
        lora=LoraConfig(rank=4),
        optimizer=OptimizerConfig(lr=1e-2),
    )
    backend = TorchBackend(config)
    batch = make_batch([3, 5, 2, 4], [4, 2, 5, 3])
    for _ in range(2):
        backend.forward_backward(batch, sft_loss)
        backend.optim_step()
    backend.export_hf(tmp_path / "export")

    prompt = [5, 17, 42, 99, 7]
    llm = LLM(
        model=str(tmp_path / "export"),
        dtype="float32",
        enforce_eager=True,
        max_model_len=64,
        # A small explicit KV cache: a RAM share would hold gigabytes for the whole test session.
        kv_cache_memory_bytes=128 * 2**20,
        logprobs_mode="processed_logprobs",
        seed=0,
    )
    try:
        params = SamplingParams(temperature=1.0, max_tokens=8, logprobs=0, seed=1, detokenize=False, ignore_eos=True)
        completion = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params)[0].outputs[0]
    finally:
        del llm
    generated = list(completion.token_ids)
    steps: Any = completion.logprobs  # one {token: Logprob} per generated token
    engine = torch.tensor([step[tok].logprob for step, tok in zip(steps, generated, strict=True)])
    ids = torch.tensor([prompt + generated])
    trained = TrainingBatch(ids, torch.ones_like(ids), torch.ones(1, len(generated)))
    assert (backend.forward(trained).log_probs[0] - engine).abs().max() < 1e-3
