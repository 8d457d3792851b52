"""Run one SQL statement on a SQLite database file: read-only, in a worker thread, interrupted on timeout.

The SQL tool (:mod:`skyrl_gym.tools.sql`) answers the model's queries with it, and the text-to-SQL env
(:mod:`skyrl_gym.envs.sql.utils`, which re-exports these names) scores episodes with it.

Exceptions raised by :func:`execute_sql`::

    Exception
    ├── FileNotFoundError       the database file does not exist
    └── SQLExecutionError       SQLite rejected or failed the query (including any attempted write)
        └── SQLTimeoutError     the query ran past its timeout and was interrupted
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sqlite3
import threading
from typing import Any

__all__ = ["DEFAULT_TIMEOUT_S", "Rows", "SQLExecutionError", "SQLTimeoutError", "execute_sql"]

DEFAULT_TIMEOUT_S = 30.0
# After an interrupt SQLite stops at its next VM step; this bounds how long we wait for the worker to notice.
_INTERRUPT_GRACE_S = 1.0

Rows = frozenset[tuple[Any, ...]]


class SQLExecutionError(Exception):
    """SQLite rejected or failed a query; the message holds SQLite's reason."""


class SQLTimeoutError(SQLExecutionError):
    """A query ran past its timeout and was interrupted."""


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
