import hashlib
import shutil
import sqlite3
import time
from pathlib import Path
from unittest import mock

import pytest

import skyrl_gym.tools
from skyrl_gym.envs.sql.data import DB_IDS, bundled_db_path
from skyrl_gym.tools._table import format_table
from skyrl_gym.tools.sql import (
    INVALID_ACTION_MESSAGE,
    MAX_RESULT_CHARS,
    TRUNCATED_ROWS,
    TRUNCATION_NOTE,
    SQLCodeExecutorToolGroup,
    observation,
)

RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def wrap(result: str, turns_left: int) -> str:
    return (
        f"\n\n<observation>{result}\n<reminder>You have {turns_left} turns left to complete the task."
        "</reminder></observation>\n\n"
    )


@pytest.fixture
def db_dir(tmp_path: Path) -> Path:
    """A private copy of the bundled databases, so no test can touch the shipped files."""
    shutil.copytree(bundled_db_path(), tmp_path / "dbs")
    return tmp_path / "dbs"


@pytest.fixture
def group(db_dir: Path) -> SQLCodeExecutorToolGroup:
    return SQLCodeExecutorToolGroup(db_file_path=str(db_dir))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_group_shape(group: SQLCodeExecutorToolGroup, db_dir: Path) -> None:
    assert group.get_name() == "SQLCodeExecutorToolGroup"
    assert group.get_tool_names() == ["sql"]
    assert group.get_tool_to_group_mapping() == {"sql": "SQLCodeExecutorToolGroup"}
    assert group.db_file("school") == str(db_dir / "school" / "school.sqlite")
    assert skyrl_gym.tools.SQLCodeExecutorToolGroup is SQLCodeExecutorToolGroup
    assert SQLCodeExecutorToolGroup(db_dir).db_file_path == str(db_dir)  # a Path works too


def test_observation_wrapper_is_byte_exact() -> None:
    assert observation("x", 2) == wrap("x", 2)


def test_missing_query_gets_the_invalid_action_message(group: SQLCodeExecutorToolGroup) -> None:
    assert group.execute_tool("sql", "bookstore", None, 4) == wrap(INVALID_ACTION_MESSAGE, 4)
    assert INVALID_ACTION_MESSAGE == (
        "Your previous action is invalid. Follow the format of outputting thinking process and sql tool, and try again."
    )


def test_result_table(group: SQLCodeExecutorToolGroup) -> None:
    assert group.execute_tool("sql", "bookstore", "SELECT COUNT(*) FROM books", 3) == wrap("  0\n120", 3)
    query = "SELECT airport_code, elevation_ft FROM airports WHERE country = 'USA'"
    out = group.execute_tool("sql", "flights", query, 1)
    assert out == wrap("  0    1\nDEN 5434\nJFK   13\nLAX  125\nORD  672", 1)


def test_result_rows_are_sorted_and_deduplicated(group: SQLCodeExecutorToolGroup) -> None:
    query = "SELECT genre FROM books"  # 120 rows, 7 distinct genres
    out = group.sql("bookstore", query, 2)
    lines = out.split("<observation>")[1].split("\n<reminder>")[0].splitlines()
    assert lines[1:] == sorted(lines[1:], key=str.strip)
    assert len(lines) == 1 + 7
    assert group.sql("bookstore", query, 2) == out  # same query, same observation


def test_mixed_value_types(group: SQLCodeExecutorToolGroup) -> None:
    query = "SELECT 1, 2.5, 'a', NULL, x'00ff' UNION ALL SELECT NULL, NULL, NULL, NULL, 'text'"
    # NULL rows sort first; the result is laid out as pandas would lay it out.
    expected = format_table([(None, None, None, None, "text"), (1, 2.5, "a", None, b"\x00\xff")])
    assert expected == "  0   1   2    3           4\nNaN NaN NaN None        text\n1.0 2.5   a None b'\\x00\\xff'"
    assert group.sql("school", query, 1) == wrap(expected, 1)


def test_long_results_are_cut_to_the_first_rows(group: SQLCodeExecutorToolGroup) -> None:
    query = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 600) "
        "SELECT x, 'a moderately long padding string' FROM n"
    )
    rows = [(x, "a moderately long padding string") for x in range(1, 601)]
    assert len(format_table(rows)) > MAX_RESULT_CHARS
    out = group.sql("school", query, 2)
    assert out == wrap(TRUNCATION_NOTE + format_table(rows, head=TRUNCATED_ROWS), 2)
    table = out.split(TRUNCATION_NOTE)[1].split("\n<reminder>")[0]
    assert len(table.splitlines()) == 1 + 50


def test_short_results_are_not_cut(group: SQLCodeExecutorToolGroup) -> None:
    out = group.sql("school", "SELECT student_id FROM students", 2)
    assert TRUNCATION_NOTE not in out
    assert len(out.split("<observation>")[1].split("\n<reminder>")[0].splitlines()) == 1 + 150


def test_timeout_interrupts_a_runaway_query(group: SQLCodeExecutorToolGroup) -> None:
    start = time.monotonic()
    out = group.sql("school", RUNAWAY, 3, timeout=0.5)
    assert time.monotonic() - start < 5
    assert out == wrap(f"SQL Timeout:\n{RUNAWAY}", 3)


def test_timeout_is_positional_as_in_upstream(group: SQLCodeExecutorToolGroup) -> None:
    assert group.execute_tool("sql", "school", RUNAWAY, 3, 0.3).startswith("\n\n<observation>SQL Timeout:\n")


@pytest.mark.parametrize(
    "query",
    [
        "DELETE FROM books",
        "DROP TABLE books",
        "UPDATE books SET price = 0",
        "INSERT INTO authors VALUES (999, 'X', 'Y', 1900)",
        "CREATE TABLE t (x)",
        "ATTACH DATABASE 'other.sqlite' AS other",
        "VACUUM INTO 'copy.sqlite'",
        "PRAGMA journal_mode = WAL",
        "PRAGMA user_version = 7",
    ],
)
def test_writes_are_refused(group: SQLCodeExecutorToolGroup, db_dir: Path, query: str) -> None:
    db_file = db_dir / "bookstore" / "bookstore.sqlite"
    before = digest(db_file)
    out = group.sql("bookstore", query, 2)
    assert out.startswith("\n\n<observation>Error executing SQL: ")
    assert digest(db_file) == before
    assert sorted(p.name for p in db_file.parent.iterdir()) == ["bookstore.sqlite"]
    assert group.sql("bookstore", "SELECT COUNT(*) FROM books", 1) == wrap("  0\n120", 1)


@pytest.mark.parametrize(
    "query",
    ["SELEC 1", "SELECT * FROM no_such_table", "SELECT 1; SELECT 2", "SELECT 1\x00", "SELECT '\ud800'", "", "   "],
)
def test_bad_queries_are_reported_not_raised(group: SQLCodeExecutorToolGroup, query: str) -> None:
    out = group.sql("bookstore", query, 2)
    assert out.startswith("\n\n<observation>")
    assert out.endswith("</observation>\n\n")


def test_syntax_error_message(group: SQLCodeExecutorToolGroup) -> None:
    out = group.sql("bookstore", "SELECT * FROM no_such_table", 2)
    assert out == wrap("Error executing SQL: no such table: no_such_table", 2)


def test_missing_database_raises(group: SQLCodeExecutorToolGroup) -> None:
    with pytest.raises(FileNotFoundError):
        group.sql("no_such_db", "SELECT 1", 2)


def test_one_connection_per_query_through_patchable_names(group: SQLCodeExecutorToolGroup) -> None:
    real_connect = sqlite3.connect
    with mock.patch("sqlite3.connect", side_effect=real_connect) as connect:
        group.sql("school", "SELECT 1", 2)
        group.sql("school", "SELECT 2", 2)
    assert connect.call_count == 2
    with mock.patch("os.path.exists", return_value=False), pytest.raises(FileNotFoundError):
        group.sql("school", "SELECT 1", 2)


@pytest.mark.parametrize("db_id", DB_IDS)
def test_every_bundled_database_answers(group: SQLCodeExecutorToolGroup, db_id: str) -> None:
    out = group.sql(db_id, "SELECT name FROM sqlite_master WHERE type = 'table'", 5)
    assert out.count("\n") >= 5
