import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from skyrl_gym.envs import BaseTextEnv, BaseTextEnvStepOutput, ConversationType, EpisodeSample
from skyrl_gym.envs.registration import register, registry
from skyrl_gym.gymnasium_bridge import (
    DEFAULT_MAX_LENGTH,
    AnyText,
    SkyRLGymnasiumEnv,
    register_gymnasium_envs,
)

PROMPT: ConversationType = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say <answer>...</answer> when done."},
]


class CountdownEnv(BaseTextEnv):
    """Ends when the action contains '<answer>' or after `max_turns` turns (default 3)."""

    instances: ClassVar[list["CountdownEnv"]] = []

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.extras = extras or {}
        self.env_config = env_config
        self.max_turns = self.extras.get("max_turns", 3)
        self.closed = False
        CountdownEnv.instances.append(self)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        done = "<answer>" in action or self.turns >= self.max_turns
        observations = [] if done else [{"role": "user", "content": f"turn {self.turns}: {len(action)} chars"}]
        return {
            "observations": observations,
            "reward": 1.0 if "<answer>" in action else 0.0,
            "done": done,
            "metadata": {"turn": self.turns},
        }

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns}

    def close(self) -> None:
        self.closed = True


class NeverDoneEnv(CountdownEnv):
    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        return {"observations": [{"role": "user", "content": "again"}], "reward": 0.0, "done": False, "metadata": {}}


class RewritingEnv(CountdownEnv):
    def step(self, action: str) -> BaseTextEnvStepOutput:
        out = super().step(action)
        out["postprocessed_action"] = action.upper()
        return out


class SampledEnv(CountdownEnv):
    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        return EpisodeSample(prompt=[{"role": "user", "content": "sampled prompt"}], extras={"max_turns": 7})


@pytest.fixture(autouse=True)
def _restore_registries() -> Iterator[None]:
    saved = dict(registry)
    saved_gym = dict(gymnasium.registry)
    CountdownEnv.instances = []
    register(id="countdown", entry_point=CountdownEnv)
    register(id="never_done", entry_point=NeverDoneEnv)
    register(id="sampled", entry_point=SampledEnv)
    yield
    registry.clear()
    registry.update(saved)
    gymnasium.registry.clear()
    gymnasium.registry.update(saved_gym)


def test_any_text_contains_every_string() -> None:
    space = AnyText()
    for text in ["", "hello, world!", "line\nbreak\ttab", "答案 🙂", "<answer>42</answer>", "x" * 100_000]:
        assert text in space
    assert 42 not in space
    assert b"bytes" not in space
    assert None not in space


def test_gymnasium_default_text_space_rejects_real_text() -> None:
    # The reason AnyText exists: the stock Text space only holds alphanumeric strings.
    stock = gymnasium.spaces.Text(DEFAULT_MAX_LENGTH)
    assert "hello, world!" not in stock
    assert "hello, world!" in AnyText()


def test_any_text_length_bounds() -> None:
    space = AnyText(5, min_length=2)
    assert "ab" in space
    assert "abcde" in space
    assert "a" not in space
    assert "abcdef" not in space


def test_any_text_samples_are_short_members() -> None:
    space = AnyText(seed=0, sample_max_length=10)
    samples = [space.sample() for _ in range(50)]
    assert all(sample in space and len(sample) <= 10 for sample in samples)
    assert len(set(samples)) > 1
    assert len(space.sample(mask=(3, None))) == 3


def test_any_text_sampling_is_seeded() -> None:
    assert AnyText(seed=3).sample() == AnyText(seed=3).sample()


def test_any_text_equality_and_repr() -> None:
    assert AnyText(10) == AnyText(10)
    assert AnyText(10) != AnyText(11)
    assert AnyText(10) != gymnasium.spaces.Text(10)
    assert repr(AnyText(10)) == "AnyText(0, 10)"


def test_reset_returns_rendered_prompt_and_messages() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT)
    obs, info = env.reset(seed=0)
    assert obs == "Be brief.\n\nSay <answer>...</answer> when done."
    assert obs in env.observation_space
    assert info["messages"] == PROMPT
    assert info["conversation"] == PROMPT
    assert info["init_info"] == {}
    assert info["turns"] == 0


def test_step_returns_five_tuple() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT)
    env.reset()
    obs, reward, terminated, truncated, info = env.step("thinking")
    assert obs == "turn 1: 8 chars"
    assert reward == 0.0
    assert type(reward) is float
    assert (terminated, truncated) == (False, False)
    assert info["messages"] == [{"role": "user", "content": "turn 1: 8 chars"}]
    assert info["metadata"] == {"turn": 1}
    assert info["turns"] == 1
    assert info["conversation"][-2:] == [
        {"role": "assistant", "content": "thinking"},
        {"role": "user", "content": "turn 1: 8 chars"},
    ]
    assert "metrics" not in info


def test_env_done_means_terminated() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT)
    env.reset()
    obs, reward, terminated, truncated, info = env.step("<answer>4</answer>")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["messages"] == []
    assert info["metrics"] == {"turns": 1}
    assert CountdownEnv.instances[-1].closed


def test_env_ending_at_its_own_turn_budget_is_terminated_not_truncated() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT, extras={"max_turns": 2}, max_turns=2)
    env.reset()
    assert env.step("a")[2:4] == (False, False)
    assert env.step("b")[2:4] == (True, False)


def test_bridge_turn_limit_truncates() -> None:
    env = SkyRLGymnasiumEnv("never_done", prompt=PROMPT, max_turns=3)
    env.reset()
    assert env.step("a")[2:4] == (False, False)
    assert env.step("b")[2:4] == (False, False)
    obs, _, terminated, truncated, info = env.step("c")
    assert (terminated, truncated) == (False, True)
    assert obs == "again"
    assert info["metrics"] == {"turns": 3}
    assert CountdownEnv.instances[-1].closed


def test_no_truncation_without_max_turns() -> None:
    env = SkyRLGymnasiumEnv("never_done", prompt=PROMPT)
    env.reset()
    for _ in range(20):
        assert env.step("x")[2:4] == (False, False)


def test_step_after_episode_end_requires_reset() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT)
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step("before reset")
    env.reset()
    env.step("<answer>")
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step("again")
    env.reset()
    assert env.step("fresh")[3] is False


def test_each_reset_builds_a_fresh_env_and_closes_the_old_one() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT)
    env.reset()
    first = env.skyrl_env
    env.step("x")
    env.reset()
    assert env.skyrl_env is not first
    assert first is not None
    assert first.closed  # type: ignore[attr-defined]
    assert env.turns == 0
    env.close()
    env.close()
    assert env.skyrl_env is None
    assert CountdownEnv.instances[-1].closed


def test_reset_options_override_constructor_arguments() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT, extras={"max_turns": 5}, env_config={"a": 1})
    obs, info = env.reset(options={"prompt": "plain string", "extras": {"max_turns": 1}, "env_config": {"a": 2}})
    assert obs == "plain string"
    assert info["messages"] == [{"role": "user", "content": "plain string"}]
    inner = CountdownEnv.instances[-1]
    assert inner.max_turns == 1
    assert inner.env_config == {"a": 2}
    env.reset()
    assert CountdownEnv.instances[-1].max_turns == 5


def test_unknown_reset_options_are_rejected() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT)
    with pytest.raises(ValueError, match="promt"):
        env.reset(options={"promt": "typo"})


def test_extras_are_copied_for_each_episode() -> None:
    extras: dict[str, Any] = {"max_turns": 2}
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT, extras=extras)
    env.reset()
    CountdownEnv.instances[-1].extras["max_turns"] = 99
    assert extras == {"max_turns": 2}


def test_missing_prompt_without_sample_hook() -> None:
    env = SkyRLGymnasiumEnv("countdown")
    with pytest.raises(ValueError, match="sample_episode"):
        env.reset()


def test_sample_hook_supplies_prompt_and_extras() -> None:
    env = SkyRLGymnasiumEnv("sampled")
    obs, _ = env.reset()
    assert obs == "sampled prompt"
    assert CountdownEnv.instances[-1].max_turns == 7


def test_postprocessed_action_goes_into_the_conversation() -> None:
    register(id="rewriting", entry_point=RewritingEnv)
    env = SkyRLGymnasiumEnv("rewriting", prompt=PROMPT)
    env.reset()
    _, _, _, _, info = env.step("quiet")
    assert info["conversation"][2] == {"role": "assistant", "content": "QUIET"}


def test_non_string_action_is_rejected() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT)
    env.reset()
    with pytest.raises(TypeError, match="str"):
        env.step(42)  # type: ignore[arg-type]


def test_render_ansi() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT, render_mode="ansi")
    env.reset()
    env.step("hi")
    assert env.render() == (
        "system: Be brief.\n\nuser: Say <answer>...</answer> when done.\n\nassistant: hi\n\nuser: turn 1: 2 chars"
    )
    assert SkyRLGymnasiumEnv("countdown", prompt=PROMPT).render() is None
    with pytest.raises(ValueError, match="render_mode"):
        SkyRLGymnasiumEnv("countdown", render_mode="human")


def test_invalid_max_turns() -> None:
    with pytest.raises(ValueError, match="max_turns"):
        SkyRLGymnasiumEnv("countdown", max_turns=0)


def test_unknown_env_id_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="No registered env with id: nope"):
        SkyRLGymnasiumEnv("nope")


def test_gymnasium_env_checker_passes_on_the_bridge() -> None:
    env = SkyRLGymnasiumEnv("countdown", prompt=PROMPT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker reports problems as warnings too
        # Expected for an env built without gymnasium.make; the registry path is tested below.
        warnings.filterwarnings("ignore", message=".*not having a spec")
        gymnasium_check_env(env)


def test_register_gymnasium_envs_uses_the_skyrl_namespace() -> None:
    ids = register_gymnasium_envs()
    assert "skyrl/countdown" in ids
    assert "skyrl/gsm8k" in ids
    assert len(ids) == len(registry)
    registered = gymnasium.spec("skyrl/countdown")
    assert registered.namespace == "skyrl"
    assert registered.kwargs == {"env_id": "countdown"}


def test_register_gymnasium_envs_is_idempotent_and_silent() -> None:
    first = register_gymnasium_envs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert register_gymnasium_envs() == first


def test_register_gymnasium_envs_subset_and_invalid_ids() -> None:
    register(id="has space", entry_point=CountdownEnv)
    assert register_gymnasium_envs(namespace="mine", env_ids=["countdown", "has space"]) == ["mine/countdown"]
    assert "mine/countdown" in gymnasium.registry
    assert "mine/has space" not in gymnasium.registry


def test_gymnasium_make_and_checker_through_the_registry() -> None:
    register_gymnasium_envs()
    env = gymnasium.make("skyrl/countdown", prompt=PROMPT)
    assert isinstance(env.unwrapped, SkyRLGymnasiumEnv)
    obs, _ = env.reset(seed=1)
    assert obs.startswith("Be brief.")
    _, reward, terminated, truncated, _ = env.step("<answer>yes</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gymnasium_check_env(env.unwrapped)


def test_gymnasium_make_with_module_prefix() -> None:
    # "module:id" imports the bridge first, which registers the envs; needs a process where it is not imported yet.
    code = textwrap.dedent(
        """
        import sys, gymnasium, skyrl_gym
        assert "skyrl_gym.gymnasium_bridge" not in sys.modules and "skyrl/gsm8k" not in gymnasium.registry
        env = gymnasium.make("skyrl_gym.gymnasium_bridge:skyrl/gsm8k", prompt="hello")
        print(type(env.unwrapped).__name__, env.unwrapped.env_spec.id)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "SkyRLGymnasiumEnv gsm8k"


def test_gymnasium_time_limit_also_truncates() -> None:
    register_gymnasium_envs()
    env = gymnasium.make("skyrl/never_done", prompt="p", max_episode_steps=2)
    env.reset()
    assert env.step("a")[3] is False
    assert env.step("b")[3] is True
