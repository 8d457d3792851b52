import contextlib
import io
import json
import subprocess
import sys
import textwrap
import time

import pytest

from skyrl_gym.envs.lcb.utils import (
    build_functional_harness,
    extract_code_block,
    json_outputs_match,
    outputs_match,
    unwrap_main_guard,
)

# ---------------------------------------------------------------- extract_code_block


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Here:\n```python\nprint(1)\n```\nDone.", "print(1)"),
        ("```\nx = 1\n```", "x = 1"),
        ("```py3\na\n```", "a"),
        ("```cpp\nint main() {}\n```", "int main() {}"),
        ("```python title='sol.py'\nb = 2\n```", "b = 2"),
        ("```python\nfirst()\n```\ntext\n```python\nsecond()\n```", "second()"),
        ("```python\n\n\ndef f():\n    return 1\n\n```", "def f():\n    return 1"),
        ("  ```python\n    x = 1\n    y = 2\n  ```", "x = 1\ny = 2"),
        ("```python\n```", ""),
        ("```python\r\nprint('é')\r\n```", "print('é')"),
        ("no code at all", None),
        ("", None),
        ("```python\nprint(1)", None),
        ("inline ```print(1)``` code", None),
    ],
)
def test_extract_code_block(text: str, expected: str | None) -> None:
    assert extract_code_block(text) == expected


def test_extract_code_block_keeps_inner_indentation() -> None:
    text = "```python\nclass A:\n    def f(self):\n        return 1\n```"
    assert extract_code_block(text) == "class A:\n    def f(self):\n        return 1"


# ---------------------------------------------------------------- outputs_match


@pytest.mark.parametrize(
    ("expected", "actual"),
    [
        ("3\n", "3"),
        ("1 2 3", "1 2 3   \n\n"),
        ("a\nb", "a\r\nb\r\n"),
        ("  x  ", "x"),
        ("1 2", "1   2"),
        ("1.0", "1"),
        ("1", "1.000"),
        ("1000", "1e3"),
        ("-0", "0"),
        ("+5", "5"),
        ("0.333333333", "0.3333333"),
        ("1.0", "1.0000000001"),
        ("2.5000000", "2.5000001"),
        ("123456789.0", "123456789.1"),
        ("YES 1.0", "YES 1.00000001"),
        ("", ""),
        ("", "\n  \n"),
        ("nan", "nan"),
        ("héllo wörld", "héllo wörld"),
    ],
)
def test_outputs_match(expected: str, actual: str) -> None:
    assert outputs_match(expected, actual)
    assert outputs_match(actual, expected)


@pytest.mark.parametrize(
    ("expected", "actual"),
    [
        ("3", "4"),
        ("1\n2", "1"),
        ("1\n\n2", "1\n2"),
        ("1 2", "12"),
        ("1 2", "1 2 3"),
        ("YES", "yes"),
        ("0.5", "0.6"),
        ("0.001", "0.0011"),
        ("1000000000", "1000000001"),
        ("10", "10.0001"),
        ("nan", "NaN"),
        ("", "0"),
        ("1,000", "1000"),
        ("1e999999999999999999999", "1"),
        ("1", "1e999999999999999999999"),
        ("1e999999999", "1e999999998"),
        ("0x10", "16"),
        ("1_000", "1000"),
    ],
)
def test_outputs_differ(expected: str, actual: str) -> None:
    assert not outputs_match(expected, actual)
    assert not outputs_match(actual, expected)


@pytest.mark.parametrize(
    "hostile",
    ["1" * 100_000, "1 " * 50_000, "\n" * 100_000, "9." + "9" * 100_000, "1e" + "9" * 100_000, "```\n" * 25_000],
)
def test_long_inputs_do_not_hang(hostile: str) -> None:
    start = time.perf_counter()
    outputs_match(hostile, hostile + "0")
    outputs_match(hostile, hostile)
    extract_code_block(hostile)
    extract_code_block("```python\n" + hostile)
    assert time.perf_counter() - start < 2.0


def test_extract_code_block_hostile_fences_are_fast() -> None:
    start = time.perf_counter()
    assert extract_code_block("```" + "a" * 100_000) is None
    assert extract_code_block("`" * 100_000) is None
    assert extract_code_block("```python\n" + "x" * 100_000 + "\n```") == "x" * 100_000
    assert time.perf_counter() - start < 2.0


# ---------------------------------------------------------------- json_outputs_match


def test_json_outputs_match() -> None:
    assert json_outputs_match("[1, 2]", "[1,2]\n")
    assert json_outputs_match("1", "1.0")
    assert json_outputs_match('{"a": [true, null]}', '{"a":[true,null]}')
    assert not json_outputs_match("[1, 2]", "[2, 1]")
    assert not json_outputs_match('"a"', "a")
    assert not json_outputs_match("[1, 2]", "")
    assert not json_outputs_match("not json", "not json")


# ---------------------------------------------------------------- build_functional_harness


def run_program(program: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


SOLUTION_CLASS = textwrap.dedent(
    """
    class Solution:
        def twoSum(self, nums: List[int], target: int) -> List[int]:
            print("debugging output")
            seen: Dict[int, int] = {}
            for i, x in enumerate(nums):
                if target - x in seen:
                    return (seen[target - x], i)
                seen[x] = i
            return []
    """
)


def test_harness_calls_solution_method_with_embedded_inputs() -> None:
    result = run_program(build_functional_harness(SOLUTION_CLASS, "twoSum", "[2, 7, 11, 15]\n9"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[0, 1]\n"  # tuple became a JSON list; the print went elsewhere
    assert "debugging output" in result.stderr
    assert json_outputs_match("[0, 1]", result.stdout)


def test_harness_reads_inputs_from_stdin() -> None:
    program = build_functional_harness(SOLUTION_CLASS, "twoSum")
    first = run_program(program, stdin="[3, 3]\n6\n")
    second = run_program(program, stdin="[1, 5, 8]\n13")
    assert (first.returncode, first.stdout) == (0, "[0, 1]\n")
    assert (second.returncode, second.stdout) == (0, "[1, 2]\n")


def test_harness_calls_top_level_function() -> None:
    code = "def add(a, b):\n    return {'sum': a + b, 'args': [a, b], 'ok': True, 'none': None}\n"
    result = run_program(build_functional_harness(code, "add", "1\n2.5"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"sum": 3.5, "args": [1, 2.5], "ok": True, "none": None}


def test_harness_prefers_solution_method_over_function() -> None:
    code = "def f(x):\n    return 'function'\n\nclass Solution:\n    def f(self, x):\n        return 'method'\n"
    assert run_program(build_functional_harness(code, "f", "0")).stdout == '"method"\n'
    code = "def g(x):\n    return 'function'\n\nclass Solution:\n    def f(self, x):\n        return 'method'\n"
    assert run_program(build_functional_harness(code, "g", "0")).stdout == '"function"\n'


def test_harness_string_arguments_and_unicode() -> None:
    code = "class Solution:\n    def rev(self, s: str) -> str:\n        return s[::-1]\n"
    argument = 'héllo\n"wörld" \\ ✓ \u2028'
    result = run_program(build_functional_harness(code, "rev", json.dumps(argument, ensure_ascii=False)))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == argument[::-1]


def test_harness_skips_blank_input_lines() -> None:
    code = "def count(*args):\n    return len(args)\n"
    assert run_program(build_functional_harness(code, "count", "\n1\n\n[2]\n\n")).stdout == "2\n"
    assert run_program(build_functional_harness(code, "count", "")).stdout == "0\n"


def test_harness_does_not_run_main_guard_and_isolates_names() -> None:
    code = textwrap.dedent(
        """
        import json
        _json = None
        _sys = None
        json = None

        def f(x):
            return x * 2

        if __name__ == "__main__":
            print("main guard ran")
            raise SystemExit(3)
        """
    )
    result = run_program(build_functional_harness(code, "f", "21"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"
    assert "main guard ran" not in result.stderr


def test_harness_code_with_quotes_and_backslashes() -> None:
    code = r'''def f():
    """Doc with \''' and a backslash \\ here."""
    return "a'b\\c" + '"""' + "\n"
'''
    compile(code, "<check>", "exec")
    result = run_program(build_functional_harness(code, "f", ""))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == 'a\'b\\c"""\n'


def test_harness_converts_numpy_results() -> None:
    code = "import numpy as np\n\ndef f(n):\n    return np.arange(n), np.int64(n), np.float64(0.5)\n"
    result = run_program(build_functional_harness(code, "f", "3"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[0, 1, 2], 3, 0.5]


@pytest.mark.parametrize(
    ("code", "func_name", "inputs", "message"),
    [
        ("def f():\n    return 1\n", "missing", "", "no function or Solution method named 'missing'"),
        ("def f(x):\n    return 1 // x\n", "f", "0", "ZeroDivisionError"),
        ("def f():\n    return {1, 2}\n", "f", "", "not JSON serializable"),
        ("def f(:\n    pass\n", "f", "", "SyntaxError"),
        ("def f(x):\n    return x\n", "f", "not json", "JSONDecodeError"),
        ("def f(x):\n    return x\n", "f", "1\n2", "TypeError"),
    ],
)
def test_harness_failures_exit_nonzero(code: str, func_name: str, inputs: str, message: str) -> None:
    result = run_program(build_functional_harness(code, func_name, inputs))
    assert result.returncode != 0
    assert result.stdout == ""
    assert message in result.stderr


def test_harness_traceback_points_into_solution() -> None:
    code = "def f():\n    x = 1\n    raise ValueError('boom')\n"
    result = run_program(build_functional_harness(code, "f", ""))
    assert 'File "<solution>", line 3, in f' in result.stderr


def test_harness_custom_preamble() -> None:
    code = "def f():\n    return CONSTANT\n"
    result = run_program(build_functional_harness(code, "f", "", preamble="CONSTANT = 7\n"))
    assert result.stdout == "7\n"


# ---------------------------------------------------------------- unwrap_main_guard


def run_as_module(code: str) -> str:
    """Execute code under a non-"__main__" name, as an importing executor would, and return its output."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "<test>", "exec"), {"__name__": "not_main"})
    return buffer.getvalue()


def test_unwrap_basic_guard() -> None:
    code = 'def main():\n    print("hi")\n\n\nif __name__ == "__main__":\n    main()\n'
    unwrapped = unwrap_main_guard(code)
    assert unwrapped == 'def main():\n    print("hi")\n\n\nmain()\n'
    assert run_as_module(code) == ""
    assert run_as_module(unwrapped) == "hi\n"


@pytest.mark.parametrize(
    "guard",
    [
        "if __name__ == '__main__':",
        'if __name__ == "__main__":',
        'if "__main__" == __name__:',
        "if (__name__ == '__main__'):",
        "if __name__=='__main__':  # run it",
    ],
)
def test_unwrap_guard_spellings(guard: str) -> None:
    code = f"x = 1\n{guard}\n    x += 1\n    print(x)\n"
    assert run_as_module(unwrap_main_guard(code)) == "2\n"


def test_unwrap_one_line_guard() -> None:
    code = "def go():\n    print('ok')\nif __name__ == '__main__': go(); print('é')\n"
    assert unwrap_main_guard(code) == "def go():\n    print('ok')\ngo(); print('é')\n"
    assert run_as_module(unwrap_main_guard(code)) == "ok\né\n"


def test_unwrap_drops_else_and_keeps_following_code() -> None:
    code = textwrap.dedent(
        """\
        if __name__ == "__main__":
            print("main")
            for i in range(2):
                print(i)
        else:
            print("imported")
        print("after")
        """
    )
    assert run_as_module(unwrap_main_guard(code)) == "main\n0\n1\nafter\n"


def test_unwrap_nested_blocks_and_tabs() -> None:
    code = "if __name__ == '__main__':\n\tdef f():\n\t\treturn 5\n\tprint(f())\n"
    assert run_as_module(unwrap_main_guard(code)) == "5\n"


def test_unwrap_multiple_guards() -> None:
    code = "if __name__ == '__main__':\n    print(1)\nprint(2)\nif __name__ == '__main__':\n    print(3)\n"
    assert run_as_module(unwrap_main_guard(code)) == "1\n2\n3\n"


def test_unwrap_crlf_source() -> None:
    code = "if __name__ == '__main__':\r\n    print('crlf')\r\n"
    assert run_as_module(unwrap_main_guard(code)) == "crlf\n"


def test_unwrap_reads_stdin_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    code = textwrap.dedent(
        """\
        import sys

        def main():
            data = sys.stdin.read().split()
            print(sum(map(int, data)))

        if __name__ == "__main__":
            main()
        """
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO("1 2 3\n"))
    assert run_as_module(unwrap_main_guard(code)) == "6\n"


@pytest.mark.parametrize(
    "code",
    [
        "print('no guard')\n",
        "def f():\n    if __name__ == '__main__':\n        print(1)\n",
        "if __name__ != '__main__':\n    print(1)\n",
        "if __name__ == '__main__' and DEBUG:\n    print(1)\n",
        "if __name__ == '__main__':\n    print(1\n",  # does not parse
        "x = '\0'\n",
        "",
    ],
)
def test_unwrap_leaves_other_code_unchanged(code: str) -> None:
    assert unwrap_main_guard(code) == code
