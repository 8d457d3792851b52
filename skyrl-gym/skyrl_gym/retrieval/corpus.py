r"""Reading a corpus in the Search-R1 format: JSON lines of ``{"id": str, "contents": str}``.

``contents`` is conventionally the title in double quotes, a newline, then the text (``'"Ovel River"\nThe Ovel
is ...'``). Files ending in ``.gz`` are read through gzip.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["CorpusFormatError", "Document", "open_text", "read_corpus"]

Document = dict[str, Any]
"""One corpus row: at least ``"id"`` (str) and ``"contents"`` (str); other fields are kept as they are."""


class CorpusFormatError(ValueError):
    """A corpus file has a row that is not a JSON object with a string ``contents``; the message names the line."""


def open_text(path: str | Path) -> IO[str]:
    """Open a UTF-8 text file for reading, decompressing it when its name ends in ``.gz``."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_corpus(path: str | Path) -> Iterator[Document]:
    """Yield the corpus rows of ``path`` in file order, skipping blank lines.

    A row without ``"id"`` gets its 0-based row number as its id (a string), so any JSON-lines file of
    ``{"contents": ...}`` objects can be indexed.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CorpusFormatError: A line is not valid JSON, not an object, or lacks a string ``contents``.
    """
    with open_text(path) as lines:
        row_number = 0
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            yield _parse_row(line, f"{path}:{line_number}", row_number)
            row_number += 1


def _parse_row(line: str, where: str, row_number: int) -> Document:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusFormatError(f"{where}: not valid JSON ({exc.msg})") from exc
    if not isinstance(row, dict):
        raise CorpusFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if not isinstance(row.get("contents"), str):
        raise CorpusFormatError(f'{where}: a corpus row needs a string "contents" field; it has keys {sorted(row)}')
    row["id"] = str(row.get("id", row_number))
    return row
