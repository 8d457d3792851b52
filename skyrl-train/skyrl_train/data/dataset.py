"""Prompt datasets read from local files, in the row format of ``skyrl_gym.datasets``.

One row per prompt. Columns:

==============  ========  =================================================================================
``data_source``  required  a label for per-dataset metrics (``eval/<data_source>/…``)
``prompt``       required  OpenAI chat messages ``[{"role": ..., "content": ...}, ...]`` (a plain string is
                           taken as one user message)
``reward_spec``  required  ``{"method": "rule" | "reward_model", "ground_truth": ...}`` (may be null for envs
                           that score without it)
``env_class``    optional  the skyrl-gym env id; missing or null falls back to the default env class
``extra_info``   optional  a free mapping
any other        optional  passed to the env with the rest as its ``extras`` (e.g. ``db_id`` for text2sql)
==============  ========  =================================================================================

A file is a ``.parquet`` file, a ``.jsonl`` file (one JSON object per line), a ``.json`` file (an array of
objects, or JSON lines), or a directory written by Hugging Face ``datasets``' ``save_to_disk`` (needs the
``datasets`` package). Several files are concatenated in the order given.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from skyrl_gym.envs.base_text_env import ConversationType

__all__ = [
    "REQUIRED_COLUMNS",
    "ChatTokenizer",
    "DatasetError",
    "PromptDataset",
    "PromptRecord",
    "prompt_lengths",
    "read_rows",
]

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_spec")
LENGTH_SETTING = "data.max_prompt_length"  # the run-config key of ``max_prompt_length``, named in messages
Row = dict[str, Any]


class DatasetError(ValueError):
    """A dataset file cannot be read or a row is malformed; the message names the file and row."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt as the generator needs it."""

    messages: ConversationType  # the chat prompt
    env_class: str  # skyrl-gym env id for this prompt
    extras: dict[str, Any]  # every column but prompt and env_class (data_source, reward_spec, …): the env's extras
    uid: str  # the row's index across the concatenated files, before filtering; stable across runs

    @property
    def data_source(self) -> str:
        """The row's ``data_source`` label."""
        return str(self.extras.get("data_source"))


class ChatTokenizer(Protocol):
    """The two tokenizer methods the length filter uses (a Hugging Face tokenizer has both)."""

    def apply_chat_template(
        self, conversation: list[ConversationType], /, *, tokenize: bool, add_generation_prompt: bool
    ) -> Any:
        """Render a batch of conversations to text (``tokenize=False``; template kwargs arrive as keywords)."""
        ...

    def __call__(self, text: list[str], /, *, add_special_tokens: bool) -> Any:
        """Tokenize a batch of texts; the result has ``input_ids``."""
        ...


class PromptDataset:
    """The prompts of one or more files, validated and with too-long prompts removed.

    Args:
        paths: files (or saved Hugging Face dataset directories), concatenated in order.
        default_env_class: env id for rows without ``env_class``.
        tokenizer: with ``max_prompt_length``, drops prompts whose chat-templated length (generation prompt
            included) exceeds ``max_prompt_length`` tokens; a warning gives the count and the longest length
            dropped, and ``num_filtered`` keeps the count.
        max_prompt_length: the token budget of a prompt; ``None`` keeps every prompt.
        chat_template_kwargs: extra arguments of ``apply_chat_template`` (the generator's, so lengths agree).

    Raises:
        DatasetError: a file is missing or unreadable, a row lacks a required column or has a malformed
            prompt, the files hold no rows, or every prompt is too long (the message gives the count, the
            lengths and the length to set ``data.max_prompt_length`` to).
    """

    def __init__(
        self,
        paths: Sequence[str | Path],
        *,
        default_env_class: str,
        tokenizer: ChatTokenizer | None = None,
        max_prompt_length: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not paths:
            raise DatasetError("no dataset files given")
        records: list[PromptRecord] = []
        for path in paths:
            offset = len(records)
            rows = read_rows(path)
            records.extend([_record(row, default_env_class, path, i, offset + i) for i, row in enumerate(rows)])
        where = ", ".join(map(str, paths))
        if not records:
            raise DatasetError(f"no prompts in {where}: the files hold no rows")
        self.num_filtered = 0
        if tokenizer is not None and max_prompt_length is not None:
            records = self._filter_long(records, tokenizer, max_prompt_length, dict(chat_template_kwargs or {}), where)
        self._records = records

    def _filter_long(
        self,
        records: list[PromptRecord],
        tokenizer: ChatTokenizer,
        max_length: int,
        kwargs: dict[str, Any],
        where: str,
    ) -> list[PromptRecord]:
        lengths = prompt_lengths(tokenizer, [r.messages for r in records], kwargs)
        kept = [record for record, length in zip(records, lengths, strict=True) if length <= max_length]
        self.num_filtered = len(records) - len(kept)
        if not self.num_filtered:
            return kept
        dropped = [length for length in lengths if length > max_length]
        summary = (
            f"{self.num_filtered} of {len(records)} prompts in {where} are longer than max_prompt_length="
            f"{max_length} tokens (chat-templated; the dropped ones have {min(dropped)} to {max(dropped)} tokens)"
        )
        raise_to = f"raise {LENGTH_SETTING} to at least {max(dropped)}"
        note = _context_note(tokenizer, max(dropped))
        if not kept:
            raise DatasetError(f"no prompts left: {summary}; {raise_to}{note}")
        logger.warning("%s: dropped them; %s to keep them%s", summary, raise_to, note)
        return kept

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int) -> PromptRecord:
        return self._records[index]

    def __iter__(self) -> Iterator[PromptRecord]:
        return iter(self._records)


def _context_note(tokenizer: ChatTokenizer, length: int) -> str:
    """A note for messages when a prompt of ``length`` tokens does not fit the tokenizer's declared context."""
    context = getattr(tokenizer, "model_max_length", None)
    # Tokenizers without a declared context report a huge sentinel (transformers' VERY_LARGE_INTEGER).
    if not isinstance(context, int) or context >= 10**9 or length < context:
        return ""
    return f" (the tokenizer declares a context of {context} tokens: prompts this long also need a model with more)"


def prompt_lengths(
    tokenizer: ChatTokenizer,
    conversations: Sequence[ConversationType],
    chat_template_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 1024,
) -> list[int]:
    """Token count of each conversation rendered with the chat template and a generation prompt.

    Rendering to text and tokenizing without special tokens gives the same ids as ``apply_chat_template(...,
    tokenize=True)`` (the template already holds the special tokens) and lets the fast tokenizer batch the work.
    """
    kwargs = dict(chat_template_kwargs or {})
    lengths: list[int] = []
    for start in range(0, len(conversations), batch_size):
        batch = list(conversations[start : start + batch_size])
        texts = tokenizer.apply_chat_template(batch, tokenize=False, add_generation_prompt=True, **kwargs)
        ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        lengths.extend(len(row) for row in ids)
    return lengths


# ----------------------------------------------------------------------------------------------- rows


def _record(row: Any, default_env_class: str, path: str | Path, index: int, uid: int) -> PromptRecord:
    """Validate one row (``index`` within ``path``) and turn it into a record."""
    where = f"{path}: row {index}"
    if not isinstance(row, Mapping):
        raise DatasetError(f"{where}: expected an object with columns, got {type(row).__name__}")
    missing = [column for column in REQUIRED_COLUMNS if column not in row]
    if missing:
        raise DatasetError(
            f"{where}: missing column {', '.join(repr(c) for c in missing)} (it has {', '.join(map(repr, row))}); "
            f"every row needs {', '.join(REQUIRED_COLUMNS)}"
        )
    env_class = row.get("env_class") or default_env_class
    extras = {key: value for key, value in row.items() if key not in ("prompt", "env_class")}
    return PromptRecord(_messages(row["prompt"], where), str(env_class), extras, str(uid))


def _messages(prompt: Any, where: str) -> ConversationType:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, Sequence) or not prompt:
        raise DatasetError(f"{where}: 'prompt' must be a non-empty list of chat messages, got {prompt!r}")
    messages = []
    for message in prompt:
        if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)):
            raise DatasetError(f"{where}: each prompt message needs a string 'role', got {message!r}")
        if not isinstance(message.get("content"), str):
            raise DatasetError(f"{where}: each prompt message needs a string 'content', got {message!r}")
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def read_rows(path: str | Path) -> list[Row]:
    """All rows of one file (or saved Hugging Face dataset directory), as dicts.

    Raises:
        DatasetError: the path is missing, of an unknown kind, or cannot be parsed.
    """
    path = Path(path)
    if path.is_dir():
        return _read_saved_hf(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    raise DatasetError(f"{path}: unknown dataset format {suffix!r}; use .parquet, .jsonl, .json or a saved HF dataset")


def _read_parquet(path: Path) -> list[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError(f"reading {path} needs pyarrow: pip install pyarrow") from exc
    try:
        rows: list[Row] = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several unrelated types for a corrupt file
        raise DatasetError(f"{path}: not a readable parquet file ({exc})") from exc
    return rows


def _read_jsonl(path: Path) -> list[Row]:
    rows = []
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}: line {number} is not valid JSON ({exc.msg})") from exc
    return rows


def _read_json(path: Path) -> list[Row]:
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return _read_jsonl(path)  # a .json file holding JSON lines, as Hugging Face also accepts
    if isinstance(data, dict):
        return [data]  # JSON lines with a single line
    if not isinstance(data, list):
        raise DatasetError(f"{path}: a .json dataset must be an array of row objects, got {type(data).__name__}")
    return data


def _read_saved_hf(path: Path) -> list[Row]:
    try:
        datasets: Any = importlib.import_module("datasets")  # optional dependency, imported only for directories
    except ImportError as exc:
        raise DatasetError(
            f"{path} is a directory; reading a saved Hugging Face dataset needs the `datasets` package "
            "(pip install datasets), or convert it to parquet/JSONL"
        ) from exc
    loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
    if isinstance(loaded, datasets.DatasetDict):
        splits = ", ".join(f"{path}/{name}" for name in loaded)
        raise DatasetError(f"{path} holds several splits; pass one of them: {splits}")
    return list(loaded.to_list())
