"""Any registered skyrl-gym text env as a standard ``gymnasium.Env``.

::

    import gymnasium
    import skyrl_gym.gymnasium_bridge  # registers every skyrl-gym env as "skyrl/<id>"

    env = gymnasium.make("skyrl/gsm8k", prompt="What is 2 + 2?", extras={"reward_spec": {"ground_truth": "4"}})
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("2 + 2 = 4. #### 4")

or, without importing first: ``gymnasium.make("skyrl_gym.gymnasium_bridge:skyrl/gsm8k", ...)``.

Mapping of the two APIs:

* ``reset(seed, options)`` builds a **fresh** skyrl-gym env (they are one-episode objects) with ``skyrl_gym.make``
  and calls its ``init(prompt)``. The prompt, ``extras`` and ``env_config`` come from ``options`` (keys
  ``"prompt"``, ``"extras"``, ``"env_config"``), else from the constructor, else from the env class's
  ``sample_episode()`` hook. A ``str`` prompt means one user message.
* Observations are strings: the contents of the messages the call produced, joined by a blank line (``""`` on the
  final step, whose message list is empty). ``info["messages"]`` holds those messages with their roles,
  ``info["conversation"]`` the whole conversation so far (prompt, assistant actions, env messages).
* ``step(action)`` returns ``(obs, reward, terminated, truncated, info)``:

  - ``terminated`` is the env's own ``done``. An env that stops itself at its own turn budget (as the built-in
    multi-turn envs do, computing the final reward) is *terminated*: the episode reached a real end.
  - ``truncated`` is ``not terminated and turns >= max_turns``, where ``turns`` counts the bridge's steps in this
    episode and ``max_turns`` is the bridge's constructor argument (``None``, the default: never truncate).
    It cuts off an episode the env has not ended; Gymnasium's ``max_episode_steps`` (the ``TimeLimit``
    wrapper) is an equivalent alternative.
  - ``info`` also has ``metadata`` (the step's metadata) and ``turns``; on the last step, ``metrics``
    (``env.get_metrics()``). The skyrl-gym env is closed when the episode ends.

* Spaces: :class:`AnyText`. Gymnasium's ``Text`` space only contains strings over its ``charset``, which defaults
  to ASCII letters and digits, so every real prompt or model output (spaces, punctuation, newlines, non-ASCII)
  would fall outside it. ``AnyText`` contains every ``str`` up to ``max_length`` characters and samples
  printable ASCII.

Registration in Gymnasium's registry is not done by ``import skyrl_gym``: importing gymnasium costs about a tenth
of a second and the core package must stay cheap and free of side effects on other libraries' state. Importing
this module registers every skyrl-gym id known at that moment; call :func:`register_gymnasium_envs` again after
registering more skyrl-gym envs (it is idempotent).
"""

from __future__ import annotations

import copy
import string
from collections.abc import Iterable, Mapping
from typing import Any, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces
from numpy.typing import NDArray

from skyrl_gym.core import Env
from skyrl_gym.envs.base_text_env import ConversationType, EpisodeSample, MessageType
from skyrl_gym.envs.registration import EnvSpec, load_env_creator, make, registry
from skyrl_gym.envs.registration import spec as lookup_spec

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "GYMNASIUM_NAMESPACE",
    "AnyText",
    "SkyRLGymnasiumEnv",
    "register_gymnasium_envs",
]

DEFAULT_MAX_LENGTH = 2**24
"""Longest string (in characters) the bridge's spaces contain: 16 Mi characters."""

GYMNASIUM_NAMESPACE = "skyrl"
"""Gymnasium namespace of the bridged envs: skyrl-gym id ``gsm8k`` becomes ``skyrl/gsm8k``."""

_ENTRY_POINT = "skyrl_gym.gymnasium_bridge:SkyRLGymnasiumEnv"
_OPTION_KEYS = frozenset({"prompt", "extras", "env_config"})


class AnyText(spaces.Text):
    """A ``gymnasium.spaces.Text`` that contains every ``str`` of ``min_length`` to ``max_length`` characters.

    ``charset`` only shapes :meth:`sample`; membership ignores it. Samples without an explicit length are at most
    ``sample_max_length`` characters long, so sampling stays cheap although ``max_length`` is huge.
    """

    def __init__(
        self,
        max_length: int = DEFAULT_MAX_LENGTH,
        *,
        min_length: int = 0,
        charset: frozenset[str] | str = string.printable,
        sample_max_length: int = 64,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=charset, seed=seed)
        self.sample_max_length = sample_max_length

    def contains(self, x: Any) -> bool:
        """True for every ``str`` whose length is within the bounds, whatever its characters."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(
        self,
        mask: tuple[int | None, NDArray[np.int8] | None] | None = None,
        probability: tuple[int | None, NDArray[np.float64] | None] | None = None,
    ) -> str:
        """A random string of ``charset`` characters; see ``gymnasium.spaces.Text.sample`` for the arguments."""
        if mask is None and probability is None:
            upper = min(self.max_length, max(self.min_length, self.sample_max_length))
            length = int(self.np_random.integers(self.min_length, upper + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object, /) -> bool:
        return (
            isinstance(other, AnyText) and self.min_length == other.min_length and self.max_length == other.max_length
        )


def _as_conversation(prompt: ConversationType | str) -> ConversationType:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return copy.deepcopy(list(prompt))


def _render(messages: Iterable[MessageType]) -> str:
    return "\n\n".join(str(message.get("content", "")) for message in messages)


class SkyRLGymnasiumEnv(gymnasium.Env[str, str]):
    """A skyrl-gym text env behind the Gymnasium API (see the module docstring for the exact mapping).

    Args:
        env_id: The skyrl-gym id (or spec) to ``make`` at every reset.
        prompt: The default prompt (chat messages, or a ``str`` for one user message).
        extras: The default ``extras`` for the env constructor (not passed when ``None``).
        env_config: The ``env_config`` for the env constructor (not passed when ``None``).
        max_turns: Truncate an episode the env has not ended after this many steps; ``None``: never.
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the conversation as text).
        make_kwargs: Further keyword arguments for ``skyrl_gym.make``.
        max_length: ``max_length`` of the observation and action spaces.
    """

    # Text has no frame rate; render_fps is only declared because Gymnasium's checker asks for it.
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012 -- Gymnasium's API

    def __init__(
        self,
        env_id: str | EnvSpec,
        prompt: ConversationType | str | None = None,
        extras: Mapping[str, Any] | None = None,
        env_config: Any = None,
        *,
        max_turns: int | None = None,
        render_mode: str | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
        max_length: int = DEFAULT_MAX_LENGTH,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}; got {render_mode!r}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be at least 1 or None; got {max_turns}")
        self.env_spec = lookup_spec(env_id) if isinstance(env_id, str) else env_id
        self.prompt = prompt
        self.extras = extras
        self.env_config = env_config
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.make_kwargs = dict(make_kwargs or {})
        self.observation_space = AnyText(max_length)
        self.action_space = AnyText(max_length)
        self.turns = 0
        self.conversation: ConversationType = []
        self._env: Env[Any, Any] | None = None
        self._episode_over = True

    @property
    def skyrl_env(self) -> Env[Any, Any] | None:
        """The skyrl-gym env of the running episode (``None`` before the first reset and after the episode)."""
        return self._env

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a new episode on a fresh skyrl-gym env; ``options`` may set ``prompt``, ``extras``, ``env_config``."""
        super().reset(seed=seed)
        self._close_env()
        prompt, make_kwargs = self._episode_arguments(options or {})
        env = make(self.env_spec, **make_kwargs)
        self._env = env
        observations, init_info = env.init(prompt)
        self.turns = 0
        self._episode_over = False
        self.conversation = copy.deepcopy(list(observations))
        info = {
            "messages": copy.deepcopy(list(observations)),
            "conversation": copy.deepcopy(self.conversation),
            "init_info": copy.deepcopy(init_info),
            "turns": 0,
        }
        return _render(observations), info

    def _episode_arguments(self, options: Mapping[str, Any]) -> tuple[ConversationType, dict[str, Any]]:
        unknown = set(options) - _OPTION_KEYS
        if unknown:
            raise ValueError(f"Unknown reset options {sorted(unknown)}; supported: {sorted(_OPTION_KEYS)}")
        prompt = options.get("prompt", self.prompt)
        extras = options.get("extras", self.extras)
        env_config = options.get("env_config", self.env_config)
        if prompt is None:
            sample = self._sample_episode()
            prompt = sample.prompt
            extras = sample.extras if extras is None else extras
            env_config = sample.env_config if env_config is None else env_config
        make_kwargs = dict(self.make_kwargs)
        if extras is not None:
            make_kwargs["extras"] = copy.deepcopy(dict(extras))
        if env_config is not None:
            make_kwargs["env_config"] = env_config
        return _as_conversation(prompt), make_kwargs

    def _sample_episode(self) -> EpisodeSample:
        entry_point = self.env_spec.entry_point
        creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
        hook = getattr(creator, "sample_episode", None)
        sample = hook() if hook is not None else None
        if not isinstance(sample, EpisodeSample):
            raise ValueError(
                f"No prompt for env {self.env_spec.id!r}: pass prompt= to the constructor (or gymnasium.make), "
                "options={'prompt': ...} to reset(), or define a sample_episode() classmethod on the env."
            )
        return sample

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Send ``action`` to the env; see the module docstring for ``terminated`` versus ``truncated``."""
        env = self._env
        if env is None or self._episode_over:
            raise gymnasium.error.ResetNeeded("The episode is over (or never started): call reset() first.")
        if not isinstance(action, str):
            raise TypeError(f"Actions are str; got {type(action).__name__}")
        out = env.step(action)
        self.turns += 1
        terminated = bool(out["done"])
        truncated = not terminated and self.max_turns is not None and self.turns >= self.max_turns
        messages = copy.deepcopy(list(out["observations"]))
        # A (deprecated) postprocessed action replaces the model's text in the conversation, as in training.
        postprocessed = out.get("postprocessed_action")
        assistant_text = postprocessed if isinstance(postprocessed, str) else action
        self.conversation.append({"role": "assistant", "content": assistant_text})
        self.conversation.extend(copy.deepcopy(messages))
        info: dict[str, Any] = {
            "messages": messages,
            "conversation": copy.deepcopy(self.conversation),
            "metadata": copy.deepcopy(out["metadata"]),
            "turns": self.turns,
        }
        if terminated or truncated:
            get_metrics = getattr(env, "get_metrics", None)
            info["metrics"] = copy.deepcopy(get_metrics()) if get_metrics is not None else {}
            self._episode_over = True
            self._close_env()
        return _render(messages), float(out["reward"]), terminated, truncated, info

    def render(self) -> str | None:
        """With ``render_mode="ansi"``, the conversation so far as ``role: content`` blocks; else ``None``."""
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"{message['role']}: {message['content']}" for message in self.conversation)

    def _close_env(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            env.close()

    def close(self) -> None:
        """Close the running skyrl-gym env, if any. Idempotent."""
        self._episode_over = True
        self._close_env()


def register_gymnasium_envs(namespace: str = GYMNASIUM_NAMESPACE, env_ids: Iterable[str] | None = None) -> list[str]:
    """Register skyrl-gym envs in Gymnasium's registry as ``"<namespace>/<id>"``.

    Idempotent: ids already registered to the bridge with the same arguments are left alone. Ids Gymnasium
    cannot express (e.g. containing ``/`` or spaces) are skipped.

    Args:
        namespace: The Gymnasium namespace.
        env_ids: The skyrl-gym ids to register; default: all currently registered.

    Returns:
        The Gymnasium ids that now point at the bridge, sorted.
    """
    registered = []
    for env_id in sorted(registry if env_ids is None else env_ids):
        gym_id = f"{namespace}/{env_id}"
        kwargs = {"env_id": env_id}
        existing = gymnasium.registry.get(gym_id)
        if existing is None or existing.entry_point != _ENTRY_POINT or existing.kwargs != kwargs:
            try:
                gymnasium.register(id=gym_id, entry_point=_ENTRY_POINT, kwargs=kwargs)
            except gymnasium.error.Error:
                continue  # not a valid Gymnasium id
        registered.append(gym_id)
    return registered


register_gymnasium_envs()
