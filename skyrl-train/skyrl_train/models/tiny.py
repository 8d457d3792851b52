r"""A deterministic tiny causal LM and tokenizer for tests, the quickstart and benchmarks.

Nothing may be downloaded at run time, so every test that needs "a model path" builds one here: a small
Qwen2-architecture model and a byte-level BPE tokenizer trained on generated text, saved as an ordinary Hugging
Face directory that ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained`` and vLLM load.

Shape of the default (``TinyModelSpec()``), about 2.6 M parameters:

==================  ======================================================================
architecture        ``Qwen2ForCausalLM``, fp32, tied input/output embeddings
layers / hidden     4 layers, hidden size 256, MLP size 512
attention           4 query heads, 2 key/value heads (grouped-query), head size 64
vocabulary          ≈700 trained tokens (256 bytes + merges + 3 specials); embeddings padded to 1,024 rows
context             512 positions, RoPE theta 10,000
special tokens      ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos)
chat template       ChatML (``<|im_start|>role\ncontent<|im_end|>\n``), with a generation prompt
digits              every digit is its own pre-token, so numbers tokenize digit by digit
==================  ======================================================================

The same seed always yields byte-identical weights and tokenizer files (``fingerprint`` hashes them).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)

_WORD_TEXT = """
the a an of to and in is it that for on with as was by at be this from or which you are not have
what how many much total each more less than sum add plus minus times number answer question solve
step first then so left right apples books cars dogs eggs friends hours days weeks miles dollars
cents user assistant system think tool search python sql code result error true false none return
print def if else for while import class self list dict string value input output test pass fail yes
no
"""
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture of the tiny model; the defaults give the ≈3 M-parameter model described above."""

    vocab_size: int = 1024  # BPE size cap and embedding rows (the generated corpus yields ≈700 tokens)
    hidden_size: int = 256
    intermediate_size: int = 512  # MLP width
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    corpus_lines: int = 4000  # generated lines the tokenizer is trained on


def build_tiny_model(path: str | Path, seed: int = 0, spec: TinyModelSpec | None = None) -> Path:
    """Build the tiny model and tokenizer from ``seed`` and save both under ``path``; return the path.

    The directory holds ``config.json``, ``model.safetensors``, ``generation_config.json`` and the tokenizer
    files. An existing directory built from the same seed and spec is left as it is.
    """
    spec = spec or TinyModelSpec()
    out = Path(path)
    stamp = out / ".tiny-model"
    key = _cache_key(seed, spec)
    if stamp.exists() and stamp.read_text() == key:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed, spec)
    tokenizer.save_pretrained(out)
    model = _build_model(seed, spec, tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    stamp.write_text(key)
    return out


def build_tokenizer(seed: int = 0, spec: TinyModelSpec | None = None) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer on text generated from ``seed``; return it ready to save."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = spec or TinyModelSpec()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed, spec.corpus_lines), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=None,
        eos_token=EOS_TOKEN,
        unk_token=None,
        additional_special_tokens=[BOS_TOKEN],
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def fingerprint(path: str | Path) -> str:
    """SHA-256 over the weights and tokenizer files of a built model directory (for determinism checks)."""
    digest = hashlib.sha256()
    root = Path(path)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        digest.update(name.encode())
        digest.update((root / name).read_bytes())
    return digest.hexdigest()


def _build_model(seed: int, spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=max(len(tokenizer), spec.vocab_size),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        dtype="float32",
        bos_token_id=int(tokenizer.convert_tokens_to_ids(BOS_TOKEN)),  # type: ignore[arg-type]
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Weights are drawn on a private generator so the global RNG state of the caller is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    return model


def _corpus(seed: int, lines: int) -> Iterator[str]:
    """Generated chat-like text: arithmetic word problems, answers, code-ish and tool-ish lines."""
    rng = random.Random(seed)
    for _ in range(lines):
        kind = rng.randrange(4)
        a, b = rng.randrange(100), rng.randrange(100)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(3, 12)))
        if kind == 0:
            yield f"What is {a} + {b}? {words}\n#### {a + b}"
        elif kind == 1:
            yield f"{words.capitalize()}. The answer is {a * b}.\n#### {a * b}"
        elif kind == 2:
            yield f"<think>{words}</think>\n<answer>{words.split()[0]}</answer>"
        else:
            yield f"```python\nprint({a} - {b})\n```\n<search>{words}</search>"


def _cache_key(seed: int, spec: TinyModelSpec) -> str:
    return f"seed={seed} spec={spec!r}"
