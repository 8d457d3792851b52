"""The ``python`` tool: run model-written code in the sandbox and answer in skyrl-gym 0.4's words."""

from __future__ import annotations

from skyrl_gym.sandbox import CodeExecutor, format_python_tool_output, get_default_executor
from skyrl_gym.tools.core import ToolGroup, tool

__all__ = ["PythonCodeExecutorToolGroup"]


class PythonCodeExecutorToolGroup(ToolGroup):
    """Tool group ``"PythonCodeExecutorToolGroup"`` with one tool, ``python(code)``.

    The tool runs ``code`` the way ``python -c code`` would, but in the sandbox (:mod:`skyrl_gym.sandbox`: no
    network, a private temporary directory, resource limits) and from a warm interpreter pool. Its answer is
    the text skyrl-gym 0.4 returned: the stripped stdout; or ``"Error executing Python code: "`` followed by the
    stripped stderr when anything was written there; or, after ``timeout`` seconds,
    ``"Error executing Python code: Execution timed out after {timeout} seconds."``.

    Args:
        timeout: Wall-clock seconds per call; the CPU-time limit follows it (rounded up, plus one second).
        executor: The sandbox to run in, which keeps its other limits; default: the process-wide
            :func:`~skyrl_gym.sandbox.get_default_executor`, created on the first call.
    """

    def __init__(self, timeout: float = 10.0, executor: CodeExecutor | None = None) -> None:
        self.timeout = timeout
        self._executor = executor
        super().__init__(name="PythonCodeExecutorToolGroup")

    @tool
    def python(self, code: str) -> str:
        """Run ``code`` in the sandbox and return its output (or its error) as text."""
        executor = self._executor or get_default_executor()
        limits = executor.limits.replace(timeout_s=self.timeout, cpu_s=None)
        return format_python_tool_output(executor.run(code, limits=limits), self.timeout)
