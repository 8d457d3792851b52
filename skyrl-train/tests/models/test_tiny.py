from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl_train.models.tiny import TinyModelSpec, build_tiny_model, fingerprint

SMALL = TinyModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=2, corpus_lines=500)


def test_same_seed_builds_identical_files(tmp_path: Path) -> None:
    first = build_tiny_model(tmp_path / "a", seed=3, spec=SMALL)
    second = build_tiny_model(tmp_path / "b", seed=3, spec=SMALL)
    assert fingerprint(first) == fingerprint(second)
    other = build_tiny_model(tmp_path / "c", seed=4, spec=SMALL)
    assert fingerprint(other) != fingerprint(first)


def test_existing_build_is_reused(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path / "m", seed=0, spec=SMALL)
    weights = path / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    build_tiny_model(path, seed=0, spec=SMALL)
    assert weights.stat().st_mtime_ns == mtime
    build_tiny_model(path, seed=1, spec=SMALL)
    assert weights.stat().st_mtime_ns != mtime


def test_default_shape_matches_documentation(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = model.config
    assert config.model_type == "qwen2"
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (4, 256, 512)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (4, 2, 1024)
    assert config.tie_word_embeddings
    assert model.dtype == torch.float32
    n_params = sum(p.numel() for p in model.parameters())
    assert 2_000_000 < n_params < 3_500_000


def test_tokenizer_chat_template_and_digits(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 7?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[tokens.index("1") + 1] == "2", "numbers must tokenize digit by digit"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    # Byte-level BPE round-trips any text, including characters absent from the training corpus.
    unusual = "naïve café — 中文 🙂"
    assert tokenizer.decode(tokenizer(unusual)["input_ids"]) == unusual


def test_model_generates_and_stops_at_eos_id(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    inputs = tokenizer("What is 1 + 2?", return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert out.shape[1] <= inputs["input_ids"].shape[1] + 8
