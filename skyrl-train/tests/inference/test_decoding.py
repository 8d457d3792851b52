from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from skyrl_train.inference.decoding import GQA_SDPA, PreallocatedLayer, preallocated_cache, use_gqa_attention


def load(path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture
def model(tiny_model_dir: Path, perturb: Callable[..., object]) -> PreTrainedModel:
    model = load(tiny_model_dir)
    perturb(model, seed=0, scale=0.2)  # varied logits, so equal outputs mean something
    return model


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    return ids, mask


@torch.inference_mode()
def greedy_logits(
    model: PreTrainedModel, prompts: list[list[int]], steps: int, cache: DynamicCache
) -> list[torch.Tensor]:
    """Last-position logits of each step of a greedy decode; row 1 is dropped half-way (as finished rows are)."""
    ids, mask = left_padded(prompts)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
    logits, history = out.logits[:, -1], [out.logits[:, -1]]
    next_positions = positions[:, -1:] + 1
    for step in range(steps):
        tokens = logits.argmax(-1, keepdim=True)
        if step == steps // 2:
            keep = torch.tensor([i for i in range(len(tokens)) if i != 1])
            cache.batch_select_indices(keep)
            mask, next_positions, tokens = mask[keep], next_positions[keep], tokens[keep]
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        out = model(input_ids=tokens, attention_mask=mask, position_ids=next_positions, past_key_values=cache)
        logits = out.logits[:, -1]
        history.append(logits)
        next_positions = next_positions + 1
    return history


def test_gqa_attention_gives_the_sdpa_logits(model: PreTrainedModel, prompts: list[list[int]]) -> None:
    expected = greedy_logits(model, prompts, 8, DynamicCache(config=model.config))
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # the tiny model groups its heads
    assert use_gqa_attention(model)
    assert model.config._attn_implementation == GQA_SDPA
    actual = greedy_logits(model, prompts, 8, DynamicCache(config=model.config))
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)


def test_gqa_attention_leaves_other_implementations_alone(tiny_model_dir: Path) -> None:
    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    assert not use_gqa_attention(eager)
    assert eager.config._attn_implementation == "eager"


@pytest.mark.parametrize("capacity", [64, 3])  # room for everything; too small, so the buffers must grow
def test_preallocated_cache_gives_the_dynamic_cache_logits(
    model: PreTrainedModel, prompts: list[list[int]], capacity: int
) -> None:
    expected = greedy_logits(model, prompts, 10, DynamicCache(config=model.config))
    cache = preallocated_cache(model, capacity)
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    actual = greedy_logits(model, prompts, 10, cache)
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)
    width = max(len(p) for p in prompts)
    assert cache.get_seq_length() == width + 10
    keys = cache.layers[0].keys
    assert keys is not None
    assert keys.shape[0] == len(prompts) - 1


def test_preallocated_layer_reset_forgets_everything() -> None:
    layer = PreallocatedLayer(capacity=4)
    keys = torch.randn(2, 1, 3, 8)
    layer.update(keys, keys + 1)
    layer.reset()
    assert layer.get_seq_length() == 0
    fresh = torch.randn(5, 1, 2, 8)  # another batch size: nothing of the old buffers may survive
    k, v = layer.update(fresh, fresh + 1)
    assert torch.equal(k, fresh)
    assert torch.equal(v, fresh + 1)
