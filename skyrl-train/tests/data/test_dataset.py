from __future__ import annotations

import json
import logging
import sys
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from skyrl_gym.datasets import make_demo_dataset, write_dataset
from skyrl_train.data import DatasetError, PromptDataset, PromptLoader, PromptRecord, prompt_lengths, read_rows
from skyrl_train.models.tiny import TinyModelSpec, build_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(0, TinyModelSpec(corpus_lines=300))


@pytest.fixture
def gsm8k_files(tmp_path: Path) -> list[Path]:
    """The same 20 demo rows as JSONL and parquet."""
    return write_dataset(make_demo_dataset("gsm8k", 20, seed=1), tmp_path / "gsm8k")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _row(content: str = "What is 1 + 1?", **extra: Any) -> dict[str, Any]:
    row = {
        "data_source": "toy",
        "prompt": [{"role": "user", "content": content}],
        "reward_spec": {"method": "rule", "ground_truth": "2"},
    }
    row.update(extra)
    return row


# ------------------------------------------------------------------------------------------------ reading


def test_parquet_and_jsonl_give_the_same_records(gsm8k_files: list[Path]) -> None:
    jsonl, parquet = gsm8k_files
    from_jsonl = PromptDataset([jsonl], default_env_class="other")
    from_parquet = PromptDataset([parquet], default_env_class="other")
    assert len(from_jsonl) == len(from_parquet) == 20
    first = from_parquet[0]
    assert isinstance(first, PromptRecord)
    assert first == from_jsonl[0]
    assert first.messages[0]["role"] == "user"
    assert first.env_class == "gsm8k"  # the row's own env_class wins over the default
    assert first.uid == "0"
    assert first.data_source == "gsm8k_demo"
    assert set(first.extras) == {"data_source", "reward_spec", "extra_info"}
    assert first.extras["reward_spec"]["method"] == "rule"


def test_files_concatenate_and_env_class_falls_back(tmp_path: Path) -> None:
    a = _write_jsonl(tmp_path / "a.jsonl", [_row(), _row(env_class=None)])
    b = _write_jsonl(tmp_path / "b.jsonl", [_row(env_class="aime", db_id="db1", extra_info={"k": 1})])
    dataset = PromptDataset([a, b], default_env_class="gsm8k")
    assert [r.uid for r in dataset] == ["0", "1", "2"]
    assert [r.env_class for r in dataset] == ["gsm8k", "gsm8k", "aime"]
    assert dataset[2].extras == {
        "data_source": "toy",
        "reward_spec": {"method": "rule", "ground_truth": "2"},
        "db_id": "db1",
        "extra_info": {"k": 1},
    }


def test_json_array_json_lines_and_plain_string_prompt(tmp_path: Path) -> None:
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([_row(), _row("hi")]))
    lines = _write_jsonl(tmp_path / "lines.json", [_row()])
    plain = _write_jsonl(tmp_path / "plain.jsonl", [{**_row(), "prompt": "just text"}])
    assert len(PromptDataset([array], default_env_class="gsm8k")) == 2
    assert len(PromptDataset([lines], default_env_class="gsm8k")) == 1
    assert PromptDataset([plain], default_env_class="gsm8k")[0].messages == [{"role": "user", "content": "just text"}]


def test_missing_column_names_file_row_and_column(tmp_path: Path) -> None:
    rows = [_row(), _row(), {"data_source": "toy", "prompt": [{"role": "user", "content": "x"}]}]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetError, match=r"bad\.jsonl: row 2: missing column 'reward_spec'"):
        PromptDataset([path], default_env_class="gsm8k")


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "non-empty list of chat messages"),
        ([{"content": "x"}], "string 'role'"),
        ([{"role": "user", "content": 3}], "string 'content'"),
    ],
)
def test_malformed_prompt(tmp_path: Path, prompt: Any, message: str) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [{**_row(), "prompt": prompt}])
    with pytest.raises(DatasetError, match=message):
        PromptDataset([path], default_env_class="gsm8k")


def test_unreadable_inputs(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        read_rows(tmp_path / "missing.parquet")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"unknown dataset format '\.csv'"):
        read_rows(tmp_path / "rows.csv")
    (tmp_path / "broken.jsonl").write_text('{"a": 1}\n{oops\n')
    with pytest.raises(DatasetError, match=r"broken\.jsonl: line 2 is not valid JSON"):
        read_rows(tmp_path / "broken.jsonl")
    with pytest.raises(DatasetError, match="no dataset files"):
        PromptDataset([], default_env_class="gsm8k")


def test_saved_hf_dataset_without_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DatasetError, match=r"needs the `datasets` package \(pip install datasets\)"):
        read_rows(tmp_path)


def test_saved_hf_dataset_round_trip(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_list([_row(), _row("b")]).save_to_disk(str(tmp_path / "saved"))
    assert len(PromptDataset([tmp_path / "saved"], default_env_class="gsm8k")) == 2


# ---------------------------------------------------------------------------------------------- filtering


def test_too_long_prompts_are_filtered_and_counted(
    gsm8k_files: list[Path], tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    full = PromptDataset([gsm8k_files[0]], default_env_class="gsm8k")
    lengths = prompt_lengths(tokenizer, [r.messages for r in full])
    assert lengths[0] == len(tokenizer.apply_chat_template(full[0].messages, add_generation_prompt=True)["input_ids"])
    limit = sorted(lengths)[len(lengths) // 2]
    too_long = sum(length > limit for length in lengths)
    assert 0 < too_long < len(lengths)
    with caplog.at_level(logging.INFO, logger="skyrl_train.data.dataset"):
        dataset = PromptDataset(
            [gsm8k_files[0]], default_env_class="gsm8k", tokenizer=tokenizer, max_prompt_length=limit
        )
    assert dataset.num_filtered == too_long
    assert len(dataset) == len(lengths) - too_long
    dropped = [length for length in lengths if length > limit]
    assert caplog.records[-1].levelno == logging.WARNING
    assert (
        f"{too_long} of 20 prompts in {gsm8k_files[0]} are longer than max_prompt_length={limit} tokens "
        f"(chat-templated; the dropped ones have {min(dropped)} to {max(dropped)} tokens): dropped them; "
        f"raise data.max_prompt_length to at least {max(dropped)} to keep them"
    ) in caplog.text
    kept_uids = {r.uid for r in dataset}
    assert kept_uids == {str(i) for i, length in enumerate(lengths) if length <= limit}  # uids survive filtering


def test_everything_filtered_says_how_many_how_long_and_what_to_raise(gsm8k_files: list[Path], tokenizer: Any) -> None:
    lengths = prompt_lengths(tokenizer, [r.messages for r in PromptDataset([gsm8k_files[0]], default_env_class="x")])
    with pytest.raises(DatasetError) as raised:
        PromptDataset([gsm8k_files[0]], default_env_class="gsm8k", tokenizer=tokenizer, max_prompt_length=3)
    assert str(raised.value) == (
        f"no prompts left: 20 of 20 prompts in {gsm8k_files[0]} are longer than max_prompt_length=3 tokens "
        f"(chat-templated; the dropped ones have {min(lengths)} to {max(lengths)} tokens); "
        f"raise data.max_prompt_length to at least {max(lengths)}"
    )


def test_too_long_for_the_model_too(gsm8k_files: list[Path]) -> None:
    """Raising the limit past the tokenizer's declared context only moves the failure: the message says so."""
    short_context = build_tokenizer(0, TinyModelSpec(corpus_lines=300, max_position_embeddings=16))
    with pytest.raises(DatasetError, match=r"the tokenizer declares a context of 16 tokens: prompts this long also"):
        PromptDataset([gsm8k_files[0]], default_env_class="gsm8k", tokenizer=short_context, max_prompt_length=3)


def test_empty_files_are_not_reported_as_filtered(tmp_path: Path, tokenizer: Any) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match=f"no prompts in {empty}: the files hold no rows"):
        PromptDataset([empty], default_env_class="gsm8k", tokenizer=tokenizer, max_prompt_length=512)


# ------------------------------------------------------------------------------------------------- loader


def _uids(batches: list[list[PromptRecord]]) -> list[list[str]]:
    return [[record.uid for record in batch] for batch in batches]


@pytest.mark.parametrize("drop_last", [True, False])
def test_loader_resumes_exactly_across_epochs(gsm8k_files: list[Path], drop_last: bool) -> None:
    dataset = PromptDataset([gsm8k_files[0]], default_env_class="gsm8k")  # 20 prompts
    reference = PromptLoader(dataset, 6, seed=3, drop_last=drop_last)  # 3 (or 4) batches per epoch
    uninterrupted = _uids(list(islice(reference.stream(), 10)))

    first = PromptLoader(dataset, 6, seed=3, drop_last=drop_last)
    consumed = list(islice(first.stream(), 3))
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints store it as JSON
    resumed = PromptLoader(dataset, 6, seed=999, drop_last=drop_last)  # the saved seed wins
    resumed.load_state_dict(state)
    continued = list(islice(resumed.stream(), 7))
    assert _uids(consumed) + _uids(continued) == uninterrupted


def test_loader_epochs_and_drop_last(gsm8k_files: list[Path]) -> None:
    dataset = PromptDataset([gsm8k_files[0]], default_env_class="gsm8k")
    loader = PromptLoader(dataset, 6, seed=0)
    assert len(loader) == 3
    epoch0 = _uids(list(loader))
    assert loader.epoch == 1
    assert loader.position == 0
    epoch1 = _uids(list(loader))
    assert [len(b) for b in epoch0] == [6, 6, 6]  # the 2 left-over prompts are skipped
    assert len({uid for batch in epoch0 for uid in batch}) == 18
    assert epoch0 != epoch1  # reshuffled every epoch
    assert epoch0 == _uids(list(PromptLoader(dataset, 6, seed=0)))  # the same seed gives the same order

    keep_last = PromptLoader(dataset, 6, shuffle=False, drop_last=False)
    assert len(keep_last) == 4
    batches = _uids(list(keep_last))
    assert [len(b) for b in batches] == [6, 6, 6, 2]
    assert [uid for batch in batches for uid in batch] == [str(i) for i in range(20)]


@pytest.mark.parametrize("drop_last", [True, False])
def test_loader_items_follow_the_batches_and_resume_mid_batch(gsm8k_files: list[Path], drop_last: bool) -> None:
    dataset = PromptDataset([gsm8k_files[0]], default_env_class="gsm8k")  # 20 prompts
    batches = _uids(list(islice(PromptLoader(dataset, 6, seed=3, drop_last=drop_last).stream(), 8)))
    in_batches = [uid for batch in batches for uid in batch]  # with drop_last, 2 prompts skipped per epoch
    first = PromptLoader(dataset, 6, seed=3, drop_last=drop_last)
    consumed = [record.uid for record in islice(first.items(), 9)]  # one and a half batches
    resumed = PromptLoader(dataset, 6, seed=3, drop_last=drop_last)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    continued = [record.uid for record in islice(resumed.items(), len(in_batches) - 9)]
    assert consumed + continued == in_batches


def test_loader_state_mid_epoch(gsm8k_files: list[Path]) -> None:
    dataset = PromptDataset([gsm8k_files[0]], default_env_class="gsm8k")
    loader = PromptLoader(dataset, 4, seed=5)
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    assert loader.state_dict() == {"epoch": 0, "position": 8, "seed": 5, "dataset_size": 20}


def test_loader_rejects_bad_inputs(gsm8k_files: list[Path]) -> None:
    dataset = PromptDataset([gsm8k_files[0]], default_env_class="gsm8k")
    with pytest.raises(ValueError, match="fewer than one batch of 32"):
        PromptLoader(dataset, 32)
    assert len(PromptLoader(dataset, 32, drop_last=False)) == 1
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        PromptLoader(dataset, 0)
    loader = PromptLoader(dataset, 4)
    with pytest.raises(ValueError, match="saved over 25 prompts but the dataset has 20"):
        loader.load_state_dict({"epoch": 0, "position": 4, "seed": 42, "dataset_size": 25})
