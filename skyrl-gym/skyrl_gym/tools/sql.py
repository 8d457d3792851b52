r"""``SQLCodeExecutorToolGroup``: run a model's SQL query on a SQLite database and describe the result.

The tool's answer is always one observation block, worded as in skyrl-gym 0.4 so that prompts and models
written for it keep working::

    "\n\n<observation>" + result
    + "\n<reminder>You have {turns_left} turns left to complete the task.</reminder></observation>\n\n"

where ``result`` is the result table (laid out like ``pandas.DataFrame(rows).to_string(index=False)``), the
invalid-action message when no query was given, ``"SQL Timeout:\n{sql}"`` when the query ran too long, or
``"Error executing SQL: {reason}"`` when SQLite rejected it (every write is rejected: the database is opened
read-only).
"""

from __future__ import annotations

import math
import os
from typing import Any

from skyrl_gym.tools._table import format_table
from skyrl_gym.tools.core import ToolGroup, tool
from skyrl_gym.tools.sql_execution import Rows, SQLExecutionError, SQLTimeoutError, execute_sql

__all__ = [
    "INVALID_ACTION_MESSAGE",
    "MAX_RESULT_CHARS",
    "TRUNCATED_ROWS",
    "TRUNCATION_NOTE",
    "SQLCodeExecutorToolGroup",
    "format_result",
    "observation",
]

INVALID_ACTION_MESSAGE = (
    "Your previous action is invalid. Follow the format of outputting thinking process and sql tool, and try again."
)
"""The result text when the model's turn held no ``<sql>...</sql>`` query."""

MAX_RESULT_CHARS = 9000
"""A result table longer than this (in characters) is cut to its first :data:`TRUNCATED_ROWS` rows."""

TRUNCATED_ROWS = 50
"""How many rows a cut table keeps."""

TRUNCATION_NOTE = "Truncated to 50 lines since returned response too long: "
"""Put before a cut table, so the model knows it sees only part of the result."""


def observation(result: str, turns_left: int) -> str:
    """Wrap a tool result in the observation block the model sees, with the turn-budget reminder."""
    reminder = f"<reminder>You have {turns_left} turns left to complete the task.</reminder>"
    return f"\n\n<observation>{result}\n{reminder}</observation>\n\n"


def _cell_key(value: object) -> tuple[int, Any]:
    """Sort key of one value: NULL < numbers < text < blobs (as SQLite orders them), then by value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        # SQLite returns NaN as NULL; sorting NaN among numbers would make the order depend on input order.
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, bytes):
        return (3, value)
    return (4, repr(value))


def _row_key(row: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    return tuple(_cell_key(value) for value in row)


def format_result(rows: Rows) -> str:
    """The result table for a set of rows, cut to its first rows (with a note) when it is too long.

    Rows come as a set (row order and duplicates do not count in execution-match scoring); they are shown in a
    fixed order (NULL < numbers < text < blobs, column by column) so the same query always yields the same observation.
    """
    ordered = sorted(rows, key=_row_key)
    text = format_table(ordered)
    if len(text) > MAX_RESULT_CHARS:
        text = TRUNCATION_NOTE + format_table(ordered, head=TRUNCATED_ROWS)
    return text


class SQLCodeExecutorToolGroup(ToolGroup):
    """Tool group with one tool, ``sql``, that queries the SQLite databases under one directory.

    Attributes:
        db_file_path: Directory holding the databases; database ``db_id`` is ``{db_file_path}/{db_id}/{db_id}.sqlite``.
    """

    def __init__(self, db_file_path: str | os.PathLike[str]) -> None:
        self.db_file_path = os.fspath(db_file_path)
        super().__init__(name="SQLCodeExecutorToolGroup")

    def db_file(self, db_id: str) -> str:
        """Path of the database file of ``db_id``."""
        return os.path.join(self.db_file_path, db_id, f"{db_id}.sqlite")

    @tool
    def sql(self, db_id: str, sql: str | None, turns_left: int, timeout: float = 5) -> str:
        """Run ``sql`` read-only on database ``db_id`` and return the observation block for the model.

        Args:
            db_id: The database to query.
            sql: One SQL statement, or ``None`` when the model's turn held no query.
            turns_left: Turns the model has left, quoted in the reminder.
            timeout: Seconds the query may run before it is interrupted.

        Returns:
            The observation block (see the module docstring). SQL errors, writes and timeouts are reported in it.

        Raises:
            FileNotFoundError: The database file does not exist (a configuration error, not the model's).
        """
        result = INVALID_ACTION_MESSAGE if sql is None else self._run(db_id, sql, timeout)
        return observation(result, turns_left)

    def _run(self, db_id: str, sql: str, timeout: float) -> str:
        try:
            rows = execute_sql(self.db_file(db_id), sql, timeout)
        except SQLTimeoutError:
            return f"SQL Timeout:\n{sql}"
        except (SQLExecutionError, ValueError) as exc:
            # ValueError: text SQLite cannot take, e.g. lone surrogates in the query.
            return f"Error executing SQL: {exc}"
        return format_result(rows)
