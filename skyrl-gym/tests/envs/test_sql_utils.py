import hashlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from skyrl_gym.envs.sql.utils import (
    SQLExecutionError,
    SQLTimeoutError,
    compute_score_single,
    execute_sql,
    verify_format_and_extract,
)

INFINITE_QUERY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture
def db_file(tmp_path: Path) -> str:
    path = tmp_path / "concert_singer.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER);
        INSERT INTO singer VALUES (1, 'Joe', 'France', 52), (2, 'Ana', 'Spain', 29),
                                  (3, 'Li', 'France', 41), (4, 'Émilie', 'France', 29);
        """
    )
    conn.commit()
    conn.close()
    return str(path)


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def episode(solution: str, *, observation: bool = False) -> str:
    turns = "<think>I should inspect the singers.</think>\n"
    if observation:
        turns += "<sql>SELECT * FROM singer</sql>\n<observation>4 rows</observation>\n<think>Now count.</think>\n"
    return turns + f"<solution>{solution}</solution>"


# ---------------------------------------------------------------- verify_format_and_extract


def test_valid_minimal_episode() -> None:
    assert verify_format_and_extract("<think>plan</think>\n<solution> SELECT 1 </solution>") == (
        True,
        ["plan"],
        "SELECT 1",
        None,
    )


def test_valid_episode_with_observation_and_all_thoughts() -> None:
    valid, thoughts, sql, extra = verify_format_and_extract(episode("SELECT name FROM singer", observation=True))
    assert valid is True
    assert thoughts == ["I should inspect the singers.", "Now count."]
    assert sql == "SELECT name FROM singer"
    assert extra is None


def test_whitespace_between_observation_and_think_is_allowed() -> None:
    text = "<think>a</think><observation>x</observation> \n\t <THINK>b</think><solution>q</solution>"
    assert verify_format_and_extract(text)[0] is True


@pytest.mark.parametrize(
    "text",
    [
        "",
        "SELECT 1",
        "<think>a</think>",
        "<think>a</think><solution>SELECT 1",
        "<think>a</think>SELECT 1</solution>",
        "<think>a</think></solution><solution>SELECT 1",
        "<think>a</think><solution>SELECT 1</solution><solution>SELECT 2</solution>",
        "<think>a</think><solution>SELECT 1</solution></solution>",
        "<solution>SELECT 1</solution>",
        "<think>unclosed <solution>SELECT 1</solution>",
        "</think>reversed<think><solution>SELECT 1</solution>",
        "<think>a</think><solution><think>b</think>SELECT 1</solution>",
        "<think>a</think><solution>SELECT 1</think></solution>",
        "<think>a</think><solution><sql>SELECT 1</sql></solution>",
        "<think>a</think><solution>SELECT 1 </SQL></solution>",
        "<think>a</think><solution><observation>SELECT 1</solution>",
        "<think>a</think><solution>SELECT 1<sql ></solution>",
        "<think>a</think><sql>q</sql><observation>r</observation><solution>SELECT 1</solution>",
        "<think>a</think><observation>r</observation>text<think>b</think><solution>SELECT 1</solution>",
        "<think>a</think><observation>r</observation><think>b</think><observation>s</observation>"
        "<solution>SELECT 1</solution>",
    ],
)
def test_invalid_formats(text: str) -> None:
    assert verify_format_and_extract(text) == (False, None, None, None)


def test_similar_words_inside_solution_are_fine() -> None:
    text = "<think>a</think><solution>SELECT sqlite_version(), '<thinking>'</solution>"
    valid, _, sql, _ = verify_format_and_extract(text)
    assert valid is True
    assert sql == "SELECT sqlite_version(), '<thinking>'"


def test_unicode_solution() -> None:
    text = "<think>même</think><solution>SELECT name FROM singer WHERE name = 'Émilie'</solution>"
    assert verify_format_and_extract(text)[2] == "SELECT name FROM singer WHERE name = 'Émilie'"


@pytest.mark.parametrize(
    "hostile",
    [
        "<think>" * 15_000,
        "</observation>" * 7_000 + "<think>a</think><solution>x</solution>",
        "<think>a</think>" + "</observation>" + " " * 100_000 + "<solution>x</solution>",
        "<solution>" + "<" * 100_000 + "</solution><think>a</think>",
        "x" * 100_000,
    ],
)
def test_hostile_inputs_are_fast_and_never_raise(hostile: str) -> None:
    start = time.perf_counter()
    result = verify_format_and_extract(hostile)
    assert len(result) == 4
    assert time.perf_counter() - start < 2.0


# ---------------------------------------------------------------- execute_sql


def test_execute_returns_frozenset_of_rows(db_file: str) -> None:
    rows = execute_sql(db_file, "SELECT name, age FROM singer WHERE country = 'France'", timeout=5)
    assert rows == frozenset({("Joe", 52), ("Li", 41), ("Émilie", 29)})
    assert isinstance(rows, frozenset)


def test_execute_ignores_order_and_duplicates(db_file: str) -> None:
    assert execute_sql(db_file, "SELECT country FROM singer ORDER BY id DESC", 5) == frozenset(
        {("France",), ("Spain",)}
    )


def test_execute_missing_database(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        execute_sql(str(tmp_path / "absent.sqlite"), "SELECT 1", 5)
    assert not (tmp_path / "absent.sqlite").exists()


@pytest.mark.parametrize(
    "bad_sql", ["SELEC name FROM singer", "SELECT * FROM nowhere", "SELECT 1; SELECT 2", "SELECT nope FROM singer"]
)
def test_execute_sqlite_errors(db_file: str, bad_sql: str) -> None:
    with pytest.raises(SQLExecutionError):
        execute_sql(db_file, bad_sql, 5)


def test_execute_on_directory_or_non_database(tmp_path: Path) -> None:
    with pytest.raises(SQLExecutionError, match="cannot open"):
        execute_sql(str(tmp_path), "SELECT 1", 5)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_text("this is not a database " * 100)
    with pytest.raises(SQLExecutionError, match="not a database"):
        execute_sql(str(garbage), "SELECT name FROM sqlite_master", 5)


def test_execute_empty_statement_returns_no_rows(db_file: str) -> None:
    assert execute_sql(db_file, "", 5) == frozenset()
    assert execute_sql(db_file, "-- only a comment", 5) == frozenset()


def test_execute_times_out_and_interrupts(db_file: str) -> None:
    start = time.perf_counter()
    with pytest.raises(SQLTimeoutError, match="interrupted"):
        execute_sql(db_file, INFINITE_QUERY, timeout=0.3)
    assert time.perf_counter() - start < 3.0
    # The interrupt stopped the query, so its worker thread has ended rather than running on.
    assert not [t for t in threading.enumerate() if t.name == "sql-query" and t.is_alive()]


def test_timeout_is_an_execution_error() -> None:
    assert issubclass(SQLTimeoutError, SQLExecutionError)


@pytest.mark.parametrize(
    "write_sql",
    [
        "INSERT INTO singer VALUES (5, 'Bo', 'Chad', 30)",
        "UPDATE singer SET age = 0",
        "DELETE FROM singer",
        "DROP TABLE singer",
        "CREATE TABLE t (a)",
        "CREATE TEMP TABLE t (a)",
        "CREATE INDEX i ON singer (age)",
        "PRAGMA journal_mode = WAL",
        "PRAGMA query_only = OFF",
        "REPLACE INTO singer VALUES (1, 'X', 'Y', 1)",
        "VACUUM",
    ],
)
def test_writes_are_refused(db_file: str, write_sql: str) -> None:
    before = _digest(db_file)
    with pytest.raises(SQLExecutionError):
        execute_sql(db_file, write_sql, 5)
    assert _digest(db_file) == before
    assert execute_sql(db_file, "SELECT count(*), sum(age) FROM singer", 5) == frozenset({(4, 151)})


def test_attach_and_vacuum_into_cannot_create_files(db_file: str, tmp_path: Path) -> None:
    target = tmp_path / "created.sqlite"
    for sql in (f"ATTACH DATABASE '{target}' AS other", f"VACUUM INTO '{target}'"):
        with pytest.raises(SQLExecutionError):
            execute_sql(db_file, sql, 5)
    assert not target.exists()


def test_schema_pragmas_are_allowed(db_file: str) -> None:
    columns = execute_sql(db_file, "PRAGMA table_info(singer)", 5)
    assert {row[1] for row in columns} == {"id", "name", "country", "age"}


def test_path_with_special_characters(tmp_path: Path) -> None:
    path = tmp_path / "odd name #1 ?%.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a)")
    conn.execute("INSERT INTO t VALUES ('ok')")
    conn.commit()
    conn.close()
    assert execute_sql(str(path), "SELECT a FROM t", 5) == frozenset({("ok",)})


def test_patching_os_path_exists_controls_the_check(db_file: str) -> None:
    with mock.patch("os.path.exists", return_value=False) as exists, pytest.raises(FileNotFoundError):
        execute_sql(db_file, "SELECT 1", 5)
    exists.assert_called_with(db_file)


def test_patching_sqlite3_connect_controls_the_connection(tmp_path: Path) -> None:
    real_connect = sqlite3.connect
    calls: list[tuple[object, dict[str, object]]] = []

    def fake_connect(database: object, **kwargs: object) -> sqlite3.Connection:
        calls.append((database, kwargs))
        conn = real_connect(":memory:", check_same_thread=False)
        conn.execute("CREATE TABLE t (a)")
        conn.execute("INSERT INTO t VALUES (7)")
        return conn

    fake_path = str(tmp_path / "virtual.sqlite")
    with mock.patch("sqlite3.connect", side_effect=fake_connect), mock.patch("os.path.exists", return_value=True):
        assert execute_sql(fake_path, "SELECT a FROM t", 5) == frozenset({(7,)})
    assert len(calls) == 1
    assert "virtual.sqlite" in str(calls[0][0])


def test_mock_connection_like_upstream_tests(tmp_path: Path) -> None:
    with (
        mock.patch("skyrl_gym.envs.sql.utils.sqlite3.connect") as connect,
        mock.patch("skyrl_gym.envs.sql.utils.os.path.exists", return_value=True),
    ):
        connect.return_value.cursor.return_value.fetchall.return_value = [(1, "a"), (1, "a"), (2, "b")]
        assert execute_sql("/no/such/db.sqlite", "SELECT x", 5) == frozenset({(1, "a"), (2, "b")})
        connect.return_value.cursor.return_value.execute.assert_called_once_with("SELECT x")
        connect.return_value.close.assert_called_once()


def test_connection_is_closed_after_each_query(db_file: str) -> None:
    real_connect = sqlite3.connect
    opened: list[sqlite3.Connection] = []

    def tracking_connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn: sqlite3.Connection = real_connect(*args, **kwargs)  # type: ignore[call-overload]
        opened.append(conn)
        return conn

    with mock.patch("sqlite3.connect", side_effect=tracking_connect):
        execute_sql(db_file, "SELECT 1", 5)
        with pytest.raises(SQLExecutionError):
            execute_sql(db_file, "SELECT * FROM nowhere", 5)
    assert len(opened) == 2
    for conn in opened:
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")


# ---------------------------------------------------------------- compute_score_single


def test_score_invalid_format_is_minus_one(db_file: str) -> None:
    assert compute_score_single("SELECT name FROM singer", "SELECT name FROM singer", db_file) == -1.0
    assert compute_score_single("<solution>SELECT 1</solution>", "SELECT 1", "/missing.sqlite") == -1.0


def test_score_matching_results(db_file: str) -> None:
    gold = "SELECT name FROM singer WHERE age < 30"
    assert compute_score_single(episode("SELECT name FROM singer WHERE age <= 29 ORDER BY name"), gold, db_file) == 1.0
    assert compute_score_single(episode(gold, observation=True), gold, db_file) == 1.0


def test_score_compares_sets_of_rows(db_file: str) -> None:
    assert (
        compute_score_single(episode("SELECT country FROM singer"), "SELECT DISTINCT country FROM singer", db_file)
        == 1.0
    )


def test_score_different_results(db_file: str) -> None:
    assert compute_score_single(episode("SELECT name FROM singer"), "SELECT age FROM singer", db_file) == 0.0
    assert compute_score_single(episode("SELECT name, age FROM singer"), "SELECT name FROM singer", db_file) == 0.0


def test_score_failing_queries_are_zero(db_file: str, tmp_path: Path) -> None:
    assert compute_score_single(episode("SELECT * FROM nowhere"), "SELECT 1", db_file) == 0.0
    assert compute_score_single(episode("SELECT 1"), "SELECT * FROM nowhere", db_file) == 0.0
    assert compute_score_single(episode("SELECT 1"), "SELECT 1", str(tmp_path / "absent.sqlite")) == 0.0
    assert compute_score_single(episode("DELETE FROM singer"), "SELECT 1", db_file) == 0.0


def test_score_timeout_is_zero(db_file: str) -> None:
    start = time.perf_counter()
    assert compute_score_single(episode(INFINITE_QUERY), "SELECT 1", db_file, timeout=0.3) == 0.0
    assert time.perf_counter() - start < 3.0


def test_score_does_not_modify_database(db_file: str) -> None:
    before = _digest(db_file)
    compute_score_single(episode("DROP TABLE singer"), "DROP TABLE singer", db_file)
    assert _digest(db_file) == before
    assert os.path.exists(db_file)
