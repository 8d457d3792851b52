"""Code written against skyrl-gym 0.4 must run unchanged: names, paths, messages and behaviour of the public API."""

import dataclasses
import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register, registry

UPSTREAM_BUILTINS = {
    "aime": "skyrl_gym.envs.aime.env:AIMEEnv",
    "gsm8k": "skyrl_gym.envs.gsm8k.env:GSM8kEnv",
    "gsm8k_multi_turn": "skyrl_gym.envs.gsm8k.multi_turn_env:GSM8kMultiTurnEnv",
    "text2sql": "skyrl_gym.envs.sql.env:SQLEnv",
    "search": "skyrl_gym.envs.search.env:SearchEnv",
    "lcb": "skyrl_gym.envs.lcb.env:LCBEnv",
    "searchcode": "skyrl_gym.envs.searchcode.env:SearchCodeEnv",
}


@dataclasses.dataclass
class MultiplyConfig:
    bonus: float = 0.0


class MultiplyEnv(BaseTextEnv):
    """Shaped like an out-of-tree 0.4 env: (env_config=None, extras={}) and attribute access on env_config."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] = {}) -> None:  # noqa: B006 -- 0.4 style
        super().__init__()
        assert "reward_spec" in extras, "reward_spec field is required"
        assert "ground_truth" in extras["reward_spec"], "ground_truth is required in reward_spec field"
        self.ground_truth = extras["reward_spec"]["ground_truth"]
        self.max_turns = extras.get("max_turns", 2)
        self.bonus = env_config.bonus if env_config is not None else 0.0

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        correct = action.strip() == self.ground_truth
        done = correct or self.turns >= self.max_turns
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": "user", "content": "Try again."}],
            reward=(1.0 + self.bonus) if correct else 0.0,
            done=done,
            metadata={"parsed": action.strip()},
        )

    def get_metrics(self) -> dict[str, Any]:
        return {"steps": self.turns}

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        return {"avg_steps": sum(m["steps"] for m in metrics) / len(metrics)}


@pytest.fixture(autouse=True)
def _restore_registry() -> Iterator[None]:
    saved = dict(registry)
    yield
    registry.clear()
    registry.update(saved)


def extras(answer: str = "12", **more: Any) -> dict[str, Any]:
    return {"reward_spec": {"method": "rule", "ground_truth": answer}, **more}


def test_top_level_names() -> None:
    for name in ["Env", "error", "make", "spec", "register", "registry", "pprint_registry", "envs", "tools"]:
        assert hasattr(skyrl_gym, name), name
    assert skyrl_gym.__version__ == "0.1.0"
    assert skyrl_gym.Env is importlib.import_module("skyrl_gym.core").Env


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("skyrl_gym.core", ["Env", "EnvStepOutput"]),
        ("skyrl_gym.error", ["Error", "RegistrationError"]),
        (
            "skyrl_gym.envs.base_text_env",
            ["BaseTextEnv", "BaseTextEnvStepOutput", "MessageType", "ConversationType"],
        ),
        (
            "skyrl_gym.envs.registration",
            ["EnvSpec", "register", "deregister", "make", "spec", "registry", "pprint_registry", "load_env_creator"],
        ),
        ("skyrl_gym.envs", ["BaseTextEnv", "BaseTextEnvStepOutput", "register", "make"]),
        ("skyrl_gym.metrics", ["default_aggregate_metrics", "aggregate_for_environment"]),
        ("skyrl_gym.tools.core", ["tool", "ToolGroup"]),
    ],
)
def test_module_paths(module: str, names: list[str]) -> None:
    imported = importlib.import_module(module)
    for name in names:
        assert hasattr(imported, name), f"{module}.{name}"


def test_tools_package_names() -> None:
    assert {"SQLCodeExecutorToolGroup", "SearchToolGroup", "PythonCodeExecutorToolGroup"} <= set(
        skyrl_gym.tools.__all__
    )


def test_builtin_registrations() -> None:
    for env_id, entry_point in UPSTREAM_BUILTINS.items():
        assert env_id in registry
        assert skyrl_gym.spec(env_id).entry_point == entry_point
    assert "rlm" not in registry


def test_registry_is_a_dict_supporting_in() -> None:
    assert isinstance(registry, dict)
    assert "gsm8k" in skyrl_gym.registry
    assert "definitely-not-registered" not in skyrl_gym.registry


def test_out_of_tree_registration_and_make_with_dataclass_config() -> None:
    register(id="multiply", entry_point=MultiplyEnv)
    env = skyrl_gym.make("multiply", env_config=MultiplyConfig(bonus=0.5), extras=extras("12"))
    assert isinstance(env, skyrl_gym.Env)
    observations, info = env.init([{"role": "user", "content": "3*4?"}])
    assert observations == [{"role": "user", "content": "3*4?"}]
    assert info == {}
    out = env.step("11")
    assert out["reward"] == 0.0
    assert out["done"] is False
    assert out["observations"] == [{"role": "user", "content": "Try again."}]
    assert out["metadata"] == {"parsed": "11"}
    out = env.step("12")
    assert out["reward"] == 1.5
    assert out["done"] is True
    assert out["observations"] == []
    assert env.turns == 2
    assert env.get_metrics() == {"steps": 2}


def test_make_with_omegaconf_config_and_without_config() -> None:
    register(id="multiply", entry_point=MultiplyEnv)
    env = skyrl_gym.make("multiply", extras=extras())
    assert env.bonus == 0.0  # type: ignore[attr-defined]
    omega = OmegaConf.create({"bonus": 2.0})
    env = skyrl_gym.make("multiply", env_config=omega, extras=extras())
    assert env.bonus == 2.0  # type: ignore[attr-defined]


def test_env_assertion_messages_survive_make() -> None:
    register(id="multiply", entry_point=MultiplyEnv)
    with pytest.raises(AssertionError, match="reward_spec field is required"):
        skyrl_gym.make("multiply", extras={})
    with pytest.raises(AssertionError, match="ground_truth is required in reward_spec field"):
        skyrl_gym.make("multiply", extras={"reward_spec": {}})


def test_unknown_id_error() -> None:
    with pytest.raises(skyrl_gym.error.Error, match="No registered env with id: multiplyy"):
        skyrl_gym.make("multiplyy")


def test_duplicate_registration_error() -> None:
    register(id="multiply", entry_point=MultiplyEnv)
    with pytest.raises(skyrl_gym.error.RegistrationError):
        register(id="multiply", entry_point=MultiplyEnv)


def test_register_requires_an_entry_point() -> None:
    with pytest.raises(AssertionError):
        register(id="no-entry-point")


def test_deregister_missing_raises_error() -> None:
    with pytest.raises(skyrl_gym.error.Error):
        skyrl_gym.deregister("not-there")


def test_type_error_mentions_env_id() -> None:
    register(id="multiply", entry_point=MultiplyEnv)
    with pytest.raises(TypeError, match="multiply"):
        skyrl_gym.make("multiply", extras=extras(), unknown=1)


def test_make_rejects_non_env() -> None:
    register(id="not-env", entry_point=lambda **kwargs: "a string")
    with pytest.raises(AssertionError):
        skyrl_gym.make("not-env")


def test_env_spec_shape() -> None:
    spec = skyrl_gym.spec("gsm8k")
    assert spec.id == spec.name == "gsm8k"
    assert spec.kwargs == {}
    assert isinstance(spec.to_json(), str)
    assert type(spec).from_json(spec.to_json()) == spec


def test_pprint_registry_signature() -> None:
    text = skyrl_gym.pprint_registry(skyrl_gym.registry, num_cols=1, disable_print=True)
    assert text is not None
    assert text.splitlines() == sorted(skyrl_gym.registry)


def test_env_str_and_context_manager() -> None:
    register(id="multiply", entry_point=MultiplyEnv)
    with skyrl_gym.make("multiply", extras=extras()) as env:
        assert str(env) == "Env(MultiplyEnv)"


def test_base_text_env_attributes() -> None:
    env = BaseTextEnv()
    assert (env.turns, env.max_turns, env.tool_groups, env.tool_to_toolgroup) == (0, 1, [], {})
    assert BaseTextEnv.aggregate_metrics([{"a": 1.0}, {"a": 0.0}]) == {"a": 0.5}


def test_tool_group_contract() -> None:
    from skyrl_gym.tools.core import ToolGroup, tool

    class Finder(ToolGroup):
        def __init__(self) -> None:
            super().__init__(name="Finder")

        @tool
        def find(self, query: str) -> str:
            return f"found {query}"

    group = Finder()
    assert group.get_name() == "Finder"
    assert group.get_tool_names() == ["find"]
    assert group.execute_tool("find", "x") == "found x"
    assert group.get_tool_to_group_mapping() == {"find": "Finder"}
    with pytest.raises(ValueError, match=r"Tool 'search' not found in group 'Finder'\."):
        group.execute_tool("search", "x")

    env = BaseTextEnv()
    env.init_tool_groups([group])
    assert env.tool_to_toolgroup == {"find": "Finder"}
    assert env._execute_tool("Finder", "find", ["y"]) == "found y"
    with pytest.raises(ValueError, match="Missing"):
        env._execute_tool("Missing", "find", ["y"])


def test_metrics_aggregation_per_env_class() -> None:
    from skyrl_gym.metrics import aggregate_for_environment, default_aggregate_metrics

    register(id="multiply", entry_point=MultiplyEnv)
    assert aggregate_for_environment("multiply", [{"steps": 1}, {"steps": 3}]) == {"avg_steps": 2.0}
    assert default_aggregate_metrics([]) == {}
    assert default_aggregate_metrics([{"ok": True, "s": "x"}, {"ok": False}]) == {"ok": 0.5}
    with pytest.raises(ValueError, match="unknown-env"):
        aggregate_for_environment("unknown-env", [])


# ---------------------------------------------------------------------------------------------------- RLM env and REPL

RLM_HELPERS = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched")


def echo_lm(prompts: list[str]) -> list[str]:
    return [f"response:{prompt}" for prompt in prompts]


def test_rlm_repl_scaffold_is_restored_to_the_0_4_private_helpers() -> None:
    from skyrl_gym.envs.rlm.repl import PersistentREPL

    with PersistentREPL(lm_callback=echo_lm) as repl:
        repl.execute("llm_query = lambda p, m=None: 'hijacked'\nrlm_query = llm_query\nFINAL_VAR = SHOW_VARS = 0")
        assert repl.globals["llm_query"] == repl._llm_query
        assert repl.globals["llm_query_batched"] == repl._llm_query_batched
        assert repl.globals["rlm_query"] == repl._rlm_query
        assert repl.globals["rlm_query_batched"] == repl._rlm_query_batched
        assert repl.globals["FINAL_VAR"] == repl._final_var
        assert repl.globals["SHOW_VARS"] == repl._show_vars


def test_rlm_repl_helpers_accept_0_4_arguments() -> None:
    from skyrl_gym.envs.rlm.repl import PersistentREPL

    seen: list[tuple[str, Any]] = []

    def subcall(prompt: str, context: Any = None) -> str:
        seen.append((prompt, context))
        return f"child:{prompt}"

    # 0.4 model code may name a model (0.4 ignores it too) and passes batched contexts as ``context_list``.
    code = (
        "print(llm_query('a', 'some-model'), llm_query_batched(['b'], model='some-model'))\n"
        "print(rlm_query('c', model='m', context='x'),"
        " rlm_query_batched(['d', 'e'], model='m', context_list=['y', 'z']))"
    )
    with PersistentREPL(lm_callback=echo_lm, subcall_fn=subcall) as repl:
        assert repl.execute(code).stdout == "response:a ['response:b']\nchild:c ['child:d', 'child:e']\n"
    assert sorted(seen) == [("c", "x"), ("d", "y"), ("e", "z")]


def test_rlm_env_system_prompt_names_every_helper_when_an_lm_callback_is_given() -> None:
    from skyrl_gym.envs.rlm.env import BaseRLMEnv

    class TaskRLMEnv(BaseRLMEnv):
        pass

    register(id="task_rlm", entry_point=TaskRLMEnv)
    rlm_extras = {"max_turns": 5, "extra_info": {"context_text": "The capital of France is Paris."}}
    for callback, expected in ((None, False), (echo_lm, True)):
        env = skyrl_gym.make("task_rlm", extras=extras("Paris", **rlm_extras, lm_callback=callback))
        messages, _ = env.init([{"role": "user", "content": "What is the capital of France?"}])
        system = next(m["content"] for m in messages if m["role"] == "system")
        assert [name in system for name in RLM_HELPERS] == [expected] * 4
        env.close()
