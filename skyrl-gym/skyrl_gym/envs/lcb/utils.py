"""Pure helpers for LiveCodeBench-style code generation: code extraction, test harnesses and output checks.

Nothing here executes code. A LiveCodeBench test case is either

- ``"stdin"``: the program reads the test input on standard input, and its standard output is compared
  with the expected output by `outputs_match`; or
- ``"functional"``: the test input is newline-separated JSON values, one per argument, passed to a named
  function (top-level, or a method of ``class Solution`` as on LeetCode). `build_functional_harness`
  turns the solution into a standalone script that makes the call and prints the JSON-encoded result,
  which `json_outputs_match` compares with the expected JSON.

The code executor that runs these programs lives elsewhere.
"""

from __future__ import annotations

import ast
import decimal
import json
import re
import textwrap
from decimal import Decimal

# A fenced block: ``` plus an optional info string ("python", "py3", "c++ title=x") ending the fence line,
# then the body up to the next ```. The info string cannot contain a newline or a backtick, so it never
# competes with the body for characters and matching stays linear.
_CODE_BLOCK = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)

# A plain decimal number token: "42", "-0.5", ".5", "1e-9". No "nan", "inf" or digit separators.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")

# Two numeric tokens match if they are equal as decimals, or, when at least one of them is not an integer
# literal, if they differ by at most this much absolutely or relative to the expected value, the
# "absolute or relative error at most 1e-6" rule of programming contests. Two integer literals must be
# equal: a relative tolerance would accept a wrong answer such as 1000000001 for 1000000000.
FLOAT_TOLERANCE = Decimal("1e-6")
# Enough precision and exponent range that subtracting any two parsed tokens neither overflows nor loses
# the difference that matters for the tolerance test.
_COMPARE_CONTEXT = decimal.Context(prec=60, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)

# Standard-library names that LeetCode-style solutions use without importing them (notably ``List`` and
# ``Optional`` in signatures). Executed in the solution's namespace before the solution itself.
IMPORT_PREAMBLE = """\
import bisect
import collections
import functools
import heapq
import itertools
import math
import operator
import random
import re
import string
import sys
from bisect import bisect, bisect_left, bisect_right, insort, insort_left, insort_right
from collections import Counter, OrderedDict, defaultdict, deque
from functools import cache, cmp_to_key, lru_cache, reduce
from heapq import heapify, heappop, heappush, heappushpop, heapreplace, nlargest, nsmallest
from itertools import accumulate, chain, combinations, count, groupby, pairwise, permutations, product
from math import comb, factorial, gcd, inf, isqrt, lcm, log2, sqrt
from typing import *
"""


def extract_code_block(text: str) -> str | None:
    """Return the code of the last fenced (```) block in ``text``.

    The fence may carry a language tag. Common indentation is removed and surrounding blank space
    stripped, so a block indented as a whole (e.g. inside a list item) still runs.

    Returns:
        The code (possibly empty), or None when ``text`` has no complete fenced block.
    """
    blocks = _CODE_BLOCK.findall(text)
    if not blocks:
        return None
    code: str = blocks[-1]
    return textwrap.dedent(code).strip()


def _parse_number(token: str) -> Decimal | None:
    """``token`` as a Decimal, or None if it is not a plain decimal number (or is out of range)."""
    if not _NUMBER.fullmatch(token):
        return None
    try:
        return Decimal(token)
    except decimal.DecimalException:  # e.g. an exponent beyond what Decimal can represent
        return None


def _tokens_match(expected: str, actual: str) -> bool:
    """Whether two whitespace-free tokens match: equal text, or numbers equal within tolerance."""
    if expected == actual:
        return True
    want, got = _parse_number(expected), _parse_number(actual)
    if want is None or got is None:
        return False
    if want == got:
        return True
    if _INTEGER.fullmatch(expected) and _INTEGER.fullmatch(actual):
        return False
    try:
        with decimal.localcontext(_COMPARE_CONTEXT):
            return abs(want - got) <= FLOAT_TOLERANCE * max(Decimal(1), abs(want))
    except decimal.DecimalException:
        return False


def _lines_match(expected: str, actual: str) -> bool:
    """Whether two stripped lines match token by token (runs of whitespace are one separator)."""
    if expected == actual:
        return True
    expected_tokens, actual_tokens = expected.split(), actual.split()
    return len(expected_tokens) == len(actual_tokens) and all(
        _tokens_match(want, got) for want, got in zip(expected_tokens, actual_tokens, strict=True)
    )


def outputs_match(expected: str, actual: str) -> bool:
    r"""Compare a program's standard output with the expected output of a stdin test.

    Both outputs are stripped and split into lines, and each line is stripped, so trailing spaces, ``\r``
    and leading or trailing blank lines do not matter; the number of lines must agree. Lines match when
    equal, or when they have the same number of whitespace-separated tokens and each pair of tokens is
    equal, or numerically equal (``1.0`` = ``1`` = ``1e0``), or, unless both are integer literals, within
    an absolute or relative error of `FLOAT_TOLERANCE` (1e-6).

    Args:
        expected: The expected output.
        actual: The program's output.

    Returns:
        True when the outputs match.
    """
    expected_lines = [line.strip() for line in expected.strip().split("\n")]
    actual_lines = [line.strip() for line in actual.strip().split("\n")]
    return len(expected_lines) == len(actual_lines) and all(
        _lines_match(want, got) for want, got in zip(expected_lines, actual_lines, strict=True)
    )


def json_outputs_match(expected_json: str, actual_stdout: str) -> bool:
    """Compare the output of a functional harness with a functional test's expected output.

    Args:
        expected_json: The test's expected output, a JSON value.
        actual_stdout: What the harness printed: one JSON value (surrounding whitespace ignored).

    Returns:
        True when both decode and the decoded values are equal (Python ``==``, so ``1 == 1.0``); False
        when either is not valid JSON.
    """
    try:
        expected_value = json.loads(expected_json)
        actual_value = json.loads(actual_stdout)
    except ValueError:
        return False
    return bool(expected_value == actual_value)


# The fixed part of a functional harness. It runs the solution in its own namespace so that solution
# names cannot clobber the harness's, sends anything the solution prints to stderr so that stdout holds
# only the result, and exits non-zero with a traceback if the solution fails.
_HARNESS_BODY = """
import contextlib as _contextlib
import json as _json
import sys as _sys


def _arguments():
    text = _sys.stdin.read() if _INPUTS is None else _INPUTS
    return [_json.loads(line) for line in text.split("\\n") if line.strip()]


def _target(namespace):
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, _FUNC_NAME):
        return getattr(solution(), _FUNC_NAME)
    function = namespace.get(_FUNC_NAME)
    if callable(function):
        return function
    raise SystemExit("harness: no function or Solution method named " + repr(_FUNC_NAME))


def _jsonable(value):
    for method in ("tolist", "item"):  # numpy arrays and scalars
        convert = getattr(value, method, None)
        if callable(convert):
            return convert()
    raise TypeError("result of type " + type(value).__name__ + " is not JSON serializable")


def _main():
    arguments = _arguments()
    namespace = {"__name__": "__solution__", "__builtins__": __builtins__}
    with _contextlib.redirect_stdout(_sys.stderr):
        exec(compile(_PREAMBLE, "<preamble>", "exec"), namespace)
        exec(compile(_SOLUTION, "<solution>", "exec"), namespace)
        result = _target(namespace)(*arguments)
    _sys.stdout.write(_json.dumps(result, default=_jsonable) + "\\n")
    _sys.stdout.flush()


_main()
"""


def build_functional_harness(
    code: str, func_name: str, inputs_json: str | None = None, preamble: str = IMPORT_PREAMBLE
) -> str:
    """Build a Python script that calls ``func_name`` from ``code`` and prints the JSON-encoded result.

    The script runs ``preamble`` and then ``code`` in a fresh namespace whose ``__name__`` is not
    ``"__main__"`` (so a main guard in ``code`` does not run), then calls ``Solution().<func_name>`` if
    ``code`` defines a ``Solution`` class with that attribute, else the top-level function ``func_name``.
    Arguments are the JSON values on the non-blank lines of ``inputs_json``, one per argument, or of
    standard input when ``inputs_json`` is None (so one script can serve every test case).

    Contract of the script: on success it writes exactly one line to stdout, the result as JSON (tuples
    become lists, numpy values are converted), and exits 0; whatever the solution prints goes to stderr.
    If the function is missing, the solution raises, or the result is not JSON-encodable (e.g. a set), it
    exits non-zero with the reason on stderr.

    Args:
        code: The solution source.
        func_name: The function or ``Solution`` method to call.
        inputs_json: Newline-separated JSON arguments, or None to read them from stdin.
        preamble: Source executed before ``code`` in the same namespace; defaults to `IMPORT_PREAMBLE`.

    Returns:
        The script's source text; run it with e.g. ``python -c``.
    """
    # repr() yields a valid Python literal for any string, so no input can break out of its assignment.
    constants = {"_PREAMBLE": preamble, "_SOLUTION": code, "_FUNC_NAME": func_name, "_INPUTS": inputs_json}
    return "".join(f"{name} = {value!r}\n" for name, value in constants.items()) + _HARNESS_BODY


def _is_main_guard(node: ast.stmt) -> bool:
    """Whether ``node`` is ``if __name__ == "__main__":`` (either operand order)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    operands = (test.left, test.comparators[0])
    has_name = any(isinstance(op, ast.Name) and op.id == "__name__" for op in operands)
    has_main = any(isinstance(op, ast.Constant) and op.value == "__main__" for op in operands)
    return has_name and has_main


def _char_offset(line: str, utf8_offset: int) -> int:
    """Convert an ``ast`` column (a UTF-8 byte offset) into a character offset within ``line``."""
    return len(line.encode("utf-8")[:utf8_offset].decode("utf-8", errors="ignore"))


def _guard_body_lines(lines: list[str], guard: ast.If) -> list[str]:
    """The lines of ``guard``'s body, moved to the top level."""
    first, last = guard.body[0], guard.body[-1]
    end = last.end_lineno or last.lineno
    if first.lineno == guard.lineno:
        # One-line form: `if __name__ == "__main__": main()`; keep what follows the colon.
        head = lines[first.lineno - 1]
        return [head[_char_offset(head, first.col_offset) :], *lines[first.lineno : end]]
    body = lines[first.lineno - 1 : end]
    indent = body[0][: len(body[0]) - len(body[0].lstrip())]
    # Only the block's own indentation is removed; lines indented less (continuation lines of a
    # multi-line string, blank lines) are kept as they are.
    return [line[len(indent) :] if line.startswith(indent) else line for line in body]


def unwrap_main_guard(code: str) -> str:
    r"""Turn each top-level ``if __name__ == "__main__":`` block into top-level code.

    The block's body is dedented into place and any ``else`` branch is dropped (it could never run as a
    script). Code that does not parse, or has no such block, is returned unchanged. Line endings are
    normalised to ``\n`` when a block is rewritten.

    Args:
        code: Python source.

    Returns:
        The source with its main guards unwrapped.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):  # ValueError: null bytes in the source
        return code
    guards = [node for node in tree.body if isinstance(node, ast.If) and _is_main_guard(node)]
    if not guards:
        return code
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    # Rewrite from the bottom up so that earlier line numbers stay valid.
    for guard in reversed(guards):
        end = guard.end_lineno or guard.lineno
        lines[guard.lineno - 1 : end] = _guard_body_lines(lines, guard)
    return "\n".join(lines)
