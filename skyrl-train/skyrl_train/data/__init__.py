"""Prompt data: datasets read from local files and a deterministic, resumable batch loader."""

from skyrl_train.data.dataset import (
    REQUIRED_COLUMNS,
    ChatTokenizer,
    DatasetError,
    PromptDataset,
    PromptRecord,
    prompt_lengths,
    read_rows,
)
from skyrl_train.data.loader import PromptLoader

__all__ = [
    "REQUIRED_COLUMNS",
    "ChatTokenizer",
    "DatasetError",
    "PromptDataset",
    "PromptLoader",
    "PromptRecord",
    "prompt_lengths",
    "read_rows",
]
