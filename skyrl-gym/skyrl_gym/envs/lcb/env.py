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

How the tests run. All tests of an episode run in one sandboxed run of a :class:`~skyrl_gym.sandbox.CodeExecutor`:
a small *batch runner* (the ``_sandbox_*`` functions below, whose source is sent into the sandbox) forks a clean
child per test from a parent that already imported the preamble's modules, gives it the test input on stdin,
collects its stdout, and stops at the first test that crashes, times out or floods its output. Each child runs
under the per-test wall-clock timeout, the memory limit and the output cap; the sandbox contains whatever the
code does (fork bombs, daemons, files). One interpreter start per episode instead of one per test is what makes
the env fast. The expected outputs never enter the sandbox: outputs are compared here, so the code under test
cannot read the answers from its runner's memory.

The reward equals that of stopping at the first failed test (as skyrl-gym 0.4 did): a test that exits normally
with a wrong answer does not stop the runner (it cannot know), so later tests still run and are reported.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import inspect
import json
import math
import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn

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

if TYPE_CHECKING:
    import types

__all__ = ["LCBEnv", "LCBEnvConfig", "LCBTest", "TestOutcome", "grade_reports", "parse_tests"]

_MIB = 1 << 20
# Room the runner needs besides the tests' own output: its JSON framing and stderr tails.
_REPORT_SLACK_BYTES = 64 << 10
# The stdout of all tests together may be at most this many times ``max_output_mb``: it all comes back to this
# process, so many tests that each flood up to the per-test cap must not add up to gigabytes.
_TOTAL_OUTPUT_FACTOR = 4
# How much of a failed test's stderr comes back (enough for the end of a traceback).
_STDERR_TAIL_BYTES = 4096
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

    ``reason`` says why a test failed: ``"wrong answer"``, ``"runtime error: <last traceback line>"``,
    ``"timeout (6.0 s)"``, ``"output limit exceeded (16 MiB a test, 64 MiB in all)"`` or a sandbox failure.
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
        job, limits = self._job(code)
        result = self._get_executor().run(_runner_source(), stdin=job, limits=limits)
        return self._output(code, grade_reports(self.tests, result, self.config))

    async def astep(self, action: str) -> BaseTextEnvStepOutput:
        """The asyncio twin of :meth:`step`: awaits the sandbox on the event loop, never blocks it."""
        self.turns += 1
        code = _code_of(action)
        if code is None:
            return self._output(None, [TestOutcome("skipped")] * len(self.tests))
        job, limits = self._job(code)
        result = await self._get_executor().arun(_runner_source(), stdin=job, limits=limits)
        return self._output(code, grade_reports(self.tests, result, self.config))

    def _get_executor(self) -> CodeExecutor:
        return self._executor if self._executor is not None else get_default_executor()

    def _job(self, code: str) -> tuple[str, SandboxLimits]:
        """The batch runner's job (JSON for its stdin) and the limits of its sandboxed run."""
        programs: dict[tuple[str, str], int] = {}
        tests: list[tuple[int, str]] = []
        for test in self.tests:
            if test.testtype == "stdin":
                program = (IMPORT_PREAMBLE, unwrap_main_guard(code))
            else:  # the harness runs the preamble itself, and reads the arguments from stdin
                program = ("", build_functional_harness(code, test.func_name or ""))
            tests.append((programs.setdefault(program, len(programs)), test.input))
        cap = self.config.max_output_mb * _MIB
        job = {
            "warmup": IMPORT_PREAMBLE,
            "programs": [{"prelude": prelude, "source": source} for prelude, source in programs],
            "tests": tests,
            "timeout_s": float(self.config.timeout),
            "output_cap": cap,
            "total_output_cap": cap * _TOTAL_OUTPUT_FACTOR,
            "stderr_tail_bytes": _STDERR_TAIL_BYTES,
        }
        largest_input_mb = max(len(test.input) for test in self.tests) * 4 // _MIB + 1  # UTF-8: <= 4 bytes a char
        limits = SandboxLimits(
            # skyrl-gym 0.4's overall deadline for a problem: (timeout + 1) per test, plus 5.
            timeout_s=(self.config.timeout + 1) * len(self.tests) + 5,
            memory_mb=self.config.memory_mb,
            cpu_s=self.config.timeout + 1,  # per process, so per test: a backstop behind the wall-clock timeout
            # Base64 makes 4 bytes of 3; a stderr tail may take 6 bytes a byte as JSON escapes.
            max_output_bytes=math.ceil(cap * _TOTAL_OUTPUT_FACTOR * 4 / 3)
            + len(tests) * _STDERR_TAIL_BYTES * 6
            + _REPORT_SLACK_BYTES,
            max_file_mb=max(64, self.config.max_output_mb + 1, largest_input_mb),
        )
        return json.dumps(job), limits

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


def grade_reports(tests: Sequence[LCBTest], result: ExecutionResult, config: LCBEnvConfig) -> list[TestOutcome]:
    """Turn the batch runner's sandboxed run into one :class:`TestOutcome` per test, comparing outputs here.

    A test after the first failure that has no report is ``"skipped"``; without any report at all (the runner
    was killed, e.g. by the code under test), every test fails with the sandbox's reason.
    """
    reports = _parse_reports(result)
    if reports is None:
        return [TestOutcome("fail", _sandbox_failure(result))] * len(tests)
    outcomes: list[TestOutcome] = []
    for index, test in enumerate(tests):
        if index < len(reports):
            outcomes.append(_outcome(test, reports[index], config))
        elif any(outcome.status == "fail" for outcome in outcomes):
            outcomes.append(TestOutcome("skipped"))
        else:  # the runner stopped early without a failure: it was cut off
            outcomes.append(TestOutcome("fail", _sandbox_failure(result)))
    return outcomes


def _parse_reports(result: ExecutionResult) -> list[dict[str, Any]] | None:
    """The runner's per-test reports (its last line of output), or None if it did not finish cleanly."""
    if not result.ok:
        return None
    lines = result.stdout.rstrip("\n").rsplit("\n", 1)
    try:
        reports = json.loads(lines[-1])
    except ValueError:
        return None
    if not isinstance(reports, list) or not all(isinstance(report, dict) for report in reports):
        return None
    return reports


def _sandbox_failure(result: ExecutionResult) -> str:
    if result.timed_out:
        return "timeout (the whole run hit its deadline)"
    if result.truncated:
        return "output limit exceeded"
    # Usually the code under test killed its runner; the sandbox itself failing raises instead.
    reason = f"the test runner died (exit status {result.exit_code})"
    last = _last_line(result.stderr)
    return f"{reason}: {last}" if last else reason


def _outcome(test: LCBTest, report: Mapping[str, Any], config: LCBEnvConfig) -> TestOutcome:
    """One test's outcome from its report: crash, timeout or output cap first, else compare the output."""
    exit_code = report.get("exit_code")
    if report.get("timed_out"):
        return TestOutcome("fail", f"timeout ({config.timeout} s)")
    if report.get("output_exceeded"):
        mb = config.max_output_mb
        return TestOutcome("fail", f"output limit exceeded ({mb} MiB a test, {mb * _TOTAL_OUTPUT_FACTOR} MiB in all)")
    if exit_code != 0:
        return TestOutcome("fail", _runtime_error(exit_code, str(report.get("stderr_tail", ""))))
    try:
        stdout = base64.b64decode(str(report.get("stdout", "")), validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return TestOutcome("fail", "sandbox error: malformed test report")
    match = outputs_match if test.testtype == "stdin" else json_outputs_match
    return TestOutcome("pass") if match(test.output, stdout) else TestOutcome("fail", "wrong answer")


def _runtime_error(exit_code: object, stderr_tail: str) -> str:
    last = _last_line(stderr_tail)
    if exit_code == -signal.SIGXCPU:
        return "timeout (CPU time limit)"
    if isinstance(exit_code, int) and exit_code < 0:
        return f"runtime error: killed by {signal.Signals(-exit_code).name if -exit_code in _SIGNALS else -exit_code}"
    return f"runtime error: {last}" if last else f"runtime error: exit status {exit_code}"


def _last_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


# --- The batch runner ------------------------------------------------------------------------------------------------
# The functions below run inside the sandbox, not here: their source is sent as the program of a sandboxed run, so
# each imports what it needs itself and uses nothing else of this module. The job arrives as JSON on stdin; the
# report is one JSON line on stdout: a list with one entry per test that ran,
#   {"exit_code", "timed_out", "output_exceeded", "duration_s", "stdout" (base64, only on exit 0), "stderr_tail"}.

_RUNNER_FUNCTIONS = (
    "_sandbox_main",
    "_sandbox_run_test",
    "_sandbox_wait",
    "_sandbox_child",
    "_sandbox_redirect",
    "_sandbox_exec",
)


@functools.cache
def _runner_source() -> str:
    """The batch runner program: the ``_sandbox_*`` functions and a call of ``_sandbox_main``."""
    parts = [inspect.getsource(globals()[name]) for name in _RUNNER_FUNCTIONS]
    return "from __future__ import annotations\n\n" + "\n\n".join(parts) + "\n_sandbox_main()\n"


def _sandbox_main() -> None:
    """Run the job's tests in order, each in a forked child; stop at the first crash, timeout or output flood."""
    import atexit  # noqa: F401 -- atexit, resource and traceback are for the children: imported once, here
    import gc
    import json
    import os
    import resource  # noqa: F401
    import sys
    import traceback  # noqa: F401

    job = json.loads(sys.stdin.buffer.read())
    # Import the preamble's modules once, so that each child finds them already loaded (the fork copies them).
    exec(compile(job["warmup"], "<warmup>", "exec", dont_inherit=True), {"__name__": "__warmup__"})
    programs = [
        (compile(program["prelude"], "<prelude>", "exec", dont_inherit=True), program["source"])
        for program in job["programs"]
    ]
    # Keep the collector away from everything that exists now, so that a child's collections do not touch (and
    # copy) the pages shared with this process.
    gc.freeze()
    reports = []
    budget = job["total_output_cap"]
    for program_index, text in job["tests"]:
        prelude, source = programs[program_index]
        limits = {
            "timeout_s": job["timeout_s"],
            "output_cap": min(job["output_cap"], budget),
            "stderr_tail_bytes": job["stderr_tail_bytes"],
        }
        report = _sandbox_run_test(prelude, source, text, limits)
        reports.append(report)
        budget -= report.pop("stdout_size")
        if report["exit_code"] != 0 or report["timed_out"] or report["output_exceeded"]:
            break
    sys.stdout.write(json.dumps(reports) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip the interpreter's teardown: nothing is left to clean up, and it costs milliseconds


def _sandbox_run_test(prelude: types.CodeType, source: str, text: str, limits: dict[str, Any]) -> dict[str, Any]:
    """Fork a child that runs ``source`` with ``text`` on stdin; wait for it; report what it did.

    ``limits`` holds ``timeout_s``, ``output_cap`` (bytes, each of stdout and stderr) and ``stderr_tail_bytes``
    (how much of a failed test's stderr to report).
    """
    import base64
    import contextlib
    import os
    import sys
    import time

    # In-memory files rather than pipes: the child can write its whole output without anyone reading
    # concurrently, and RLIMIT_FSIZE caps it.
    stdin_fd, stdout_fd, stderr_fd = (os.memfd_create(name) for name in ("stdin", "stdout", "stderr"))
    data = memoryview(text.encode("utf-8", "surrogatepass"))
    while data:
        data = data[os.write(stdin_fd, data) :]
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _sandbox_child(prelude, source, (stdin_fd, stdout_fd, stderr_fd), limits["output_cap"])
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # the child does it too: whichever runs first, no killpg can miss the group
    timed_out, exit_code = _sandbox_wait(pid, limits["timeout_s"])
    duration = time.monotonic() - started
    out_size, err_size = os.fstat(stdout_fd).st_size, os.fstat(stderr_fd).st_size
    exceeded = max(out_size, err_size) > limits["output_cap"]
    ok = exit_code == 0 and not timed_out and not exceeded
    stdout = os.pread(stdout_fd, out_size, 0) if ok else b""
    tail_size = min(err_size, limits["stderr_tail_bytes"]) if not ok else 0
    tail = os.pread(stderr_fd, tail_size, err_size - tail_size)
    for fd in (stdin_fd, stdout_fd, stderr_fd):
        os.close(fd)
    return {
        "exit_code": exit_code,
        "timed_out": timed_out,
        "output_exceeded": exceeded,
        "duration_s": duration,
        "stdout_size": out_size,
        "stdout": base64.b64encode(stdout).decode("ascii"),
        "stderr_tail": tail.decode("utf-8", "replace"),
    }


def _sandbox_wait(pid: int, timeout_s: float) -> tuple[bool, int]:
    """Wait up to ``timeout_s`` for child ``pid``, kill its process group, reap it: ``(timed_out, exit_code)``."""
    import contextlib
    import os
    import select
    import signal
    import time

    deadline = time.monotonic() + timeout_s
    try:
        pidfd = os.pidfd_open(pid)  # readable once the child exits: an exact wait with a timeout
    except (AttributeError, OSError):
        pidfd = -1
    status = None
    delay = 0.0002
    try:
        while status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if pidfd >= 0:
                select.select([pidfd], [], [], remaining)
            else:
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.01)
            reaped, raw = os.waitpid(pid, os.WNOHANG)
            if reaped:
                status = raw
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    timed_out = status is None
    if status is None:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)  # whatever the test left running in its group
    return timed_out, os.waitstatus_to_exitcode(status)


def _sandbox_child(prelude: types.CodeType, source: str, fds: tuple[int, int, int], output_cap: int) -> NoReturn:
    """In the forked child: run ``source`` as ``python -c`` would, on the test's stdin/stdout/stderr; never return."""
    import os

    status = 70  # EX_SOFTWARE: the child failed before the code ran
    try:
        kept = _sandbox_redirect(fds, output_cap)  # noqa: F841 -- must stay referenced until exit
        status = _sandbox_exec(prelude, source)
    finally:
        os._exit(status)


def _sandbox_redirect(fds: tuple[int, int, int], output_cap: int) -> tuple[object, ...]:
    """Make ``fds`` the child's descriptors 0-2 and ``sys`` streams; cap file writes at ``output_cap + 1`` bytes.

    Returns the runner's stream objects, which the caller must keep referenced: freeing them would close
    descriptors 0-2, which now belong to the test.
    """
    import os
    import resource
    import sys

    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    cap = output_cap + 1 if hard == resource.RLIM_INFINITY else min(output_cap + 1, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
    old = (sys.stdin, sys.stdout, sys.stderr)
    encoding = sys.stdout.encoding
    streams = {
        "stdin": open(0, encoding=sys.stdin.encoding, errors=sys.stdin.errors, closefd=False),  # noqa: SIM115
        "stdout": open(1, "w", encoding=encoding, errors=sys.stdout.errors, closefd=False),  # noqa: SIM115
        # Line-buffered with backslash escapes, like the interpreter's own stderr.
        "stderr": open(2, "w", 1, encoding=encoding, errors="backslashreplace", closefd=False),  # noqa: SIM115
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    return old


def _sandbox_exec(prelude: types.CodeType, source: str) -> int:
    """Run ``prelude`` then ``source`` in a fresh ``__main__``, finish like interpreter exit; the exit status."""
    import atexit
    import builtins
    import sys
    import traceback
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    status = 1
    try:
        exec(prelude, main.__dict__)
        exec(compile(source, "<string>", "exec", dont_inherit=True), main.__dict__)
        status = 0
    except SystemExit as exc:
        # As the interpreter does at top level: None is 0, an int is the status, anything else is printed.
        if exc.code is None or isinstance(exc.code, int):
            status = (exc.code or 0) & 0xFF
        else:
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        # Start the traceback at the code's own frame, as python -c prints it.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
    shutdown = getattr(sys.modules.get("threading"), "_shutdown", None)
    if shutdown is not None:
        shutdown()  # wait for non-daemon threads, as interpreter exit does
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except OSError:
        status = status or 120  # python's status when flushing stdout at exit fails (e.g. past the output cap)
    sys.stderr.flush()
    return status
