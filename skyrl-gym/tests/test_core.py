from typing import Any

import pytest

from skyrl_gym import error
from skyrl_gym.core import Env, EnvStepOutput
from skyrl_gym.envs.base_text_env import (
    BaseTextEnv,
    BaseTextEnvStepOutput,
    ConversationType,
    EpisodeSample,
)
from skyrl_gym.tools.core import ToolGroup, tool


class CountingEnv(Env[str, str]):
    def __init__(self) -> None:
        self.close_calls = 0

    def close(self) -> None:
        self.close_calls += 1


class Calculator(ToolGroup):
    def __init__(self) -> None:
        super().__init__(name="Calculator")

    @tool
    def add(self, a: int, b: int) -> int:
        return a + b


class Echo(ToolGroup):
    def __init__(self) -> None:
        super().__init__(name="Echo")

    @tool
    def echo(self, text: str) -> str:
        return text


class ToolEnv(BaseTextEnv):
    def __init__(self) -> None:
        super().__init__()
        self.init_tool_groups([Calculator(), Echo()])

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        result = self._execute_tool("Calculator", "add", [1, 2])
        return {
            "observations": [{"role": "user", "content": str(result)}],
            "reward": 0.0,
            "done": False,
            "metadata": {},
        }


def test_env_base_methods_raise_not_implemented() -> None:
    env: Env[Any, Any] = Env()
    with pytest.raises(NotImplementedError):
        env.init()
    with pytest.raises(NotImplementedError):
        env.step("x")


def test_env_close_is_a_noop_and_idempotent() -> None:
    env: Env[Any, Any] = Env()
    env.close()
    env.close()


def test_env_str_names_the_class() -> None:
    assert str(CountingEnv()) == "Env(CountingEnv)"


def test_env_spec_defaults_to_none() -> None:
    assert CountingEnv().spec is None


def test_context_manager_returns_self_and_closes() -> None:
    env = CountingEnv()
    with env as entered:
        assert entered is env
        assert env.close_calls == 0
    assert env.close_calls == 1


def test_context_manager_does_not_swallow_exceptions() -> None:
    env = CountingEnv()
    with pytest.raises(KeyError), env:
        raise KeyError("boom")
    assert env.close_calls == 1


def test_step_outputs_are_plain_dicts() -> None:
    out: EnvStepOutput[list[str]] = {"observations": ["a"], "reward": 1.0, "done": True, "metadata": {}}
    text_out: BaseTextEnvStepOutput = {"observations": [], "reward": 0.5, "done": False, "metadata": {"k": 1}}
    assert type(out) is dict
    assert type(text_out) is dict
    assert text_out["reward"] == 0.5
    assert "postprocessed_action" in BaseTextEnvStepOutput.__optional_keys__
    assert {"observations", "reward", "done", "metadata"} <= BaseTextEnvStepOutput.__required_keys__


def test_base_text_env_defaults() -> None:
    env = BaseTextEnv()
    assert env.turns == 0
    assert env.max_turns == 1
    assert env.tool_groups == []
    assert env.tool_to_toolgroup == {}
    assert env.get_metrics() == {}
    assert env.sample_episode() is None


def test_base_text_env_init_returns_prompt_and_empty_info() -> None:
    prompt: ConversationType = [{"role": "user", "content": "hi"}]
    observations, info = BaseTextEnv().init(prompt)
    assert observations == prompt
    assert info == {}


def test_base_text_env_step_is_abstract() -> None:
    with pytest.raises(NotImplementedError):
        BaseTextEnv().step("anything")


def test_base_text_env_aggregate_metrics_averages_numbers() -> None:
    merged = BaseTextEnv.aggregate_metrics([{"acc": 1, "name": "x"}, {"acc": 0}])
    assert merged == {"acc": 0.5}
    assert BaseTextEnv.aggregate_metrics([]) == {}


def test_init_tool_groups_indexes_tools_by_name() -> None:
    env = ToolEnv()
    assert [group.name for group in env.tool_groups] == ["Calculator", "Echo"]
    assert env.tool_to_toolgroup == {"add": "Calculator", "echo": "Echo"}


def test_init_tool_groups_replaces_previous_groups() -> None:
    env = ToolEnv()
    env.init_tool_groups([Echo()])
    assert env.tool_to_toolgroup == {"echo": "Echo"}
    env.init_tool_groups()
    assert env.tool_groups == []
    assert env.tool_to_toolgroup == {}


def test_execute_tool_passes_input_as_positional_arguments() -> None:
    env = ToolEnv()
    assert env._execute_tool("Calculator", "add", [2, 3]) == 5
    assert env._execute_tool("Echo", "echo", ("hello",)) == "hello"
    assert env.step("x")["observations"] == [{"role": "user", "content": "3"}]


def test_execute_tool_unknown_group_raises_value_error() -> None:
    with pytest.raises(ValueError, match="Nope"):
        ToolEnv()._execute_tool("Nope", "add", [1, 2])


def test_execute_tool_unknown_tool_raises_value_error() -> None:
    with pytest.raises(ValueError, match=r"^Tool 'mul' not found in group 'Calculator'\.$") as info:
        ToolEnv()._execute_tool("Calculator", "mul", [1, 2])
    assert isinstance(info.value, error.ToolNotFoundError)


def test_episode_sample_defaults() -> None:
    sample = EpisodeSample(prompt=[{"role": "user", "content": "q"}])
    assert sample.extras == {}
    assert sample.env_config is None
    assert sample.actions == ()


def test_error_hierarchy() -> None:
    assert issubclass(error.RegistrationError, error.Error)
    assert issubclass(error.InvalidEntryPointError, error.RegistrationError)
    assert issubclass(error.InvalidEntryPointError, AssertionError)
    assert issubclass(error.UnregisteredEnvError, error.Error)
    assert issubclass(error.UnregisteredEnvError, ValueError)
    assert issubclass(error.InvalidEnvError, AssertionError)
    assert issubclass(error.ToolNotFoundError, ValueError)
    assert issubclass(error.EnvContractError, error.Error)
