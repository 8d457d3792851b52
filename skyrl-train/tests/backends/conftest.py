"""Fixtures of the backend tests: a very small model and a batch builder with left/right padding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from skyrl_train.algorithms import loss_weights
from skyrl_train.backends.base import TrainingBatch
from skyrl_train.models.tiny import TinyModelSpec, build_tiny_model
from skyrl_train.objective import Objective, add_token_weights

# Small enough that a backend builds in ~0.1 s and a step takes milliseconds.
SMALL = TinyModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    corpus_lines=500,
)
PAD_ID = 0

BatchFactory = Callable[..., TrainingBatch]


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("small-model"), seed=0, spec=SMALL)


def build_batch(prompt_lens: Sequence[int], response_lens: Sequence[int], seed: int = 0) -> TrainingBatch:
    """Rows of random tokens: prompts left-padded to the longest, responses right-padded to the longest.

    ``response_mask`` is 1 on real response tokens except the first of every row (as if it were an observation
    token), so masks and attention differ; ``tensors`` holds token-mean ``token_weights`` over the whole batch.
    """
    gen = torch.Generator().manual_seed(seed)
    prompt_width, response_width = max(prompt_lens), max(response_lens)
    rows = len(prompt_lens)
    input_ids = torch.full((rows, prompt_width + response_width), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        start, end = prompt_width - p, prompt_width + r
        input_ids[i, start:end] = torch.randint(3, 600, (end - start,), generator=gen)
        attention_mask[i, start:end] = 1
    response_mask = attention_mask[:, prompt_width:].float()
    response_mask[:, 0] = 0.0
    weights = loss_weights(response_mask, "token_mean")
    return TrainingBatch(input_ids, attention_mask, response_mask, tensors={"token_weights": weights})


def build_rl_batch(rows: int, seed: int, objective: Objective) -> TrainingBatch:
    """Random rows with old log-probs near the model's and signed advantages, token weights over the batch."""
    batch = build_batch([3 + i % 3 for i in range(rows)], [4 + (i * 2) % 5 for i in range(rows)], seed=seed)
    generator = torch.Generator().manual_seed(seed)
    shape = batch.response_mask.shape
    batch.tensors["old_log_probs"] = -2.0 + 0.1 * torch.randn(shape, generator=generator)
    batch.tensors["advantages"] = torch.randn(rows, 1, generator=generator).expand(shape).clone()
    add_token_weights(batch, torch.arange(rows), objective)
    return batch


@pytest.fixture(scope="session")
def make_batch() -> BatchFactory:
    return build_batch


def nll_loss(output, micro_batch):  # type: ignore[no-untyped-def]
    """SFT loss of a micro-batch, pre-scaled by the batch's token weights."""
    loss = -(output.log_probs * micro_batch.tensors["token_weights"]).sum()
    return loss, {"nll": float(loss.detach())}


@pytest.fixture(scope="session")
def sft_loss() -> Callable[..., object]:
    return nll_loss
