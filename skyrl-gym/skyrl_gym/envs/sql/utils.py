"""Format checking and execution-match scoring for text-to-SQL responses.

A finished text-to-SQL episode reads ``<think>...</think>``, optionally ``<sql>...</sql>`` queries answered by
``<observation>...</observation>`` blocks, each followed by more thinking, and finally one
``<solution>SQL</solution>``. `compute_score_single` scores it: -1.0 for a malformed episode, otherwise
1.0 when the solution query returns the same set of rows as the reference query, else 0.0.

Queries run on a read-only connection in a worker thread and are interrupted on timeout.

Exceptions raised by `execute_sql`::

    Exception
    ├── FileNotFoundError       the database file does not exist
    └── SQLExecutionError       SQLite rejected or failed the query (including any attempted write)
        └── SQLTimeoutError     the query ran past its timeout and was interrupted
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import re
import sqlite3
import threading
from typing import Any

logger = logging.getLogger(__name__)

THINK_START, THINK_END = "<think>", "</think>"
SQL_START, SQL_END = "<sql>", "</sql>"
SOLUTION_START, SOLUTION_END = "<solution>", "</solution>"
OBS_START, OBS_END = "<observation>", "</observation>"

DEFAULT_TIMEOUT_S = 30.0
# After an interrupt SQLite stops at its next VM step; this bounds how long we wait for the worker to notice.
_INTERRUPT_GRACE_S = 1.0

# Any opening or closing think/sql/observation tag; none may appear inside the final solution.
_FORBIDDEN_IN_SOLUTION = re.compile(r"</?(?:think|sql|observation)\b", re.IGNORECASE)
# An observation that is not followed by renewed thinking. The lookahead only scans whitespace, so the
# search stays linear however many observations there are.
_OBSERVATION_WITHOUT_THINK = re.compile(r"</observation>(?!\s*<think>)", re.IGNORECASE)

Rows = frozenset[tuple[Any, ...]]
FormatResult = tuple[bool, list[str] | None, str | None, None]
_INVALID: FormatResult = (False, None, None, None)


class SQLExecutionError(Exception):
    """SQLite rejected or failed a query; the message holds SQLite's reason."""


class SQLTimeoutError(SQLExecutionError):
    """A query ran past its timeout and was interrupted."""


def _think_blocks(text: str) -> list[str]:
    """Contents of every ``<think>...</think>`` block, matched left to right without overlap."""
    blocks: list[str] = []
    position = 0
    while (start := text.find(THINK_START, position)) >= 0:
        end = text.find(THINK_END, start + len(THINK_START))
        if end < 0:
            break
        blocks.append(text[start + len(THINK_START) : end])
        position = end + len(THINK_END)
    return blocks


def verify_format_and_extract(output: str) -> FormatResult:
    """Check the format of a finished text-to-SQL episode and extract its parts.

    The episode is valid when all of these hold:

    - ``<solution>`` occurs exactly once, and ``</solution>`` exactly once after it;
    - the solution holds no ``<think>``, ``<sql>`` or ``<observation>`` tag (opening or closing, any case);
    - there is at least one complete ``<think>...</think>`` block;
    - before the solution, every ``</observation>`` is followed, after optional whitespace, by ``<think>``.

    Never raises for a string input, and runs in time linear in its length.

    Args:
        output: The full episode text (all assistant turns and observations, concatenated).

    Returns:
        ``(True, thoughts, solution_sql, None)`` where ``thoughts`` lists the raw contents of all think
        blocks and ``solution_sql`` is the stripped solution text; ``(False, None, None, None)`` when
        invalid. The constant fourth item keeps the tuple shape callers unpack.
    """
    if output.count(SOLUTION_START) != 1:
        return _INVALID
    before_solution, after_start = output.split(SOLUTION_START, 1)
    if after_start.count(SOLUTION_END) != 1:
        return _INVALID
    solution_text = after_start.split(SOLUTION_END, 1)[0]
    if _FORBIDDEN_IN_SOLUTION.search(solution_text):
        return _INVALID
    thoughts = _think_blocks(output)
    if not thoughts:
        return _INVALID
    if _OBSERVATION_WITHOUT_THINK.search(before_solution):
        return _INVALID
    return True, thoughts, solution_text.strip(), None


# Pragmas that take an argument only to name what they describe; all other pragma arguments are refused.
_SCHEMA_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)


def _authorize(action: int, arg1: str | None, arg2: str | None, db_name: str | None, trigger: str | None) -> int:
    """SQLite authorizer for the scoring connection.

    A ``mode=ro`` connection refuses writes to its database, but ``ATTACH`` and ``VACUUM INTO`` (which
    attaches its target) can still create files, and pragmas can be switched; these are denied.
    """
    del db_name, trigger
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and arg2 is not None and (arg1 or "").lower() not in _SCHEMA_PRAGMAS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _read_only_uri(db_file: str) -> str:
    """SQLite URI opening ``db_file`` read-only; the path is percent-encoded so any file name works."""
    return pathlib.Path(os.path.abspath(db_file)).as_uri() + "?mode=ro"


def _open_read_only(db_file: str) -> sqlite3.Connection:
    """Open ``db_file`` read-only for use from a worker thread; the caller owns the connection.

    Raises:
        SQLExecutionError: If SQLite cannot open the file.
    """
    try:
        conn = sqlite3.connect(_read_only_uri(db_file), uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise SQLExecutionError(f"cannot open {db_file} read-only: {exc}") from exc
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.set_authorizer(_authorize)
    except sqlite3.Error as exc:
        conn.close()
        raise SQLExecutionError(f"cannot open {db_file} read-only: {exc}") from exc
    return conn


def _run_query(conn: sqlite3.Connection, sql: str, outcome: dict[str, Any]) -> None:
    """Worker body: run ``sql`` on ``conn``, store rows or the exception in ``outcome``, close ``conn``.

    The worker owns the connection from the moment it starts, so it alone closes it; the caller only ever
    interrupts it.
    """
    try:
        cursor = conn.cursor()
        cursor.execute(sql)
        outcome["rows"] = frozenset(cursor.fetchall())
    except BaseException as exc:  # handed to the calling thread, which re-raises it
        outcome["error"] = exc
    finally:
        conn.close()


def execute_sql(db_file: str, sql: str, timeout: float = DEFAULT_TIMEOUT_S) -> Rows:
    """Run one SQL statement against a SQLite database file, read-only, with a timeout.

    The file's existence is checked with ``os.path.exists`` and the connection is opened with
    ``sqlite3.connect``, both looked up at call time, so patching either name controls this function. The
    connection is opened with ``mode=ro`` and ``PRAGMA query_only``, so every write is refused, and an
    authorizer refuses ``ATTACH``, ``DETACH``, ``VACUUM INTO`` and pragma changes, which could otherwise
    create files. The query runs in a daemon worker thread; on timeout the connection is interrupted.

    Args:
        db_file: Path of the SQLite database file.
        sql: A single SQL statement.
        timeout: Seconds the query may run, fetching included.

    Returns:
        The set of result rows (row order and duplicates are ignored, as in execution-match scoring).

    Raises:
        FileNotFoundError: If ``db_file`` does not exist.
        SQLExecutionError: If SQLite fails the query, e.g. a syntax error, a missing table or a write.
        SQLTimeoutError: If the query did not finish within ``timeout`` seconds.
    """
    if not os.path.exists(db_file):
        raise FileNotFoundError(f"SQLite database not found: {db_file}")
    conn = _open_read_only(db_file)
    outcome: dict[str, Any] = {}
    worker = threading.Thread(target=_run_query, args=(conn, sql, outcome), name="sql-query", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        # The worker may finish and close the connection between the check and the interrupt.
        with contextlib.suppress(sqlite3.ProgrammingError):
            conn.interrupt()
        worker.join(_INTERRUPT_GRACE_S)
        raise SQLTimeoutError(f"query exceeded {timeout} s and was interrupted: {sql[:200]}")
    error = outcome.get("error")
    if isinstance(error, sqlite3.Error):
        raise SQLExecutionError(str(error)) from error
    if error is not None:
        raise error
    rows: Rows = outcome["rows"]
    return rows


def compute_score_single(
    completion: str, reference_sql: str, db_file: str, timeout: float = DEFAULT_TIMEOUT_S
) -> float:
    """Score a finished text-to-SQL episode by execution match.

    Args:
        completion: The full episode text, checked with `verify_format_and_extract`.
        reference_sql: The gold query.
        db_file: Path of the SQLite database both queries run against.
        timeout: Seconds each query may run.

    Returns:
        -1.0 if the format is invalid; 1.0 if the predicted and gold queries return the same set of rows;
        0.0 otherwise, including when either query fails, times out or the database is missing.
    """
    is_valid, _, predicted_sql, _ = verify_format_and_extract(completion)
    if not is_valid or predicted_sql is None:
        return -1.0
    try:
        predicted_rows = execute_sql(db_file, predicted_sql, timeout)
        gold_rows = execute_sql(db_file, reference_sql, timeout)
    except Exception as exc:  # a reward must never crash a rollout; a failing query simply earns nothing
        logger.debug("SQL execution failed while scoring (%s): %s", type(exc).__name__, exc)
        return 0.0
    return 1.0 if predicted_rows == gold_rows else 0.0
