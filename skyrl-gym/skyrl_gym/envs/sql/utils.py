"""Format checking and execution-match scoring for text-to-SQL responses.

A finished text-to-SQL episode reads ``<think>...</think>``, optionally ``<sql>...</sql>`` queries answered by
``<observation>...</observation>`` blocks, each followed by more thinking, and finally one
``<solution>SQL</solution>``. `compute_score_single` scores it: -1.0 for a malformed episode, otherwise
1.0 when the solution query returns the same set of rows as the reference query, else 0.0.

Queries run through :func:`skyrl_gym.tools.sql_execution.execute_sql` (read-only, interrupted on timeout), the
same execution the SQL tool uses; its names are re-exported here.
"""

from __future__ import annotations

import logging

# ``os`` and ``sqlite3`` stay reachable as attributes of this module: code written for skyrl-gym 0.4 patches
# ``skyrl_gym.envs.sql.utils.sqlite3.connect`` and ``...utils.os.path.exists``, the very module objects that
# execute_sql looks those functions up in at call time.
import os  # noqa: F401
import re
import sqlite3  # noqa: F401

from skyrl_gym.tools.sql_execution import DEFAULT_TIMEOUT_S, Rows, SQLExecutionError, SQLTimeoutError, execute_sql

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "OBS_END",
    "OBS_START",
    "SOLUTION_END",
    "SOLUTION_START",
    "SQL_END",
    "SQL_START",
    "THINK_END",
    "THINK_START",
    "FormatResult",
    "Rows",
    "SQLExecutionError",
    "SQLTimeoutError",
    "compute_score_single",
    "execute_sql",
    "verify_format_and_extract",
]

logger = logging.getLogger(__name__)

THINK_START, THINK_END = "<think>", "</think>"
SQL_START, SQL_END = "<sql>", "</sql>"
SOLUTION_START, SOLUTION_END = "<solution>", "</solution>"
OBS_START, OBS_END = "<observation>", "</observation>"

# Any opening or closing think/sql/observation tag; none may appear inside the final solution.
_FORBIDDEN_IN_SOLUTION = re.compile(r"</?(?:think|sql|observation)\b", re.IGNORECASE)
# An observation that is not followed by renewed thinking. The lookahead only scans whitespace, so the
# search stays linear however many observations there are.
_OBSERVATION_WITHOUT_THINK = re.compile(r"</observation>(?!\s*<think>)", re.IGNORECASE)

FormatResult = tuple[bool, list[str] | None, str | None, None]
_INVALID: FormatResult = (False, None, None, None)


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
