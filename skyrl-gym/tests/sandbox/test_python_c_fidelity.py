"""A sandboxed run reports exactly what ``python -c CODE`` reports: stdout, stderr and exit status, byte for byte.

Checked with fork servers and with one interpreter per run, and for each input of ``run_many`` too.
"""

from __future__ import annotations

import subprocess

import pytest

from skyrl_gym.sandbox import CodeExecutor

CYCLE = "class A:\n    def __del__(self):\n        print('finalized', flush=True)\n"
SNIPPETS = {
    "print": "print(1)\nprint('a', 'b', sep='-', end='!')",
    "syntax_error": "x = (1,\ny = 2",
    "syntax_error_caret": "print(1 +)",
    "indentation_error": "if True:\nprint(1)",
    "unicode_escape_error": "'\\N{no such name}'",
    "nested_exception": "def outer():\n    def inner(x):\n        return 1 / x\n    return inner(0)\n\nouter()",
    "exit_code": "import sys\nprint('before')\nsys.exit(3)",
    "exit_message": "import sys\nsys.exit('fatal: bad input')",
    "exit_none": "raise SystemExit(None)",
    "exit_true": "raise SystemExit(True)",
    "stderr_writes": "import sys\nsys.stderr.write('warn 1\\n')\nprint('out')\nsys.stderr.write('warn 2')",
    "unicode": "print('héllo wörld – 中文 – 🐍')\nimport sys\nprint('ünï', file=sys.stderr)",
    "chained_cause": "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('bad') from e",
    "chained_context": "try:\n    int('x')\nexcept ValueError:\n    [][1]",
    "exception_group": "raise ExceptionGroup('eg', [ValueError(1), TypeError(2)])",
    "recursion": "def f(n):\n    return f(n + 1)\nf(0)",
    "keyboard_interrupt": "import atexit\natexit.register(print, 'cleanup')\nraise KeyboardInterrupt",
    "custom_exception": "class MyError(Exception):\n    pass\nraise MyError('custom')",
    "exec_inner_frames": "exec('def g():\\n    raise RuntimeError(1)\\ng()')",
    "eval_syntax_error": "eval('1 +')",
    "warning": "import warnings\nwarnings.warn('careful')",
    "deprecation_in_main": "import warnings\nwarnings.warn('old', DeprecationWarning)",
    "atexit": "import atexit\natexit.register(print, 'at exit')\nprint('main')",
    "del_at_exit": "class A:\n    def __del__(self):\n        print('deleted')\na = A()",
    # Cyclic garbage is finalized by the collection at exit: from the youngest generations, from the oldest (an
    # explicit collection moved the cycle there) and from objects the snippet froze and unfroze.
    "cycle_del_at_exit": CYCLE + "a = A()\na.me = a",
    "cycle_del_after_collect": CYCLE + "import gc\na = A()\na.me = a\ngc.collect()\nprint('collected')",
    "cycle_del_after_many_collections": CYCLE + "a = A()\na.me = a\nkeep = [[i] for i in range(300000)]\nprint('made')",
    "cycle_del_after_unfreeze": CYCLE + "import gc\na = A()\na.me = a\ngc.freeze()\ngc.unfreeze()\nprint('thawed')",
    "thread_joined_at_exit": (
        "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.05), print('t'))).start()"
    ),
    "globals": "print(sorted(globals()))\nprint(__name__, __doc__, __spec__, __package__)",
    "argv_path": "import sys\nprint(sys.argv, repr(sys.path[0]))",
    "excepthook": "import sys\nsys.excepthook = lambda t, v, tb: print('hooked', t.__name__)\n1/0",
    "stdin": "import sys\nfirst = input()\nprint(first[::-1])\nprint(len(sys.stdin.read().splitlines()))",
    "stdin_eof": "input()\ninput()\ninput()",
    "pickle_main_class": "import pickle\nclass P:\n    x = 1\nprint(pickle.loads(pickle.dumps(P())).x)",
    "partial_line_flush": "import os\nprint('buffered', end='')\nos.write(1, b'direct\\n')",
}
STDIN = "hello\nsecond line\nthird line\n"


def python_c(executor: CodeExecutor, code: str, stdin: str) -> subprocess.CompletedProcess[bytes]:
    """The reference: the executor's interpreter run as `python -c` in a throwaway directory."""
    return subprocess.run(
        [executor.python, "-c", code],
        input=stdin.encode(),
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"},
        cwd="/tmp",
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_run_matches_python_c_byte_for_byte(launcher_shared_executor: CodeExecutor, name: str) -> None:
    code = SNIPPETS[name]
    expected = python_c(launcher_shared_executor, code, STDIN)
    result = launcher_shared_executor.run(code, stdin=STDIN)
    assert result.stdout.encode() == expected.stdout
    assert result.stderr.encode() == expected.stderr
    assert result.exit_code == expected.returncode
    assert not result.timed_out
    assert not result.truncated


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_run_many_matches_python_c_byte_for_byte(launcher_shared_executor: CodeExecutor, name: str) -> None:
    code = SNIPPETS[name]
    expected = python_c(launcher_shared_executor, code, STDIN)
    results = launcher_shared_executor.run_many(code, [STDIN, STDIN])
    for result in results:
        assert result.stdout.encode() == expected.stdout
        assert result.stderr.encode() == expected.stderr
        assert result.exit_code == expected.returncode
        assert not result.killed
    assert len(results) == 2


def test_traceback_shows_only_user_frames(launcher_shared_executor: CodeExecutor) -> None:
    result = launcher_shared_executor.run("def a():\n    b()\ndef b():\n    raise ValueError('deep')\na()")
    assert result.stderr == (
        "Traceback (most recent call last):\n"
        '  File "<string>", line 5, in <module>\n'
        '  File "<string>", line 2, in a\n'
        '  File "<string>", line 4, in b\n'
        "ValueError: deep\n"
    )
    assert result.exit_code == 1


def test_syntax_error_has_no_traceback_header(launcher_shared_executor: CodeExecutor) -> None:
    result = launcher_shared_executor.run("print('unclosed'")
    assert not result.stderr.startswith("Traceback")
    assert result.stderr.startswith('  File "<string>", line 1\n')
    assert "SyntaxError" in result.stderr


def test_exit_codes(launcher_shared_executor: CodeExecutor) -> None:
    assert launcher_shared_executor.run("import sys; sys.exit(3)").exit_code == 3
    assert launcher_shared_executor.run("import sys; sys.exit(0)").exit_code == 0
    assert launcher_shared_executor.run("import os; os._exit(7)").exit_code == 7
    killed = launcher_shared_executor.run("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert killed.exit_code == -15
    assert not killed.timed_out


def test_stdin_as_bytes(launcher_shared_executor: CodeExecutor) -> None:
    result = launcher_shared_executor.run("import sys; print(sys.stdin.buffer.read())", stdin=b"\x00\xffraw")
    assert result.stdout == "b'\\x00\\xffraw'\n"


def test_large_stdin_and_output(launcher_shared_executor: CodeExecutor) -> None:
    # Larger than a pipe buffer in both directions: the exchange must write and read at the same time.
    data = "".join(f"{i}\n" for i in range(100_000))
    result = launcher_shared_executor.run("import sys\nfor line in sys.stdin:\n    print(line, end='')", stdin=data)
    assert result.stdout == data
    assert result.exit_code == 0


def test_unread_stdin_does_not_block(launcher_shared_executor: CodeExecutor) -> None:
    result = launcher_shared_executor.run("print('ignored stdin')", stdin="x" * 1_000_000)
    assert result.stdout == "ignored stdin\n"
    assert result.exit_code == 0
