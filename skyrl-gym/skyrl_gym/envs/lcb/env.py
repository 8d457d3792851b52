"""``lcb``: LiveCodeBench-style code generation, graded by running the model's program on hidden tests.

One step. The action is the model's answer; the code of its last fenced (```) block is run against every test of
``extras["reward_spec"]["ground_truth"]`` (a JSON string, or the decoded list, of
``{"input", "output", "testtype": "stdin" | "functional", "metadata": {"func_name"}}``). The reward is ``1.0``
when all tests pass and ``0.0`` otherwise, including when the answer has no code block.

- ``stdin`` tests run the code as a script (``if __name__ == "__main__":`` blocks unwrapped, after
  :data:`~skyrl_gym.envs.lcb.utils.IMPORT_PREAMBLE`) with the test input on standard input, and compare standard
  output line by line with :func:`~skyrl_gym.envs.lcb.utils.outputs_match` (numbers within 1e-6).
- ``functional`` tests call ``func_name`` (top-level, or a ``Solution`` method) through
  :func:`~skyrl_gym.envs.lcb.utils.build_functional_harness` and compare the JSON result with
  :func:`~skyrl_gym.envs.lcb.utils.json_outputs_match`.

How the tests run. The tests of an episode run as one batch of :meth:`skyrl_gym.sandbox.CodeExecutor.run_many`
(one batch per run of consecutive tests that share a program: all of them, unless stdin and functional tests are
mixed): one sandboxed run imports the preamble once, then forks a fresh process per test, which runs the program
like ``python -c`` with the test input on stdin, under the per-test wall-clock timeout, the memory limit and the
output cap; the batch stops at the first test that crashes, times out or floods its output. The sandbox contains
whatever the code does (fork bombs, daemons, files). The expected outputs never enter the sandbox: outputs are
compared here, so the code under test cannot read the answers.

The reward equals that of stopping at the first failed test (as skyrl-gym 0.4 did): a test that exits normally
with a wrong answer does not stop the batch (the sandbox cannot know), so later tests still run and are reported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from skyrl_gym.config import config_get
from skyrl_gym.envs._extras import ground_truth
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, EpisodeSample
from skyrl_gym.envs.lcb.utils import (
    IMPORT_PREAMBLE,
    build_functional_harness,
    extract_code_block,
    json_outputs_match,
    outputs_match,
    unwrap_main_guard,
)
from skyrl_gym.sandbox import CodeExecutor, ExecutionResult, SandboxLimits, get_default_executor

__all__ = ["LCBEnv", "LCBEnvConfig", "LCBTest", "TestOutcome", "grade_results", "parse_tests"]

_MIB = 1 << 20
# The output (stdout and stderr) of all tests together may be at most this many times ``max_output_mb``: it all
# comes back to this process, so many tests that each flood up to the per-test cap must not add up to gigabytes.
_TOTAL_OUTPUT_FACTOR = 4
_SIGNALS = frozenset(int(sig) for sig in signal.Signals)


@dataclasses.dataclass(frozen=True)
class LCBEnvConfig:
    """Limits of the tests; ``env_config`` may be this, a mapping or a ``DictConfig`` with any of these keys."""

    timeout: float = 6.0  # wall-clock seconds each test may run (skyrl-gym 0.4: 6)
    memory_mb: int = 4096  # address space of each test's process, MiB (skyrl-gym 0.4: 4 GiB)
    max_output_mb: int = 16  # a test that writes more than this to stdout or stderr fails (all tests: 4x this)

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout, int | float) and math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"lcb timeout must be a positive number of seconds, got {self.timeout!r}")
        for name in ("memory_mb", "max_output_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"lcb {name} must be a whole number >= 1, got {value!r}")

    @classmethod
    def from_env_config(cls, env_config: object) -> LCBEnvConfig:
        """Read the fields from any ``env_config`` (None, dataclass, mapping, ``DictConfig``); absent ones default."""
        defaults = cls()
        return cls(
            **{
                field.name: config_get(env_config, field.name, getattr(defaults, field.name))
                for field in dataclasses.fields(cls)
            }
        )


@dataclasses.dataclass(frozen=True)
class LCBTest:
    """One test case.

    Attributes:
        input: Standard input (``stdin``), or newline-separated JSON arguments (``functional``).
        output: Expected standard output, or the expected return value as JSON.
        testtype: ``"stdin"`` or ``"functional"``.
        func_name: The function or ``Solution`` method to call (``functional`` only).
    """

    input: str
    output: str
    testtype: Literal["stdin", "functional"]
    func_name: str | None = None


@dataclasses.dataclass(frozen=True)
class TestOutcome:
    """What happened to one test: ``status`` is ``"pass"``, ``"fail"`` or ``"skipped"`` (not run).

    ``reason`` says why a test failed: ``"wrong answer"``, ``"runtime error: <last traceback line>"`` (or
    ``"runtime error: killed by SIGKILL"`` and the like), ``"timeout (6.0 s)"``, ``"timeout (CPU time limit)"``,
    ``"output limit exceeded (16 MiB a test, 64 MiB in all)"``, or ``"the sandbox stopped before this test"``.
    """

    __test__ = False  # not a pytest test class, despite the name

    status: Literal["pass", "fail", "skipped"]
    reason: str | None = None


def parse_tests(raw: object) -> list[LCBTest]:
    """Decode ``reward_spec.ground_truth``: a JSON string or an already-decoded list of test dicts.

    ``metadata`` may itself be a JSON string (as in the LiveCodeBench release files); ``testtype`` defaults to
    ``"stdin"``. Non-string inputs and outputs are JSON-encoded.

    Raises:
        ValueError: The ground truth is not a non-empty list of tests, or a functional test has no ``func_name``.
    """
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"lcb ground_truth is not valid JSON: {exc}") from exc
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes) or not raw:
        raise ValueError(f"lcb ground_truth must be a non-empty list of tests, got {type(raw).__name__}")
    return [_parse_test(index, test) for index, test in enumerate(raw)]


def _parse_test(index: int, test: object) -> LCBTest:
    if not isinstance(test, Mapping) or "input" not in test or "output" not in test:
        raise ValueError(f"lcb test {index} must be a mapping with 'input' and 'output', got {test!r:.200}")
    testtype = test.get("testtype", "stdin")
    if testtype not in ("stdin", "functional"):
        raise ValueError(f"lcb test {index} has testtype {testtype!r}; expected 'stdin' or 'functional'")
    metadata = test.get("metadata") or {}
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    func_name = metadata.get("func_name") if isinstance(metadata, Mapping) else None
    if testtype == "functional" and not isinstance(func_name, str):
        raise ValueError(f"lcb functional test {index} needs metadata.func_name")
    return LCBTest(_text(test["input"]), _text(test["output"]), testtype, func_name)


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class LCBEnv(BaseTextEnv):
    """LiveCodeBench code generation: one step, reward 1.0 iff the last code block passes every test.

    Args:
        env_config: :class:`LCBEnvConfig` fields (``timeout``, ``memory_mb``, ``max_output_mb``) as a dataclass,
            mapping or ``DictConfig``; None for the defaults.
        extras: Must hold ``{"reward_spec": {"ground_truth": <tests>}}`` (see :func:`parse_tests`).
        executor: The sandbox to run tests in; default :func:`skyrl_gym.sandbox.get_default_executor`, looked up
            at step time. The env does not own it and never closes it.

    Attributes:
        ground_truth: ``extras["reward_spec"]["ground_truth"]`` as given.
        tests: The decoded tests.
        config: The limits in effect.

    Raises:
        AssertionError: ``extras`` lacks ``reward_spec`` or its ``ground_truth`` (skyrl-gym 0.4 messages).
        ValueError: The ground truth or ``env_config`` is malformed.
    """

    def __init__(
        self,
        env_config: Any = None,
        extras: Mapping[str, Any] | None = None,
        *,
        executor: CodeExecutor | None = None,
    ) -> None:
        super().__init__()
        self.ground_truth = ground_truth(extras)
        self.tests = parse_tests(self.ground_truth)
        self.config = LCBEnvConfig.from_env_config(env_config)
        self._executor = executor

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Grade the last code block of ``action``; always done. Never raises for any model output.

        Raises:
            skyrl_gym.sandbox.SandboxError: The sandbox itself failed (not the code under test).
        """
        self.turns += 1
        code = _code_of(action)
        if code is None:
            return self._output(None, [TestOutcome("skipped")] * len(self.tests))
        executor, limits = self._get_executor(), self._limits()
        results: list[ExecutionResult] = []
        for setup, program, inputs in _batches(self.tests, code):
            batch = executor.run_many(
                program,
                inputs,
                limits,
                setup=setup,
                stop_on_failure=True,
                max_total_output_bytes=self._output_left(results),
            )
            results += batch
            if len(batch) < len(inputs) or not batch[-1].ok:
                break  # a test crashed, timed out or flooded: the batch stopped there, and so do the tests
        return self._output(code, grade_results(self.tests, results, self.config))

    async def astep(self, action: str) -> BaseTextEnvStepOutput:
        """The asyncio twin of :meth:`step`: awaits the sandbox on the event loop, never blocks it."""
        self.turns += 1
        code = _code_of(action)
        if code is None:
            return self._output(None, [TestOutcome("skipped")] * len(self.tests))
        executor, limits = self._get_executor(), self._limits()
        results: list[ExecutionResult] = []
        for setup, program, inputs in _batches(self.tests, code):
            batch = await executor.arun_many(
                program,
                inputs,
                limits,
                setup=setup,
                stop_on_failure=True,
                max_total_output_bytes=self._output_left(results),
            )
            results += batch
            if len(batch) < len(inputs) or not batch[-1].ok:
                break
        return self._output(code, grade_results(self.tests, results, self.config))

    def _get_executor(self) -> CodeExecutor:
        return self._executor if self._executor is not None else get_default_executor()

    def _limits(self) -> SandboxLimits:
        """The limits of each test's run."""
        return SandboxLimits(
            timeout_s=self.config.timeout,
            memory_mb=self.config.memory_mb,
            cpu_s=self.config.timeout + 1,  # per process: a backstop behind the wall-clock timeout
            max_output_bytes=self.config.max_output_mb * _MIB,
        )

    def _output_left(self, results: Sequence[ExecutionResult]) -> int:
        """What is left of the output budget of all tests after ``results`` (bytes, as decoded text: close)."""
        used = sum(len(r.stdout.encode(errors="replace")) + len(r.stderr.encode(errors="replace")) for r in results)
        return max(0, self.config.max_output_mb * _MIB * _TOTAL_OUTPUT_FACTOR - used)

    def _output(self, code: str | None, outcomes: Sequence[TestOutcome]) -> BaseTextEnvStepOutput:
        """The final step's output: reward 1.0 iff every test passed; metadata summarises the tests.

        ``metadata``: ``parsed_code`` (None without a code block), ``num_tests``, ``num_passed``,
        ``test_results`` (``"pass"``/``"fail"``/``"skipped"`` per test) and ``failure`` (``{"test", "reason"}`` of
        the first failure, ``"test": None`` when there was no code block; None when all passed).
        """
        passed = sum(outcome.status == "pass" for outcome in outcomes)
        failures = ({"test": i, "reason": o.reason} for i, o in enumerate(outcomes) if o.status == "fail")
        failure = next(failures, None) if code is not None else {"test": None, "reason": "no code block"}
        metadata = {
            "parsed_code": code,
            "num_tests": len(outcomes),
            "num_passed": passed,
            "test_results": [outcome.status for outcome in outcomes],
            "failure": failure,
        }
        reward = 1.0 if code is not None and passed == len(outcomes) else 0.0
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata=metadata)

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """A three-test stdin problem (sum of a list) with a correct solution."""
        tests = [
            {"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin", "metadata": {}},
            {"input": "1\n-5\n", "output": "-5\n", "testtype": "stdin", "metadata": {}},
            {"input": "4\n10 20 30 40\n", "output": "100\n", "testtype": "stdin", "metadata": {}},
        ]
        return EpisodeSample(
            prompt=[
                {
                    "role": "user",
                    "content": "The first line holds N, the second N integers. Print their sum.\n"
                    "Answer with a Python program in a ```python code block; it reads standard input.",
                }
            ],
            extras={"reward_spec": {"method": "rule", "ground_truth": json.dumps(tests)}},
            actions=(
                "Read N, then the numbers:\n```python\nn = int(input())\nprint(sum(map(int, input().split())))\n```",
            ),
        )


def _code_of(action: object) -> str | None:
    """The code of the action's last fenced block; None without one (or for a non-string action)."""
    return extract_code_block(action) if isinstance(action, str) else None


def _batches(tests: Sequence[LCBTest], code: str) -> list[tuple[str, str, list[str]]]:
    """``(setup, program, inputs)`` per run of consecutive tests that share a program, in test order.

    A stdin test runs the code (main guard unwrapped) after the preamble; a functional test runs the harness for its
    function, which runs the preamble itself and reads the arguments from stdin.
    """
    batches: list[tuple[str, str, list[str]]] = []
    script: str | None = None  # the unwrapped code, parsed once for all stdin tests
    for test in tests:
        if test.testtype == "stdin":
            script = unwrap_main_guard(code) if script is None else script
            setup, program = IMPORT_PREAMBLE, script
        else:
            setup, program = "", build_functional_harness(code, test.func_name or "")
        if batches and batches[-1][:2] == (setup, program):
            batches[-1][2].append(test.input)
        else:
            batches.append((setup, program, [test.input]))
    return batches


def grade_results(
    tests: Sequence[LCBTest], results: Sequence[ExecutionResult], config: LCBEnvConfig
) -> list[TestOutcome]:
    """One :class:`TestOutcome` per test from the results of the tests that ran (in order), comparing outputs here.

    A test without a result after a failed one is ``"skipped"``; one without a result otherwise failed because
    the sandbox stopped early.
    """
    outcomes: list[TestOutcome] = []
    for index, test in enumerate(tests):
        if index < len(results):
            outcomes.append(_outcome(test, results[index], config))
        elif any(outcome.status == "fail" for outcome in outcomes):
            outcomes.append(TestOutcome("skipped"))
        else:
            outcomes.append(TestOutcome("fail", "the sandbox stopped before this test"))
    return outcomes


def _outcome(test: LCBTest, result: ExecutionResult, config: LCBEnvConfig) -> TestOutcome:
    """One test's outcome from its run: timeout, output cap or crash first, else compare the output."""
    if result.timed_out:
        return TestOutcome("fail", f"timeout ({config.timeout} s)")
    if result.truncated:
        mb = config.max_output_mb
        return TestOutcome("fail", f"output limit exceeded ({mb} MiB a test, {mb * _TOTAL_OUTPUT_FACTOR} MiB in all)")
    if result.exit_code != 0:
        return TestOutcome("fail", _runtime_error(result.exit_code, result.stderr))
    match = outputs_match if test.testtype == "stdin" else json_outputs_match
    return TestOutcome("pass") if match(test.output, result.stdout) else TestOutcome("fail", "wrong answer")


def _runtime_error(exit_code: int, stderr: str) -> str:
    last = _last_line(stderr)
    if exit_code == -signal.SIGXCPU:
        return "timeout (CPU time limit)"
    if exit_code < 0:
        return f"runtime error: killed by {signal.Signals(-exit_code).name if -exit_code in _SIGNALS else -exit_code}"
    return f"runtime error: {last}" if last else f"runtime error: exit status {exit_code}"


def _last_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""
