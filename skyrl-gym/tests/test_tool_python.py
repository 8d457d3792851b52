"""The python tool group: skyrl-gym 0.4's interface and answers, now running in the sandbox."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest

from skyrl_gym.sandbox import CodeExecutor, SandboxLimits, isolation_guarantees
from skyrl_gym.tools import PythonCodeExecutorToolGroup

ERROR = "Error executing Python code: "


@pytest.fixture(scope="module")
def executor() -> Iterator[CodeExecutor]:
    with CodeExecutor(SandboxLimits(memory_mb=512), pool_size=2) as executor:
        yield executor


@pytest.fixture
def tools(executor: CodeExecutor) -> PythonCodeExecutorToolGroup:
    return PythonCodeExecutorToolGroup(timeout=10.0, executor=executor)


def test_group_interface(tools: PythonCodeExecutorToolGroup) -> None:
    assert tools.get_name() == "PythonCodeExecutorToolGroup"
    assert tools.get_tool_names() == ["python"]
    assert tools.get_tool_to_group_mapping() == {"python": "PythonCodeExecutorToolGroup"}
    assert tools.timeout == 10.0
    assert PythonCodeExecutorToolGroup().timeout == 10.0


def test_stdout_is_stripped(tools: PythonCodeExecutorToolGroup) -> None:
    assert tools.execute_tool("python", "print('  hello  ')\nprint()") == "hello"
    assert tools.execute_tool("python", "x = 1") == ""


def test_traceback_is_reported_like_python_c(tools: PythonCodeExecutorToolGroup) -> None:
    answer = tools.execute_tool("python", "print('partial')\ndef f():\n    return 1 / 0\nf()")
    assert answer == (
        ERROR + "Traceback (most recent call last):\n"
        '  File "<string>", line 4, in <module>\n'
        '  File "<string>", line 3, in f\n'
        "ZeroDivisionError: division by zero"
    )


def test_any_stderr_output_is_an_error(tools: PythonCodeExecutorToolGroup) -> None:
    answer = tools.execute_tool("python", "import sys\nprint('out')\nprint('note', file=sys.stderr)")
    assert answer == ERROR + "note"


def test_syntax_error(tools: PythonCodeExecutorToolGroup) -> None:
    assert (
        tools.execute_tool("python", "print(")
        == ERROR + ("  File \"<string>\", line 1\n    print(\n         ^\nSyntaxError: '(' was never closed").strip()
    )


def test_exit_code_without_output_is_silent(tools: PythonCodeExecutorToolGroup) -> None:
    assert tools.execute_tool("python", "import sys\nprint('done')\nsys.exit(2)") == "done"


@pytest.mark.slow
def test_timeout_message(executor: CodeExecutor) -> None:
    tools = PythonCodeExecutorToolGroup(timeout=1.5, executor=executor)
    answer = tools.execute_tool("python", "import time\nprint('x', flush=True)\ntime.sleep(30)")
    assert answer == ERROR + "Execution timed out after 1.5 seconds."
    assert tools.python("print(1 + 1)") == "2"


def test_tool_is_sandboxed(tools: PythonCodeExecutorToolGroup, executor: CodeExecutor) -> None:
    answer = tools.execute_tool("python", "import os\nprint(os.path.exists(os.environ['HOST_FILE']), os.getcwd())")
    assert answer.startswith(ERROR + "Traceback")  # the caller's environment is not passed on
    answer = tools.execute_tool("python", f"import os\nprint(os.path.exists({__file__!r}), os.getcwd())")
    if "filesystem" in isolation_guarantees(executor.isolation):
        assert answer == "False /tmp"
    else:
        assert answer.startswith(f"True {tempfile.gettempdir()}/skyrl-sandbox-")


def test_default_executor_is_used_when_none_is_given() -> None:
    from skyrl_gym.sandbox import get_default_executor

    tools = PythonCodeExecutorToolGroup(timeout=5)
    try:
        assert tools.execute_tool("python", "print(6 * 7)") == "42"
    finally:
        get_default_executor().close()
