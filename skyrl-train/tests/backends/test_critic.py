from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForTokenClassification

from skyrl_train.algorithms import value_loss
from skyrl_train.backends import ModelOutput, TrainingBatch
from skyrl_train.backends.config import BackendConfig, LoraConfig, OptimizerConfig
from skyrl_train.backends.critic import CriticBackend

PROMPTS = [3, 5, 2, 4]
RESPONSES = [4, 2, 5, 3]


def critic(model_dir: Path, **overrides: Any) -> CriticBackend:
    fields: dict[str, Any] = {
        "micro_train_batch_size": 2,
        "micro_forward_batch_size": 3,
        "gradient_checkpointing": False,
        "optimizer": OptimizerConfig(lr=1e-2, weight_decay=0.0),
    }
    return CriticBackend(BackendConfig(str(model_dir), **{**fields, **overrides}))


def critic_loss(output: ModelOutput, mb: TrainingBatch) -> tuple[torch.Tensor, dict[str, float]]:
    assert output.values is not None
    t = mb.tensors
    return value_loss(
        output.values, t["old_values"], t["returns"], mb.response_mask, None, token_weights=t["token_weights"]
    )


def test_values_are_aligned_like_log_probs_and_layout_free(small_model_dir: Path, make_batch: Any) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    padded = critic(small_model_dir, remove_padding=False).forward(batch)
    packed = critic(small_model_dir, remove_padding=True).forward(batch)
    assert padded.values is not None
    assert packed.values is not None
    assert padded.values.shape == (4, batch.response_length)
    assert padded.log_probs.shape == (4, 0)
    assert (padded.values - packed.values).abs().max() < 1e-5
    # Row 0 alone through the same model: the value of response token t is read at the position before it.
    real = batch.input_ids[0][batch.attention_mask[0].bool()]
    model = critic(small_model_dir).model
    with torch.no_grad():
        alone = model(real[None]).logits[0, :, 0]
    assert torch.allclose(padded.values[0, :4], alone[PROMPTS[0] - 1 : PROMPTS[0] + 3], atol=1e-5)


def test_critic_learns_returns_and_exports(small_model_dir: Path, make_batch: Any, tmp_path: Path) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    b = critic(small_model_dir)
    old_values = b.forward(batch).values
    assert old_values is not None
    batch.tensors["old_values"] = old_values
    batch.tensors["returns"] = torch.full_like(batch.response_mask, 0.5)
    losses = []
    for _ in range(10):
        losses.append(b.forward_backward(batch, critic_loss)["loss"])
        b.optim_step()
    assert losses[-1] < 0.2 * losses[0]
    assert any(name == "score.weight" for name, _ in b.get_weights())
    b.export_hf(tmp_path / "critic")
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic")
    real = batch.input_ids[0][batch.attention_mask[0].bool()]
    with torch.no_grad():
        exported = loaded(real[None]).logits[0, PROMPTS[0] - 1 : PROMPTS[0] + 3, 0]
    assert torch.allclose(b.forward(batch).values[0, :4], exported, atol=1e-5)  # type: ignore[index]


def test_lora_critic_trains_the_head_in_full(small_model_dir: Path) -> None:
    b = critic(small_model_dir, lora=LoraConfig(rank=2))
    trainable = {n for n, p in b.model.named_parameters() if p.requires_grad}
    assert {"base_model.model.score.weight", "base_model.model.score.bias"} <= trainable
    names = [name for name, _ in b.get_weights()]
    assert "score.weight" in names
    assert not any("lora" in n for n in names)


def test_critic_has_no_entropy(small_model_dir: Path, make_batch: Any) -> None:
    with pytest.raises(ValueError, match="no token distribution"):
        critic(small_model_dir).forward(make_batch([2], [2]), with_entropy=True)
