import pickle
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

from skyrl_gym import error
from skyrl_gym.checker import DEFAULT_PROMPT, FILLER_ACTION, check_env, hostile_actions
from skyrl_gym.envs import BaseTextEnv, BaseTextEnvStepOutput, ConversationType, EpisodeSample
from skyrl_gym.envs.registration import EnvSpec, register, registry

ALL_HOSTILE = [f"hostile_action[{name}]" for name in hostile_actions()]


class GoodEnv(BaseTextEnv):
    """Answers until '<answer>' appears or the turn budget is used up."""

    actions_seen: ClassVar[list[str]] = []

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.max_turns = extras.get("max_turns", 3)
        self.closed = 0

    def step(self, action: str) -> BaseTextEnvStepOutput:
        type(self).actions_seen.append(action)
        self.turns += 1
        done = self.turns >= self.max_turns or "<answer>" in action
        observations = [] if done else [{"role": "user", "content": "go on"}]
        return {"observations": observations, "reward": 1.0 if done else 0.0, "done": done, "metadata": {}}

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns}

    def close(self) -> None:
        self.closed += 1


class NeedsExtrasEnv(GoodEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__(env_config, extras)
        assert extras is not None, "reward_spec field is required"
        self.ground_truth = extras["reward_spec"]["ground_truth"]


class SampledEnv(NeedsExtrasEnv):
    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        return EpisodeSample(
            prompt=[{"role": "user", "content": "2+2?"}],
            extras={"reward_spec": {"ground_truth": "4"}, "max_turns": 5},
            actions=("thinking", "<answer>4</answer>"),
        )


def broken(**overrides: Any) -> type[GoodEnv]:
    """A GoodEnv whose step output has some keys replaced (None value: key removed)."""

    class Broken(GoodEnv):
        def step(self, action: str) -> BaseTextEnvStepOutput:
            out: dict[str, Any] = dict(super().step(action))
            for key, value in overrides.items():
                if value is None:
                    out.pop(key)
                else:
                    out[key] = value(out) if callable(value) else value
            return out  # type: ignore[return-value]

    return Broken


@pytest.fixture(autouse=True)
def _restore_state() -> Iterator[None]:
    saved = dict(registry)
    GoodEnv.actions_seen = []
    yield
    registry.clear()
    registry.update(saved)


def failed_check(env: Any, **kwargs: Any) -> str:
    with pytest.raises(error.EnvContractError) as info:
        check_env(env, **kwargs)
    return info.value.check


def test_good_env_passes_every_check() -> None:
    passed = check_env(GoodEnv)
    assert passed[:9] == [
        "construct",
        "init",
        "step",
        "final_observations",
        "terminates",
        "get_metrics",
        "aggregate_metrics",
        "close",
        "context_manager",
    ]
    assert passed[9:] == ALL_HOSTILE


def test_hostile_actions_are_actually_sent() -> None:
    check_env(GoodEnv)
    for action in hostile_actions().values():
        assert action in GoodEnv.actions_seen


def test_hostile_checks_can_be_turned_off() -> None:
    passed = check_env(GoodEnv, check_hostile_actions=False)
    assert not any(name.startswith("hostile_action") for name in passed)


def test_hostile_action_set() -> None:
    actions = hostile_actions()
    assert actions == hostile_actions()  # deterministic
    assert actions["empty"] == ""
    assert len(actions["huge_100kb"]) == 100_000
    assert actions["unbalanced_tags"].count("<answer>") != actions["unbalanced_tags"].count("</answer>")


def test_env_by_registered_id_and_by_spec() -> None:
    register(id="good", entry_point=GoodEnv)
    assert "context_manager" in check_env("good")
    assert "context_manager" in check_env(EnvSpec(id="good-spec", entry_point=GoodEnv))


def test_string_entry_point_class_hook_is_found() -> None:
    register(id="sampled", entry_point=f"{__name__}:SampledEnv")
    assert "terminates" in check_env("sampled")


def test_env_instance_is_copied_not_used() -> None:
    env = GoodEnv(extras={"max_turns": 2})
    passed = check_env(env)
    assert "hostile_action[empty]" in passed
    assert env.turns == 0
    assert env.closed == 0


def test_instance_with_constructor_arguments_is_rejected() -> None:
    with pytest.raises(ValueError, match="constructor"):
        check_env(GoodEnv(), extras={"max_turns": 2})


def test_instance_that_cannot_be_copied_is_reported() -> None:
    env = GoodEnv()
    env.lock = threading.Lock()  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="deep-copy"):
        check_env(env)


def test_unsupported_target_type() -> None:
    with pytest.raises(TypeError, match="check_env expects"):
        check_env(42)  # type: ignore[arg-type]


def test_sample_episode_hook_supplies_prompt_extras_and_actions() -> None:
    check_env(SampledEnv, check_hostile_actions=False)
    # The main episode replays the sample's actions and ends on the answer.
    assert GoodEnv.actions_seen[:2] == ["thinking", "<answer>4</answer>"]


def test_explicit_arguments_override_the_hook() -> None:
    check_env(SampledEnv, actions=["<answer>5</answer>"], check_hostile_actions=False)
    assert GoodEnv.actions_seen[0] == "<answer>5</answer>"


def test_explicit_prompt_and_extras_without_hook() -> None:
    prompts: list[ConversationType] = []

    class Recording(NeedsExtrasEnv):
        def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
            prompts.append(prompt)
            return prompt, {}

    prompt: ConversationType = [{"role": "user", "content": "custom"}]
    check_env(Recording, prompt=prompt, extras={"reward_spec": {"ground_truth": "1"}}, check_hostile_actions=False)
    assert prompts[0] == prompt
    assert prompts[0] is not prompt  # the env gets a copy it may mutate


def test_filler_action_used_after_replayed_actions() -> None:
    check_env(GoodEnv, extras={"max_turns": 3}, actions=["first"], check_hostile_actions=False)
    assert GoodEnv.actions_seen[:3] == ["first", FILLER_ACTION, FILLER_ACTION]


def test_default_prompt_used_without_hook() -> None:
    seen: list[ConversationType] = []

    class Recording(GoodEnv):
        def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
            seen.append(prompt)
            return prompt, {}

    check_env(Recording, check_hostile_actions=False)
    assert seen[0] == DEFAULT_PROMPT


def test_construction_failure_hints_at_extras() -> None:
    with pytest.raises(error.EnvContractError, match="sample_episode") as info:
        check_env(NeedsExtrasEnv)
    assert info.value.check == "construct"


def test_factory_returning_non_env() -> None:
    assert failed_check(lambda **kwargs: object()) == "construct"


def test_sample_hook_returning_garbage() -> None:
    class BadHook(GoodEnv):
        @classmethod
        def sample_episode(cls) -> Any:
            return 123

    assert failed_check(BadHook) == "sample_episode"


def test_sample_hook_may_return_a_mapping() -> None:
    class MappingHook(NeedsExtrasEnv):
        @classmethod
        def sample_episode(cls) -> Any:
            return {"prompt": [{"role": "user", "content": "q"}], "extras": {"reward_spec": {"ground_truth": "1"}}}

    assert "terminates" in check_env(MappingHook, check_hostile_actions=False)


@pytest.mark.parametrize(
    ("init_result", "detail"),
    [
        ("just a string", "tuple"),
        (([{"role": "user", "content": "x"}],), "tuple"),
        (("not a list", {}), "list"),
        (([{"content": "no role"}], {}), "role"),
        (([{"role": "user", "content": 5}], {}), "content"),
        (([{"role": "user", "content": "x"}], None), "info"),
    ],
)
def test_bad_init_results(init_result: Any, detail: str) -> None:
    class BadInit(GoodEnv):
        def init(self, prompt: ConversationType) -> Any:
            return init_result

    with pytest.raises(error.EnvContractError, match=detail) as info:
        check_env(BadInit)
    assert info.value.check == "init"


@pytest.mark.parametrize(
    ("overrides", "detail"),
    [
        ({"reward": None}, "lacks keys"),
        ({"metadata": None}, "lacks keys"),
        ({"reward": float("nan")}, "finite"),
        ({"reward": float("inf")}, "finite"),
        ({"reward": True}, "bool"),
        ({"reward": "1.0"}, "real number"),
        ({"done": 1}, "done must be a bool"),
        ({"done": np.bool_(True)}, "done must be a bool"),
        ({"metadata": "x"}, "metadata must be a dict"),
        ({"observations": "text"}, "list of chat messages"),
        ({"observations": [["user", "x"]]}, "must be a dict"),
        ({"postprocessed_action": 3}, "postprocessed_action"),
    ],
)
def test_bad_step_outputs(overrides: dict[str, Any], detail: str) -> None:
    with pytest.raises(error.EnvContractError, match=detail) as info:
        check_env(broken(**overrides))
    assert info.value.check == "step"


def test_step_output_must_be_a_mapping() -> None:
    class ListStep(GoodEnv):
        def step(self, action: str) -> Any:
            return [[], 0.0, True, {}]

    assert failed_check(ListStep) == "step"


def test_acceptable_step_output_variants() -> None:
    # int and numpy rewards are real numbers; postprocessed_action may be a str or None.
    check_env(broken(reward=lambda out: int(out["reward"]), postprocessed_action="rewritten"))
    check_env(broken(reward=lambda out: np.float32(out["reward"])))
    check_env(broken(postprocessed_action=lambda out: None))


def test_final_observations_must_be_empty() -> None:
    class Chatty(GoodEnv):
        def step(self, action: str) -> BaseTextEnvStepOutput:
            out = super().step(action)
            out["observations"] = [{"role": "user", "content": "bye"}]
            return out

    assert failed_check(Chatty) == "final_observations"


def test_episode_must_terminate() -> None:
    class Endless(GoodEnv):
        def step(self, action: str) -> BaseTextEnvStepOutput:
            return {"observations": [{"role": "user", "content": "more"}], "reward": 0.0, "done": False, "metadata": {}}

    with pytest.raises(error.EnvContractError, match="not done after 5 steps") as info:
        check_env(Endless, max_steps=5)
    assert info.value.check == "terminates"


def test_get_metrics_must_return_a_dict() -> None:
    class BadMetrics(GoodEnv):
        def get_metrics(self) -> Any:
            return [1, 2]

    assert failed_check(BadMetrics) == "get_metrics"


def test_aggregate_metrics_must_handle_empty_lists() -> None:
    class BadAggregate(GoodEnv):
        @staticmethod
        def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
            return {"avg": sum(m["turns"] for m in metrics) / len(metrics)}

    with pytest.raises(error.EnvContractError, match="ZeroDivisionError") as info:
        check_env(BadAggregate)
    assert info.value.check == "aggregate_metrics"


def test_aggregate_metrics_must_return_a_dict() -> None:
    class NoneAggregate(GoodEnv):
        @staticmethod
        def aggregate_metrics(metrics: list[dict[str, Any]]) -> Any:
            return None

    assert failed_check(NoneAggregate) == "aggregate_metrics"


def test_close_must_be_idempotent() -> None:
    class CloseOnce(GoodEnv):
        def close(self) -> None:
            if getattr(self, "_closed", False):
                raise RuntimeError("already closed")
            self._closed = True

    with pytest.raises(error.EnvContractError, match="already closed") as info:
        check_env(CloseOnce)
    assert info.value.check == "close"


def test_exit_must_not_swallow_exceptions() -> None:
    class Swallow(GoodEnv):
        def __exit__(self, *args: Any) -> Any:
            self.close()
            return True

    with pytest.raises(error.EnvContractError, match="swallowed") as info:
        check_env(Swallow)
    assert info.value.check == "context_manager"


def test_exit_must_close() -> None:
    class NoClose(GoodEnv):
        def __exit__(self, *args: Any) -> Any:
            return False

    with pytest.raises(error.EnvContractError, match="did not call close") as info:
        check_env(NoClose)
    assert info.value.check == "context_manager"


def test_enter_must_return_the_env() -> None:
    class OtherEnter(GoodEnv):
        def __enter__(self) -> Any:
            return object()

    assert failed_check(OtherEnter) == "context_manager"


@pytest.mark.parametrize("name", sorted(hostile_actions()))
def test_env_crashing_on_a_hostile_action_is_named(name: str) -> None:
    poison = hostile_actions()[name]

    class Fragile(GoodEnv):
        def step(self, action: str) -> BaseTextEnvStepOutput:
            if action == poison:
                raise IndexError("cannot parse")
            return super().step(action)

    with pytest.raises(error.EnvContractError, match="IndexError: cannot parse") as info:
        check_env(Fragile)
    assert info.value.check == f"hostile_action[{name}]"
    assert isinstance(info.value.__cause__, IndexError)


def test_error_is_picklable_and_readable() -> None:
    err = error.EnvContractError("step", "reward must be finite")
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.check, clone.detail) == ("step", "reward must be finite")
    assert str(clone) == "check_env: check 'step' failed: reward must be finite"
