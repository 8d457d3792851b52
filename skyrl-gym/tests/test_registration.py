import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import skyrl_gym
from skyrl_gym import error
from skyrl_gym.envs import BUILTIN_ENVS, BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import (
    EnvSpec,
    deregister,
    load_env_creator,
    make,
    pprint_registry,
    register,
    registry,
    spec,
)


class KwargsEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.env_config = env_config
        self.extras = extras if extras is not None else {}
        # Mutating what we were given must never leak back into the registry's defaults.
        self.extras.setdefault("seen", []).append("me")

    def step(self, action: str) -> BaseTextEnvStepOutput:
        return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}


class NotAnEnv:
    def __init__(self, **kwargs: Any) -> None:
        pass


class Outer:
    class Inner(KwargsEnv):
        pass


@pytest.fixture(autouse=True)
def _restore_registry() -> Iterator[None]:
    saved = dict(registry)
    yield
    registry.clear()
    registry.update(saved)


@pytest.fixture
def env_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real module on sys.path defining an env, so string entry points can be tested end to end."""
    name = "sg_test_lazy_env_module"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from skyrl_gym.envs.base_text_env import BaseTextEnv

            class LazyEnv(BaseTextEnv):
                def __init__(self, env_config=None, extras=None):
                    super().__init__()
                    self.extras = extras or {}

                def step(self, action):
                    return {"observations": [], "reward": 1.0, "done": True, "metadata": {}}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_register_and_make_with_a_class() -> None:
    register(id="kw", entry_point=KwargsEnv)
    env = make("kw", extras={"a": 1})
    assert isinstance(env, KwargsEnv)
    assert env.extras["a"] == 1
    assert "kw" in registry


def test_string_entry_point_is_imported_lazily(env_module: str) -> None:
    register(id="lazy", entry_point=f"{env_module}:LazyEnv")
    assert env_module not in sys.modules
    env = make("lazy")
    assert env_module in sys.modules
    assert type(env).__name__ == "LazyEnv"
    assert env.step("x")["reward"] == 1.0


def test_make_sets_env_spec_with_merged_kwargs() -> None:
    register(id="kw", entry_point=KwargsEnv, kwargs={"env_config": {"x": 1}})
    env = make("kw", extras={"b": 2})
    assert env.spec is not None
    assert env.spec.id == "kw"
    assert env.spec.entry_point is KwargsEnv
    assert env.spec.kwargs["env_config"] == {"x": 1}
    assert env.spec.kwargs["extras"]["b"] == 2


def test_registered_kwargs_are_deep_copied_per_make() -> None:
    register(id="kw", entry_point=KwargsEnv, kwargs={"extras": {"seen": []}})
    first = make("kw")
    second = make("kw")
    assert first.extras["seen"] == ["me"]
    assert second.extras["seen"] == ["me"]
    assert registry["kw"].kwargs == {"extras": {"seen": []}}


def test_call_kwargs_override_registered_kwargs() -> None:
    register(id="kw", entry_point=KwargsEnv, kwargs={"env_config": "registered", "extras": {}})
    env = make("kw", env_config="call")
    assert env.env_config == "call"


def test_register_copies_the_kwargs_dict() -> None:
    defaults: dict[str, Any] = {"env_config": 1}
    register(id="kw", entry_point=KwargsEnv, kwargs=defaults)
    defaults["env_config"] = 2
    assert registry["kw"].kwargs == {"env_config": 1}


def test_make_accepts_an_env_spec() -> None:
    env = make(EnvSpec(id="unregistered-spec", entry_point=KwargsEnv))
    assert isinstance(env, KwargsEnv)
    assert env.spec is not None
    assert env.spec.id == "unregistered-spec"
    assert "unregistered-spec" not in registry


def test_env_spec_make_uses_the_spec() -> None:
    register(id="kw", entry_point=KwargsEnv)
    env = spec("kw").make(extras={"z": 0})
    assert env.extras["z"] == 0


def test_duplicate_registration_raises_registration_error() -> None:
    register(id="kw", entry_point=KwargsEnv)
    with pytest.raises(error.RegistrationError, match="already registered"):
        register(id="kw", entry_point=KwargsEnv)
    assert registry["kw"].entry_point is KwargsEnv


def test_builtin_ids_cannot_be_silently_replaced() -> None:
    with pytest.raises(error.RegistrationError):
        register(id="gsm8k", entry_point=KwargsEnv)


def test_missing_entry_point_is_rejected() -> None:
    with pytest.raises(error.InvalidEntryPointError) as info:
        register(id="nothing")
    assert isinstance(info.value, AssertionError)
    assert "nothing" not in registry


@pytest.mark.parametrize("entry_point", ["no_colon_here", ":Attr", "module:", 42])
def test_malformed_entry_points_are_rejected(entry_point: Any) -> None:
    with pytest.raises(error.InvalidEntryPointError):
        register(id="bad", entry_point=entry_point)
    assert "bad" not in registry


def test_deregister_removes_the_id() -> None:
    register(id="kw", entry_point=KwargsEnv)
    deregister("kw")
    assert "kw" not in registry
    register(id="kw", entry_point=KwargsEnv)  # the id is free again


def test_deregister_unknown_id_raises_error() -> None:
    with pytest.raises(error.Error, match="No registered env with id: never-registered"):
        deregister("never-registered")


def test_unknown_id_message_lists_ids_and_suggests_a_close_match() -> None:
    with pytest.raises(error.Error) as info:
        make("gsm8")
    message = str(info.value)
    assert message.startswith("No registered env with id: gsm8")
    assert "Did you mean 'gsm8k'?" in message
    for env_id in BUILTIN_ENVS:
        assert env_id in message
    assert isinstance(info.value, error.UnregisteredEnvError)


def test_unknown_id_without_close_match_has_no_suggestion() -> None:
    with pytest.raises(error.UnregisteredEnvError) as info:
        spec("zzzzzzzzzzzz")
    assert "Did you mean" not in str(info.value)


def test_type_error_from_the_constructor_names_the_env_id() -> None:
    register(id="kw", entry_point=KwargsEnv)
    with pytest.raises(TypeError, match=r"'kw'") as info:
        make("kw", unexpected_argument=1)
    assert "unexpected_argument" in str(info.value)
    assert isinstance(info.value.__cause__, TypeError)


def test_entry_point_returning_a_non_env_is_rejected() -> None:
    register(id="not-env", entry_point=NotAnEnv)
    with pytest.raises(error.InvalidEnvError, match="not-env") as info:
        make("not-env")
    assert isinstance(info.value, AssertionError)


def test_factory_function_entry_point() -> None:
    def factory(**kwargs: Any) -> KwargsEnv:
        return KwargsEnv(extras={"from_factory": True, **kwargs})

    register(id="factory", entry_point=factory)
    env = make("factory", extra_arg=3)
    assert isinstance(env, KwargsEnv)
    assert env.extras["extra_arg"] == 3


def test_spec_returns_the_registered_spec() -> None:
    register(id="kw", entry_point=KwargsEnv, kwargs={"env_config": 1})
    found = spec("kw")
    assert found is registry["kw"]
    assert found.name == "kw"
    assert found.kwargs == {"env_config": 1}


def test_env_spec_json_round_trip() -> None:
    original = EnvSpec(id="x", entry_point="pkg.mod:Cls", kwargs={"extras": {"a": [1, 2]}})
    data = json.loads(original.to_json())
    assert data == {"id": "x", "entry_point": "pkg.mod:Cls", "kwargs": {"extras": {"a": [1, 2]}}}
    assert EnvSpec.from_json(original.to_json()) == original


def test_env_spec_from_json_ignores_name() -> None:
    restored = EnvSpec.from_json('{"id": "y", "entry_point": "a:B", "kwargs": {}, "name": "y"}')
    assert restored.name == "y"


def test_env_spec_to_json_rejects_callables_and_unserialisable_kwargs() -> None:
    with pytest.raises(ValueError, match="callable"):
        EnvSpec(id="x", entry_point=KwargsEnv).to_json()
    with pytest.raises(ValueError, match="kwargs"):
        EnvSpec(id="x", entry_point="a:B", kwargs={"obj": object()}).to_json()


def test_env_spec_pprint(capsys: pytest.CaptureFixture[str]) -> None:
    env_spec = EnvSpec(id="x", entry_point="a:B", kwargs={"k": 1})
    assert env_spec.pprint(disable_print=True) == "id=x\nkwargs={'k': 1}"
    assert env_spec.pprint(disable_print=True, include_entry_points=True) == "id=x\nentry_point=a:B\nkwargs={'k': 1}"
    assert env_spec.pprint() is None
    assert capsys.readouterr().out == "id=x\nkwargs={'k': 1}\n"


def test_pprint_registry_grid(capsys: pytest.CaptureFixture[str]) -> None:
    specs = {name: EnvSpec(id=name, entry_point="a:B") for name in ["c", "a", "bb", "d"]}
    text = pprint_registry(specs, num_cols=2, disable_print=True)
    assert text == "a   bb\nc   d"
    assert pprint_registry(specs, num_cols=3, disable_print=True) == "a   bb  c\nd"
    assert pprint_registry({}, disable_print=True) == "(no registered envs)"
    assert pprint_registry(specs, num_cols=2) is None
    assert capsys.readouterr().out == "a   bb\nc   d\n"


def test_pprint_registry_defaults_to_the_global_registry() -> None:
    text = pprint_registry(disable_print=True)
    assert text is not None
    for env_id in BUILTIN_ENVS:
        assert env_id in text


def test_load_env_creator_supports_dotted_attributes() -> None:
    assert load_env_creator(f"{__name__}:Outer.Inner") is Outer.Inner


def test_load_env_creator_errors_name_the_entry_point() -> None:
    with pytest.raises(ModuleNotFoundError) as info:
        load_env_creator("sg_no_such_module_anywhere:Env")
    assert any("sg_no_such_module_anywhere:Env" in note for note in info.value.__notes__)
    with pytest.raises(AttributeError, match="NoSuchAttr"):
        load_env_creator(f"{__name__}:NoSuchAttr")


def test_builtin_envs_are_registered_with_exact_entry_points() -> None:
    for env_id, entry_point in BUILTIN_ENVS.items():
        assert registry[env_id].entry_point == entry_point


def test_top_level_exports_are_the_registry_functions() -> None:
    assert skyrl_gym.make is make
    assert skyrl_gym.register is register
    assert skyrl_gym.deregister is deregister
    assert skyrl_gym.spec is spec
    assert skyrl_gym.registry is registry
    assert skyrl_gym.pprint_registry is pprint_registry


def test_importing_skyrl_gym_is_lazy_and_side_effect_free() -> None:
    code = textwrap.dedent(
        """
        import sys
        import skyrl_gym
        loaded = sorted(m for m in sys.modules if m.startswith("skyrl_gym.envs.") and m != "skyrl_gym.envs.registration"
                        and m != "skyrl_gym.envs.base_text_env")
        heavy = [m for m in ("gymnasium", "numpy", "omegaconf", "requests", "pandas") if m in sys.modules]
        print(len(skyrl_gym.registry), loaded, heavy)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "7 [] []"


def test_reimporting_envs_does_not_raise() -> None:
    import importlib

    import skyrl_gym.envs

    importlib.reload(skyrl_gym.envs)
    assert set(BUILTIN_ENVS) <= set(registry)
