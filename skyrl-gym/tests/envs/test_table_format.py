"""The SQL tool's table formatter must match pandas' ``DataFrame(rows).to_string(index=False)`` byte for byte."""

import random
from typing import Any

import pandas as pd
import pytest

from skyrl_gym.tools._table import ColumnKind, column_kind, format_table

NAN = float("nan")
INF = float("inf")


def reference(rows: list[tuple[Any, ...]], head: int | None = None) -> str:
    frame = pd.DataFrame(rows)
    if head is not None:
        frame = frame.head(head)
    return str(frame.to_string(index=False))


# Hand-picked cases for each rule: dtype inference, float layout, escapes, empty frames.
EDGE_CASES: list[list[tuple[Any, ...]]] = [
    [],
    [()],
    [(), ()],
    [(1, "a"), (22, "bb")],
    [(1, None), (None, "x")],
    [(None,), (None,)],
    [(1.5,), (2.0,)],
    [(1,), (2.5,)],
    [(1e20,), (2.5,)],
    [(1e-9,), (2.5,)],
    [(1e-7,), (0.0,)],
    [(1e6,), (1.0,)],
    [(1e6 + 0.5,), (1.0,)],
    [(1234567.0,), (1.5,)],
    [(123456.123456789,), (1.5,)],
    [(12345678.123,), (1.5,)],
    [(-0.0,), (1.0,)],
    [(INF,), (1.0,)],
    [(-INF,), (None,)],
    [(INF,), (1e-9,)],
    [(NAN,), ("a",)],
    [(NAN,), (None,)],
    [(NAN,), (1,)],
    [(NAN,), (b"x",)],
    [(NAN,), (None,), (b"x",)],
    [(None,), (b"x",)],
    [(b"ab\x00\n",), ("x",)],
    [("a\nb\tc\rd",), ("x",)],
    [("a\nb", 1), (2.5, None)],
    [(1.5, "x"), ("y", 2)],
    [(1.0, "a"), (-INF, "b")],
    [("a", 1.0), ("b", INF)],
    [("é漢字 🙂",), ("ab",)],
    [("x" * 120,), ("y",)],
    [(1,), (2**63,)],
    [(-1,), (2**63,)],
    [(None,), (2**63,)],
    [(1.5,), (2**63,)],
    [(2**64,), (1,)],
    [(None,), (2**64,)],
    [(-1,), (2**63,), (None,)],
    [(True,), (False,)],
    [(True,), (1,)],
    [(True,), (None,)],
    [(True,), (1.5,)],
    [(True,), ("a",)],
    [(1, 2, 3)],
    [(-(2**63), 2**63 - 1)],
    [(0.1 + 0.2, 1 / 3, 2 / 3)],
    [("",), ("",)],
    [(" leading", "trailing ")],
]


@pytest.mark.parametrize("rows", EDGE_CASES, ids=[str(i) for i in range(len(EDGE_CASES))])
def test_edge_cases_match_pandas(rows: list[tuple[Any, ...]]) -> None:
    assert format_table(rows) == reference(rows)


def random_value(rng: random.Random, kind: str) -> Any:
    if kind == "int":
        return rng.choice([rng.randint(-10, 10), rng.randint(-(10**6), 10**6), rng.randint(-(2**63), 2**63 - 1)])
    if kind == "float":
        return rng.choice(
            [
                round(rng.uniform(-100, 100), rng.randint(0, 8)),
                rng.uniform(-1e9, 1e9),
                rng.uniform(-1e-5, 1e-5),
                float(rng.randint(-50, 50)),
                rng.choice([0.0, -0.0, 0.5, 1e6, 1e7, 1e-6, 1e-7, 123.456, INF, -INF]),
            ]
        )
    if kind == "str":
        alphabet = "abcXYZ 019_-.,'\"\t\n\réß漢🙂"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
    if kind == "bytes":
        return bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 6)))
    return None


# Column recipes: the kinds of values one column draws from (weighted towards what SQL queries return).
RECIPES = [
    ["int"],
    ["float"],
    ["str"],
    ["int", "none"],
    ["float", "none"],
    ["int", "float"],
    ["str", "none"],
    ["none"],
    ["bytes"],
    ["bytes", "none"],
    ["int", "str"],
    ["float", "str", "none"],
    ["int", "float", "str", "bytes", "none"],
]


def random_rows(rng: random.Random) -> list[tuple[Any, ...]]:
    n_cols = rng.randint(1, 5)
    n_rows = rng.randint(1, 12)
    recipes = [rng.choice(RECIPES) for _ in range(n_cols)]
    return [tuple(random_value(rng, rng.choice(recipe)) for recipe in recipes) for _ in range(n_rows)]


@pytest.mark.parametrize("seed", range(6))
def test_random_rows_match_pandas(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        rows = random_rows(rng)
        assert format_table(rows) == reference(rows), rows


@pytest.mark.parametrize("head", [0, 1, 3])
def test_head_keeps_dtypes_of_all_rows(head: int) -> None:
    rng = random.Random(head)
    for _ in range(50):
        rows = random_rows(rng)
        rows.append(tuple(None for _ in rows[0]))  # a late NaN/None changes the dtype of every column
        assert format_table(rows, head=head) == reference(rows, head=head), rows


def test_column_kinds() -> None:
    assert column_kind([1, 2]) is ColumnKind.INT
    assert column_kind([1, None]) is ColumnKind.FLOAT
    assert column_kind([NAN]) is ColumnKind.FLOAT
    assert column_kind([None, None]) is ColumnKind.OBJECT
    assert column_kind(["a", None]) is ColumnKind.STRING
    assert column_kind([b"a", "b"]) is ColumnKind.OBJECT
    assert column_kind([True, False]) is ColumnKind.BOOL


def test_rejects_ragged_rows_and_negative_head() -> None:
    with pytest.raises(ValueError, match="same number"):
        format_table([(1, 2), (3,)])
    with pytest.raises(ValueError, match="head"):
        format_table([(1,)], head=-1)


def test_accepts_any_iterable_of_rows() -> None:
    rows = [(1, "a"), (2, "b")]
    assert format_table(iter(rows)) == format_table(rows)
    unordered = format_table(frozenset(rows)).splitlines()
    assert unordered[0] == format_table(rows).splitlines()[0]
    assert sorted(unordered[1:]) == sorted(format_table(rows).splitlines()[1:])
