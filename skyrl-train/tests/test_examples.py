"""Every example config runs two real training steps on the tiny model (its data from skyrl-gym's demo sets)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from skyrl_gym.datasets import make_demo_dataset, write_dataset
from skyrl_gym.retrieval.server import RetrievalServer
from skyrl_train.config import load_config
from skyrl_train.run import run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def retriever() -> Iterator[str]:
    from skyrl_gym.retrieval.bm25 import BM25Index
    from skyrl_gym.retrieval.corpus import read_corpus
    from skyrl_gym.retrieval.data import bundled_corpus_path

    with RetrievalServer(BM25Index.build(read_corpus(bundled_corpus_path()))) as server:
        yield server.url


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with room for text2sql's schema prompts (≈1,100 tokens)."""
    from skyrl_train.models.tiny import TinyModelSpec, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("long-tiny"), spec=TinyModelSpec(max_position_embeddings=4096))


@pytest.mark.parametrize("name", ["gsm8k_multi_turn", "text2sql", "search", "lcb"])
def test_example_runs_two_steps(name: str, long_context_model: Path, tmp_path: Path, retriever: str) -> None:
    env_id = name
    train = write_dataset(make_demo_dataset(env_id, 4), tmp_path / "train", ["jsonl"])[0]
    val = write_dataset(make_demo_dataset(env_id, 2, split="test"), tmp_path / "val", ["jsonl"])[0]
    overrides = [
        f"model.path={long_context_model}",
        "model.gradient_checkpointing=false",
        f"data.train_data=[{train}]",
        f"data.val_data=[{val}]",
        "data.max_prompt_length=2048",
        f"trainer.run_dir={tmp_path / 'run'}",
        "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=2",
        "trainer.micro_train_batch_size=4",
        "trainer.micro_forward_batch_size=4",
        "trainer.max_training_steps=2",
        "trainer.logger=[jsonl]",
        "generator.n_samples_per_prompt=2",
        "generator.max_generate_length=16",
    ]
    if name == "search":
        overrides.append(f"environment.env_configs.search.search_url={retriever}")
    config = load_config(EXAMPLES / f"{name}.yaml", overrides)
    result = run(config, echo_config=False)
    assert result.global_step == 2
    assert (result.run_dir / "metrics.jsonl").exists()
    assert result.eval_history, "the example evaluates on its validation rows"
