from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import skyrl_gym
from skyrl_gym import cli, datasets

REQUIRED = {"data_source", "prompt", "env_class", "reward_spec", "extra_info"}


def _env_from_row(row: dict[str, Any]) -> tuple[Any, Any]:
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    return skyrl_gym.make(row["env_class"], extras=extras), row["prompt"]


@pytest.mark.parametrize("env_id", sorted(datasets.BUILDERS))
def test_rows_have_the_trainer_format(env_id: str) -> None:
    rows = datasets.make_demo_dataset(env_id, 5, seed=1)
    assert rows == datasets.make_demo_dataset(env_id, 5, seed=1)
    assert rows != datasets.make_demo_dataset(env_id, 5, seed=1, split="test")
    for index, row in enumerate(rows):
        assert row.keys() >= REQUIRED
        assert row["env_class"] == env_id
        assert row["extra_info"] == {**row["extra_info"], "index": index, "split": "train"}
        assert all(set(m) == {"role", "content"} for m in row["prompt"])
        assert row["reward_spec"]["method"] == "rule"


@pytest.mark.parametrize("env_id", ["gsm8k", "gsm8k_multi_turn"])
def test_gsm8k_rows_are_solvable(env_id: str) -> None:
    for row in datasets.make_demo_dataset(env_id, 5):
        env, prompt = _env_from_row(row)
        env.init(prompt)
        out = env.step(f"Reasoning. #### {row['reward_spec']['ground_truth']}")
        assert out["reward"] == 1.0
        assert out["done"]


def test_aime_rows_are_solvable() -> None:
    for row in datasets.make_demo_dataset("aime", 5):
        env, prompt = _env_from_row(row)
        env.init(prompt)
        assert env.step(f"Answer: {row['reward_model']['ground_truth']}")["reward"] == 1.0


def test_text2sql_rows_are_solvable() -> None:
    for row in datasets.make_demo_dataset("text2sql", 4):
        env, prompt = _env_from_row(row)
        env.init(prompt)
        gold = row["reward_spec"]["ground_truth"]
        out = env.step(f"<think>the gold query</think>\n<solution>{gold}</solution>")
        assert out["done"]
        assert out["reward"] == 1.0


def test_search_rows_are_answerable() -> None:
    for row in datasets.make_demo_dataset("search", 4):
        env, prompt = _env_from_row(row)
        env.init(prompt)
        out = env.step(f"<answer>{row['reward_spec']['ground_truth']['target'][0]}</answer>")
        assert out["done"]
        assert out["reward"] == 1.0


def test_searchcode_rows_are_solvable() -> None:
    for row in datasets.make_demo_dataset("searchcode", 3):
        env, prompt = _env_from_row(row)
        env.init(prompt)
        out = env.step(f"<solution>#### {row['reward_spec']['ground_truth']}</solution>")
        assert out["done"]
        assert out["reward"] == 1.0


def test_lcb_rows_hold_consistent_tests() -> None:
    for row in datasets.make_demo_dataset("lcb", 8):
        tests = json.loads(row["reward_spec"]["ground_truth"])
        assert len(tests) == 3
        assert all(t["testtype"] == "stdin" and t["output"].endswith("\n") for t in tests)


def test_write_jsonl_and_parquet_round_trip(tmp_path: Path) -> None:
    rows = datasets.make_demo_dataset("gsm8k", 3)
    paths = datasets.write_dataset(rows, tmp_path / "gsm8k" / "train")
    assert [p.name for p in paths] == ["train.jsonl", "train.parquet"]
    assert [json.loads(line) for line in paths[0].read_text().splitlines()] == rows
    assert pq.read_table(paths[1]).to_pylist() == rows
    assert not list(tmp_path.rglob("*.tmp"))


def test_bad_requests_explain_themselves(tmp_path: Path) -> None:
    with pytest.raises(datasets.DatasetError, match="available: aime"):
        datasets.make_demo_dataset("nope", 3)
    with pytest.raises(datasets.DatasetError, match="at least 1"):
        datasets.make_demo_dataset("gsm8k", 0)
    with pytest.raises(datasets.DatasetError, match="unknown format"):
        datasets.write_dataset([], tmp_path / "x", ["csv"])


def test_cli_make_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["make-dataset", "--env", "gsm8k", "aime", "--out", str(tmp_path), "--train-size", "3", "--test-size", "2"]
    assert cli.main(argv) == 0
    assert len((tmp_path / "aime" / "test.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "gsm8k" / "train.parquet").exists()
    assert cli.main(["make-dataset", "--env", "nope", "--out", str(tmp_path)]) == 2
    assert "no demo dataset" in capsys.readouterr().err
