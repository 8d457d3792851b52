import asyncio
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf

import skyrl_gym
from skyrl_gym.async_env import astep
from skyrl_gym.checker import check_env
from skyrl_gym.envs.lcb.env import LCBEnv, LCBEnvConfig, LCBTest, parse_tests
from skyrl_gym.sandbox import CodeExecutor

ADD = [
    {"input": "1 2\n", "output": "3\n", "testtype": "stdin", "metadata": {}},
    {"input": "10 -4\n", "output": "6\n", "testtype": "stdin", "metadata": {}},
    {"input": "100 200\n", "output": "300\n", "testtype": "stdin", "metadata": {}},
]
ADD_SOLUTION = "a, b = map(int, input().split())\nprint(a + b)"

TWO_SUM = [
    {"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional", "metadata": {"func_name": "twoSum"}},
    {"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional", "metadata": {"func_name": "twoSum"}},
]
TWO_SUM_METHOD = """
class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
"""

# Small limits keep the hostile tests cheap for the machine.
TIGHT = {"timeout": 2, "memory_mb": 256, "max_output_mb": 1}


def answer(code: str, lang: str = "python") -> str:
    return f"Here is my solution.\n```{lang}\n{code}\n```\n"


def extras(tests: Any) -> dict[str, Any]:
    return {"reward_spec": {"method": "rule", "ground_truth": json.dumps(tests) if isinstance(tests, list) else tests}}


@pytest.fixture(scope="module")
def executor() -> Iterator[CodeExecutor]:
    with CodeExecutor(pool_size=2) as pool:
        yield pool


def grade(executor: CodeExecutor, code_or_action: str, tests: Any = ADD, config: Any = None, raw: bool = False) -> Any:
    env = LCBEnv(config, extras(tests), executor=executor)
    env.init([{"role": "user", "content": "Solve it."}])
    return env.step(code_or_action if raw else answer(code_or_action))


# Grading ---------------------------------------------------------------------------------------------------------


def test_correct_solution_scores_one(executor: CodeExecutor) -> None:
    out = grade(executor, ADD_SOLUTION)
    assert out["reward"] == 1.0
    assert isinstance(out["reward"], float)
    assert out["done"] is True
    assert out["observations"] == []
    assert out["metadata"] == {
        "parsed_code": ADD_SOLUTION,
        "num_tests": 3,
        "num_passed": 3,
        "test_results": ["pass", "pass", "pass"],
        "failure": None,
    }


def test_wrong_answer_scores_zero_and_says_why(executor: CodeExecutor) -> None:
    out = grade(executor, "a, b = map(int, input().split())\nprint(a + b if a < 50 else 0)")
    assert out["reward"] == 0.0
    assert out["metadata"]["test_results"] == ["pass", "pass", "fail"]
    assert out["metadata"]["failure"] == {"test": 2, "reason": "wrong answer"}


def test_runtime_error_reports_the_last_traceback_line_and_skips_the_rest(executor: CodeExecutor) -> None:
    out = grade(executor, "x = int(input().split()[0])\nprint(1 // (x - 1))")
    assert out["reward"] == 0.0
    assert out["metadata"]["test_results"] == ["fail", "skipped", "skipped"]
    assert out["metadata"]["failure"]["test"] == 0
    assert out["metadata"]["failure"]["reason"].startswith("runtime error: ZeroDivisionError: integer division")


def test_syntax_error_is_a_runtime_error(executor: CodeExecutor) -> None:
    out = grade(executor, "print(1 +")
    assert out["reward"] == 0.0
    assert out["metadata"]["failure"]["reason"].startswith("runtime error: SyntaxError")


def test_nonzero_exit_fails_and_zero_exit_passes(executor: CodeExecutor) -> None:
    assert grade(executor, ADD_SOLUTION + "\nimport sys; sys.exit(0)")["reward"] == 1.0
    out = grade(executor, ADD_SOLUTION + "\nimport sys; sys.exit(3)")
    assert out["reward"] == 0.0
    assert out["metadata"]["failure"]["reason"] == "runtime error: exit status 3"


def test_infinite_loop_times_out_then_the_next_episode_works(executor: CodeExecutor) -> None:
    started = time.monotonic()
    out = grade(executor, "while True:\n    pass", config={"timeout": 0.5})
    assert out["reward"] == 0.0
    assert out["metadata"]["failure"] == {"test": 0, "reason": "timeout (0.5 s)"}
    assert out["metadata"]["test_results"] == ["fail", "skipped", "skipped"]
    # Stops at the first timeout: one timeout's worth of waiting, not three (a loose bound, not a speed test).
    assert time.monotonic() - started < 10
    assert grade(executor, ADD_SOLUTION)["reward"] == 1.0


def test_no_code_block_scores_zero_without_running_anything(executor: CodeExecutor) -> None:
    out = grade(executor, "I think the answer is a + b.", raw=True)
    assert out["reward"] == 0.0
    assert out["done"] is True
    assert out["observations"] == []
    assert out["metadata"]["parsed_code"] is None
    assert out["metadata"]["failure"] == {"test": None, "reason": "no code block"}
    assert out["metadata"]["test_results"] == ["skipped"] * 3


def test_the_last_code_block_is_graded(executor: CodeExecutor) -> None:
    action = answer("print('draft')") + "Better:\n" + answer(ADD_SOLUTION, lang="py")
    out = grade(executor, action, raw=True)
    assert out["reward"] == 1.0
    assert out["metadata"]["parsed_code"] == ADD_SOLUTION


def test_main_guard_is_unwrapped(executor: CodeExecutor) -> None:
    main = "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\n"
    for guard in ("if __name__ == '__main__':\n    main()", 'if "__main__" == __name__: main()\nelse: print(0)'):
        assert grade(executor, main + guard)["reward"] == 1.0, guard


def test_every_way_of_reading_stdin_works(executor: CodeExecutor) -> None:
    for code in (
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))",
        "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))",
        "print(sum(map(int, open(0).read().split())))",
        "import sys\nprint(sum(int(x) for line in sys.stdin for x in line.split()))",
    ):
        assert grade(executor, code)["reward"] == 1.0, code


def test_preamble_names_are_available_without_imports(executor: CodeExecutor) -> None:
    code = "xs = list(map(int, input().split()))\nprint(reduce(operator.add, xs, 0) + len(Counter()))"
    assert grade(executor, code)["reward"] == 1.0


def test_stderr_output_does_not_count(executor: CodeExecutor) -> None:
    assert grade(executor, "import sys\nprint('debug', file=sys.stderr)\n" + ADD_SOLUTION)["reward"] == 1.0


def test_floats_compare_with_tolerance_and_integers_exactly(executor: CodeExecutor) -> None:
    third = [{"input": "", "output": "0.333333333\n", "testtype": "stdin", "metadata": {}}]
    assert grade(executor, "print(1 / 3)", third)["reward"] == 1.0
    assert grade(executor, "print(0.3334)", third)["reward"] == 0.0
    big = [{"input": "", "output": "1000000000\n", "testtype": "stdin", "metadata": {}}]
    assert grade(executor, "print(1000000001)", big)["reward"] == 0.0
    assert grade(executor, "print('1000000000  ')\nprint()", big)["reward"] == 1.0


# Functional tests ------------------------------------------------------------------------------------------------


def test_functional_solution_method(executor: CodeExecutor) -> None:
    out = grade(executor, TWO_SUM_METHOD, TWO_SUM)
    assert out["reward"] == 1.0
    assert out["metadata"]["test_results"] == ["pass", "pass"]


def test_functional_top_level_function_returning_a_tuple(executor: CodeExecutor) -> None:
    code = (
        "def twoSum(nums, target):\n"
        "    pairs = itertools.combinations(range(len(nums)), 2)\n"
        "    return next((i, j) for i, j in pairs if nums[i] + nums[j] == target)"
    )
    assert grade(executor, code, TWO_SUM)["reward"] == 1.0


def test_functional_wrong_result_and_missing_function(executor: CodeExecutor) -> None:
    out = grade(executor, "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]", TWO_SUM)
    assert out["reward"] == 0.0
    assert out["metadata"]["test_results"] == ["pass", "fail"]
    out = grade(executor, "def three_sum(nums):\n    return []", TWO_SUM)
    assert out["reward"] == 0.0
    assert "no function or Solution method named 'twoSum'" in out["metadata"]["failure"]["reason"]


def test_functional_print_in_solution_does_not_break_the_result(executor: CodeExecutor) -> None:
    code = TWO_SUM_METHOD.replace("seen = {}", "seen = {}\n        print('thinking')")
    assert grade(executor, code, TWO_SUM)["reward"] == 1.0


# Hostile code ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("fork_bomb", "import os\nwhile True:\n    os.fork()"),
        ("memory_bomb", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"),
        ("huge_stdout", "import sys\nsys.stdout.write('x' * 100_000_000)"),
        ("huge_stderr", "import sys\nfor _ in range(100):\n    sys.stderr.write('y' * 1_000_000)"),
        ("kills_its_runner", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"),
        ("closes_stdout", "import os\nos.close(1)\nprint(3)"),
        ("sleeping_daemon", "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint(0)"),
        ("null_bytes", "print(3)\x00"),
        ("deep_recursion", "def f(n):\n    return f(n + 1)\nf(0)"),
    ],
)
def test_hostile_code_scores_zero_and_the_next_episode_works(executor: CodeExecutor, name: str, code: str) -> None:
    out = grade(executor, code, config=TIGHT)
    assert out["reward"] == 0.0, name
    assert out["metadata"]["failure"]["test"] == 0, out["metadata"]
    assert grade(executor, ADD_SOLUTION, config=TIGHT)["reward"] == 1.0


def test_output_cap_is_reported(executor: CodeExecutor) -> None:
    out = grade(executor, "print('x' * 2_000_000)", config=TIGHT)
    assert out["metadata"]["failure"] == {"test": 0, "reason": "output limit exceeded (1 MiB a test, 4 MiB in all)"}


def test_the_output_of_all_tests_together_is_capped(executor: CodeExecutor) -> None:
    tests = [{"input": "", "output": "x" * 900_000, "testtype": "stdin"}] * 6
    out = grade(executor, "print('x' * 900_000)", tests, config=TIGHT)
    assert out["metadata"]["test_results"] == ["pass"] * 4 + ["fail", "skipped"]
    assert out["metadata"]["failure"]["reason"].startswith("output limit exceeded")


def test_a_daemon_left_by_a_passing_test_does_not_change_the_reward(executor: CodeExecutor) -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n" + ADD_SOLUTION
    assert grade(executor, code, config=TIGHT)["reward"] == 1.0


def test_hostile_actions_never_raise(executor: CodeExecutor) -> None:
    for action in ("", "```", "```python\n```", "``````", "```\n\x00\n```", "```python\n" + "(" * 10_000 + "\n```"):
        out = grade(executor, action, raw=True)
        assert out["reward"] == 0.0
        assert out["done"] is True


# Async -----------------------------------------------------------------------------------------------------------


def test_astep_runs_episodes_concurrently_without_blocking_the_loop(executor: CodeExecutor) -> None:
    slow = "import time\ntime.sleep(0.1)\n" + ADD_SOLUTION
    actions = [answer(ADD_SOLUTION), answer("print(0)"), answer(slow), answer("1/0"), "no code"]

    async def main() -> tuple[list[Any], int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.005)

        tick_task = asyncio.create_task(ticker())
        envs = [LCBEnv(None, extras(ADD), executor=executor) for _ in actions]
        outs = await asyncio.gather(*(astep(env, action) for env, action in zip(envs, actions, strict=True)))
        done.set()
        await tick_task
        return list(outs), ticks

    outs, ticks = asyncio.run(main())
    assert [out["reward"] for out in outs] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert all(out["done"] for out in outs)
    # The slow episode alone takes over 0.3 s; a blocked loop would have ticked only a few times.
    assert ticks >= 10


def test_astep_and_step_agree(executor: CodeExecutor) -> None:
    for code in (ADD_SOLUTION, "print(1)", "while True: pass"):
        env = LCBEnv({"timeout": 0.5}, extras(ADD), executor=executor)
        async_out = asyncio.run(env.astep(answer(code)))
        sync_out = grade(executor, code, config={"timeout": 0.5})
        assert async_out == sync_out


# Construction and configuration ------------------------------------------------------------------------------------


def test_make_and_the_default_executor() -> None:
    env = skyrl_gym.make("lcb", extras=extras(ADD))
    assert isinstance(env, LCBEnv)
    env.init([{"role": "user", "content": "Add."}])
    assert env.step(answer(ADD_SOLUTION))["reward"] == 1.0


def test_check_env() -> None:
    check_env("lcb")


def test_missing_fields_raise_the_upstream_assertions() -> None:
    with pytest.raises(AssertionError, match="reward_spec field is required"):
        skyrl_gym.make("lcb", extras={})
    with pytest.raises(AssertionError, match="ground_truth is required in reward_spec field"):
        skyrl_gym.make("lcb", extras={"reward_spec": {"method": "rule"}})


@dataclasses.dataclass
class MyConfig:
    timeout: float = 2.5
    memory_mb: int = 512


@pytest.mark.parametrize(
    ("env_config", "expected"),
    [
        (None, LCBEnvConfig()),
        ({}, LCBEnvConfig()),
        ({"timeout": 3, "max_output_mb": 2}, LCBEnvConfig(timeout=3, max_output_mb=2)),
        (MyConfig(), LCBEnvConfig(timeout=2.5, memory_mb=512)),
        (OmegaConf.create({"timeout": 1.5}), LCBEnvConfig(timeout=1.5)),
        (LCBEnvConfig(memory_mb=1024), LCBEnvConfig(memory_mb=1024)),
    ],
)
def test_env_config_forms(env_config: Any, expected: LCBEnvConfig) -> None:
    assert LCBEnv(env_config, extras(ADD)).config == expected


def test_default_limits_match_upstream() -> None:
    assert LCBEnvConfig().timeout == 6.0
    assert LCBEnvConfig().memory_mb == 4096


@pytest.mark.parametrize("bad", [{"timeout": 0}, {"timeout": float("nan")}, {"memory_mb": 0}, {"max_output_mb": 1.5}])
def test_bad_env_config_raises(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="lcb"):
        LCBEnv(bad, extras(ADD))


def test_ground_truth_forms() -> None:
    expected = [LCBTest("1 2\n", "3\n", "stdin"), LCBTest("[3, 2, 4]\n6", "[1, 2]", "functional", "twoSum")]
    raw = [ADD[0], {**TWO_SUM[1], "metadata": json.dumps({"func_name": "twoSum"})}]
    assert parse_tests(json.dumps(raw)) == expected
    assert parse_tests(raw) == expected
    assert parse_tests([{"input": "", "output": "1"}]) == [LCBTest("", "1", "stdin")]
    env = LCBEnv(None, {"reward_spec": {"ground_truth": raw}})
    assert env.ground_truth is raw
    assert env.tests == expected


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        "[]",
        json.dumps({"input": "1"}),
        json.dumps([{"input": "1"}]),
        json.dumps([{"input": "1", "output": "1", "testtype": "interactive"}]),
        json.dumps([{"input": "1", "output": "1", "testtype": "functional", "metadata": {}}]),
    ],
)
def test_malformed_ground_truth_raises(bad: str) -> None:
    with pytest.raises(ValueError, match="lcb"):
        LCBEnv(None, {"reward_spec": {"ground_truth": bad}})


def test_sample_episode_solution_is_correct(executor: CodeExecutor) -> None:
    sample = LCBEnv.sample_episode()
    env = LCBEnv(sample.env_config, sample.extras, executor=executor)
    env.init(sample.prompt)
    assert env.step(sample.actions[0])["reward"] == 1.0
