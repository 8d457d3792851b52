r"""Render query result rows as text laid out like ``pandas.DataFrame(rows).to_string(index=False)``.

The SQL tool shows results to the model in the layout skyrl-gym 0.4 produced with pandas, because models
trained on those observations expect it. This module reproduces that layout for rows of SQLite values
(``int``, ``float``, ``str``, ``bytes``, ``None``) without depending on pandas. The reference is pandas 3.x with
its default display options; ``tests/envs/test_table_format.py`` compares the two byte for byte. (pandas 2.x
differs in one respect: it shows a missing value in an all-text column as ``None``, where 3.x shows ``NaN``.)

The layout, for rows that all have the same length:

* Columns are labelled ``0, 1, 2, ...``. Each column gets the dtype pandas would infer for its values (see
  :func:`column_kind`), which decides how its cells and its label are written.
* A column's width is that of its longest cell or label; cells and labels are right-justified to it.
  Columns are joined by one space, lines by ``"\n"``; there is no trailing newline.
* No rows (or rows without values) give pandas' empty-frame text, e.g.
  ``"Empty DataFrame\nColumns: []\nIndex: []"``.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Sequence

__all__ = ["ColumnKind", "column_kind", "format_table"]

# pandas' display.precision: digits after the decimal point for floats.
_PRECISION = 6
# pandas lists at most display.max_seq_items (100) labels in the empty-frame text, then "...".
_MAX_LISTED_LABELS = 100
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
# A plain fixed-point number ("-12.3400"); only these have trailing zeros trimmed.
_PLAIN_DECIMAL = re.compile(r"\s*[+-]?[0-9]+\.[0-9]*")
# Control characters pandas writes as escapes so that a cell stays on one line.
_ESCAPES = str.maketrans({"\t": "\\t", "\n": "\\n", "\r": "\\r"})


class ColumnKind(enum.Enum):
    """The pandas dtype of a column, as far as formatting is concerned."""

    INT = "int64"  # also uint64: all values ints in range, none missing
    BOOL = "bool"  # all values bools, none missing
    FLOAT = "float64"  # ints and floats with missing values or floats: missing cells read "NaN"
    STRING = "str"  # strings and missing values: missing cells read "NaN"
    OBJECT = "object"  # anything else: None reads "None", NaN reads "NaN", other values str()


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints_fit_one_dtype(ints: Sequence[int]) -> bool:
    """Whether pandas can hold these ints in int64 or uint64 (else it keeps Python objects)."""
    if any(v < _INT64_MIN or v > _UINT64_MAX for v in ints):
        return False
    return not (any(v < 0 for v in ints) and any(v > _INT64_MAX for v in ints))


def column_kind(values: Sequence[object]) -> ColumnKind:
    """The dtype pandas infers for one column built from a list of row tuples.

    ``None`` and float NaN are missing values. A column of only ``None`` stays ``OBJECT``; NaN counts as a
    float. Only ``int``, ``float``, ``bool``, ``str`` and ``None`` lead to a non-object dtype; ``bytes`` and any
    other type make the column ``OBJECT``.
    """
    present = [v for v in values if v is not None and not _is_nan(v)]
    has_nan = any(_is_nan(v) for v in values)
    if not present:
        return ColumnKind.FLOAT if has_nan else ColumnKind.OBJECT
    if all(isinstance(v, str) for v in present):
        return ColumnKind.STRING
    if all(isinstance(v, bool) for v in present):
        return ColumnKind.BOOL if len(present) == len(values) else ColumnKind.OBJECT
    if not all(_is_int(v) or isinstance(v, float) for v in present):
        return ColumnKind.OBJECT
    ints = [v for v in present if isinstance(v, int)]
    if not _ints_fit_one_dtype(ints):
        return ColumnKind.OBJECT
    return ColumnKind.INT if len(ints) == len(values) else ColumnKind.FLOAT


def _escape(text: str) -> str:
    return text.translate(_ESCAPES)


def _trim_zeros_single(text: str) -> str:
    """Drop trailing zeros of one fixed-point number, keeping one digit after the point."""
    text = text.rstrip("0")
    return text + "0" if text.endswith(".") else text


def _trim_shared_zeros(texts: list[str]) -> list[str]:
    """Drop trailing zeros from all plain decimals of a column while every one of them ends in zero.

    Trimming equally keeps the decimal points of a column aligned; at least one digit stays after the point.
    """
    is_plain = [_PLAIN_DECIMAL.fullmatch(t) is not None for t in texts]
    if not any(is_plain):
        return texts
    while all(t.endswith("0") for t, plain in zip(texts, is_plain, strict=True) if plain):
        texts = [t[:-1] if plain else t for t, plain in zip(texts, is_plain, strict=True)]
    return [t + "0" if plain and t.endswith(".") else t for t, plain in zip(texts, is_plain, strict=True)]


def _float_texts(values: Sequence[float | None], style: str) -> list[str]:
    """Each value with ``_PRECISION`` digits in ``style`` ("f" or "e"), missing values as "NaN", zeros trimmed."""
    texts = ["NaN" if v is None or math.isnan(v) else f"{v:.{_PRECISION}{style}}" for v in values]
    return _trim_shared_zeros(texts)


def _format_float_column(values: Sequence[float | None]) -> list[str]:
    """Fixed-point with shared zero trimming; scientific when values would print as 0 or are huge and wide."""
    fixed = _float_texts(values, "f")
    magnitudes = [abs(v) for v in values if v is not None and not math.isnan(v)]
    too_wide = max((len(t) for t in fixed), default=0) > _PRECISION + 6
    has_large = any(m > 1e6 for m in magnitudes)
    has_small = any(0 < m < 10**-_PRECISION for m in magnitudes)
    if has_small or (too_wide and has_large):
        return _float_texts(values, "e")
    return fixed


def _as_float(value: object) -> float | None:
    """A FLOAT column's value as a float (``None`` when missing)."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    raise TypeError(f"not a number: {value!r}")


def _format_object_cell(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, float):
        # Floats among other types are written one by one, with a sign column (" 1.5", "-1.5").
        return "NaN" if math.isnan(value) else _trim_zeros_single(f"{value: .{_PRECISION}f}")
    return _escape(str(value))


def _format_column(values: Sequence[object], kind: ColumnKind) -> list[str]:
    """The unpadded cell texts of one column of the given kind."""
    if kind in (ColumnKind.INT, ColumnKind.BOOL):
        return [str(v) for v in values]
    if kind is ColumnKind.FLOAT:
        return _format_float_column([_as_float(v) for v in values])
    if kind is ColumnKind.STRING:
        return ["NaN" if v is None or _is_nan(v) else _escape(str(v)) for v in values]
    return [_format_object_cell(v) for v in values]


def _label(index: int, kind: ColumnKind) -> str:
    # pandas puts a space before the labels of numeric columns.
    numeric = kind in (ColumnKind.INT, ColumnKind.BOOL, ColumnKind.FLOAT)
    return f" {index}" if numeric else str(index)


def _listed(labels: Iterable[int], count: int) -> str:
    shown = [str(label) for _, label in zip(range(_MAX_LISTED_LABELS), labels, strict=False)]
    if count > _MAX_LISTED_LABELS:
        shown.append("...")
    return "[" + ", ".join(shown) + "]"


def _empty_frame_text(n_rows: int, n_cols: int) -> str:
    return f"Empty DataFrame\nColumns: {_listed(range(n_cols), n_cols)}\nIndex: {_listed(range(n_rows), n_rows)}"


def format_table(rows: Iterable[Sequence[object]], head: int | None = None) -> str:
    """Render rows as ``pandas.DataFrame(rows).head(head).to_string(index=False)`` does.

    Args:
        rows: Result rows in display order, all of the same length (e.g. ``cursor.fetchall()``).
        head: Show only the first ``head`` rows; ``None`` shows all. As with ``DataFrame.head``, each column's
            dtype is still inferred from all rows, while widths and float layout depend on the rows shown.

    Returns:
        The table text, without a trailing newline.

    Raises:
        ValueError: The rows do not all have the same length, or ``head`` is negative.
    """
    table = [tuple(row) for row in rows]
    if head is not None and head < 0:
        raise ValueError(f"head must be >= 0 or None, got {head}")
    n_cols = len(table[0]) if table else 0
    if any(len(row) != n_cols for row in table):
        raise ValueError("all rows must have the same number of values")
    shown = table if head is None else table[:head]
    if not shown or n_cols == 0:
        return _empty_frame_text(len(shown), n_cols)
    columns: list[list[str]] = []
    for index in range(n_cols):
        kind = column_kind([row[index] for row in table])
        cells = [_label(index, kind), *_format_column([row[index] for row in shown], kind)]
        width = max(len(cell) for cell in cells)
        columns.append([cell.rjust(width) for cell in cells])
    return "\n".join(" ".join(line) for line in zip(*columns, strict=True))
