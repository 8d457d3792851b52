from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from skyrl_train.backends.config import BackendConfig, LoraConfig, OptimizerConfig
from skyrl_train.backends.lora import apply_lora
from skyrl_train.backends.torch_backend import TorchBackend

PROMPTS = [3, 5, 2, 4]
RESPONSES = [4, 2, 5, 3]
LORA = LoraConfig(rank=4, alpha=8)


def lora_backend(model_dir: Path, **overrides: Any) -> TorchBackend:
    fields: dict[str, Any] = {
        "micro_train_batch_size": 2,
        "gradient_checkpointing": False,
        "lora": LORA,
        "optimizer": OptimizerConfig(lr=1e-2, weight_decay=0.0),
    }
    return TorchBackend(BackendConfig(str(model_dir), **{**fields, **overrides}))


def trained(model_dir: Path, make_batch: Any, sft_loss: Any, steps: int = 3, **overrides: Any) -> TorchBackend:
    b = lora_backend(model_dir, **overrides)
    batch = make_batch(PROMPTS, RESPONSES)
    for _ in range(steps):
        b.forward_backward(batch, sft_loss)
        b.optim_step()
    return b


def test_only_adapters_train(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> None:
    b = lora_backend(small_model_dir)
    before = {n: p.detach().clone() for n, p in b.model.named_parameters()}
    trainable = {n for n, p in b.model.named_parameters() if p.requires_grad}
    assert trainable
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)
    batch = make_batch(PROMPTS, RESPONSES)
    for _ in range(3):
        b.forward_backward(batch, sft_loss)
        b.optim_step()
    for name, param in b.model.named_parameters():
        assert torch.equal(param, before[name]) != (name in trainable), name


def test_merged_weights_are_base_plus_scaled_delta(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> None:
    b = trained(small_model_dir, make_batch, sft_loss)
    merged = dict(b.get_weights())
    assert sorted(merged) == sorted(load_file(small_model_dir / "model.safetensors"))
    named = dict(b.model.named_parameters())
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    base = named[f"{prefix}.base_layer.weight"]
    a, bb = named[f"{prefix}.lora_A.default.weight"], named[f"{prefix}.lora_B.default.weight"]
    expected = base + (LORA.alpha / LORA.rank) * (bb @ a)
    assert float(bb.abs().max()) > 0  # the adapter moved away from its zero init
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], expected, atol=1e-6)
    untouched = named["base_model.model.model.layers.0.input_layernorm.weight"]
    assert torch.equal(merged["model.layers.0.input_layernorm.weight"], untouched)


def test_export_merges_adapters(small_model_dir: Path, make_batch: Any, sft_loss: Any, tmp_path: Path) -> None:
    b = trained(small_model_dir, make_batch, sft_loss)
    b.export_hf(tmp_path / "merged")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    batch = make_batch([3, 3], [2, 2], seed=5)  # unpadded rows: the loaded model's plain forward is the reference
    with torch.no_grad():
        logits = loaded(batch.input_ids).logits[:, 2:4]
    expected = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 3:5, None]).squeeze(-1)
    got = b.forward(batch).log_probs
    assert (got - expected).abs().max() < 1e-5


def test_checkpointing_gives_the_same_adapter_gradients(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> None:
    grads = []
    for checkpointing in (False, True):
        b = lora_backend(small_model_dir, gradient_checkpointing=checkpointing)
        b.forward_backward(make_batch(PROMPTS, RESPONSES), sft_loss)
        b.optim_step()  # moves lora_B off zero so lora_A gets a gradient next
        b.forward_backward(make_batch(PROMPTS, RESPONSES), sft_loss)
        grads.append({n: p.grad for n, p in b.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    assert all((grads[0][n] - grads[1][n]).abs().max() < 1e-6 for n in grads[0])


def test_missing_peft_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, small_model_dir: Path) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)
    model = AutoModelForCausalLM.from_pretrained(small_model_dir)
    with pytest.raises(ImportError, match="pip install peft"):
        apply_lora(model, LORA)
