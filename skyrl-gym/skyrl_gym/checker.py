"""``check_env``: run the text-env contract against your own env.

::

    from skyrl_gym.checker import check_env

    check_env("my_env", prompt=[{"role": "user", "content": "2+2?"}],
              extras={"reward_spec": {"ground_truth": "4"}})

What is checked (each check has a name, reported in :class:`~skyrl_gym.error.EnvContractError`):

* ``construct``: the env can be built and is a :class:`skyrl_gym.Env`.
* ``init``: ``init(prompt)`` returns ``(observations, info)``: a list of chat messages and a dict.
* ``step``: every step returns a mapping with ``observations`` (list of messages), ``reward`` (finite real
  number, not a bool), ``done`` (a ``bool``) and ``metadata`` (a dict); ``postprocessed_action`` is a str or None
  if present.
* ``final_observations``: the step that returns ``done=True`` returns ``observations == []``.
* ``terminates``: the episode ends within ``max_steps`` steps.
* ``get_metrics`` / ``aggregate_metrics``: return dicts (``aggregate_metrics`` also for ``[]``).
* ``close``: ``close()`` can be called twice.
* ``context_manager``: ``with env as e`` gives ``e is env``, calls ``close`` on exit and lets exceptions through.
* ``hostile_action[<name>]``: a fresh episode's first step with malformed model output (empty, whitespace,
  random junk, 100 KB of text, unbalanced tags, control characters, exotic unicode) returns a valid output
  instead of raising. Model output is arbitrary text; an env must answer it, never crash on it.

The example episode. ``check_env`` needs a prompt, the constructor's ``extras``/``env_config`` and optionally
actions to replay. Explicit arguments win; otherwise they come from the env class's optional hook::

    class MyEnv(BaseTextEnv):
        @classmethod
        def sample_episode(cls) -> EpisodeSample:
            return EpisodeSample(
                prompt=[{"role": "user", "content": "What is 2 + 2?"}],
                extras={"reward_spec": {"ground_truth": "4"}},
                actions=("The answer is #### 4",),
            )

Without either, a generic one-message prompt and no ``extras`` are used. Steps after the replayed actions
(and all steps when there are none) send a filler answer until the env is done.

Every episode runs on a fresh env: from ``make(id, ...)`` for an id or spec, from ``factory(...)`` for a class or
callable, or from ``copy.deepcopy`` of a given, not yet initialised instance (which is itself left untouched).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import random
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from skyrl_gym.core import Env
from skyrl_gym.envs.base_text_env import ConversationType, EpisodeSample
from skyrl_gym.envs.registration import EnvSpec, load_env_creator, make
from skyrl_gym.envs.registration import spec as lookup_spec
from skyrl_gym.error import EnvContractError

__all__ = ["DEFAULT_PROMPT", "FILLER_ACTION", "EpisodeSample", "check_env", "hostile_actions"]

DEFAULT_PROMPT: ConversationType = [{"role": "user", "content": "What is 2 + 2? End with: Answer: <number>"}]
"""The prompt used when neither an argument nor ``sample_episode()`` provides one."""

FILLER_ACTION = "I am not sure. Answer: 4"
"""The action sent once the replayed actions run out."""

_STEP_KEYS = ("observations", "reward", "done", "metadata")


def hostile_actions() -> dict[str, str]:
    """The malformed actions ``check_env`` sends, by name. Deterministic."""
    rng = random.Random(0)
    alphabet = string.printable + "<>/{}[]()\\`$#|" + "éß漢字🙂\u200b"
    return {
        "empty": "",
        "whitespace": " \n\t\r\n  ",
        "random_junk": "".join(rng.choice(alphabet) for _ in range(2_000)),
        "huge_100kb": ("All work and no play. " * 5_000)[:100_000],
        "unbalanced_tags": "<answer>42</search><sql>SELECT * FROM <think> <tool><python>print(1)</tool>"
        "</solution><answer><search>",
        "control_chars": "\x00\x01\x1b[31m\x7f\u200b\ufeff\r",
        "unicode": "答案是 ∑∞ 🙂 e\u0301 \u202etxet lanoitceridib",
    }


@dataclasses.dataclass
class _Target:
    """How to get fresh envs of the env under test, and its class (for hooks and static methods)."""

    build: Callable[[dict[str, Any]], object]
    env_class: type | None
    accepts_kwargs: bool = True


def _target_for(env: object) -> _Target:
    if isinstance(env, Env):
        pristine = copy.deepcopy(env)
        return _Target(lambda _kwargs: copy.deepcopy(pristine), type(env), accepts_kwargs=False)
    if isinstance(env, str | EnvSpec):
        env_spec = lookup_spec(env) if isinstance(env, str) else env
        try:
            env_class = _spec_class(env_spec)
        except Exception as exc:
            raise EnvContractError(
                "construct", f"loading the entry point of {env_spec.id!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        return _Target(lambda kwargs: make(env_spec, **kwargs), env_class)
    if callable(env):
        factory: Callable[..., object] = env
        return _Target(lambda kwargs: factory(**kwargs), env if isinstance(env, type) else None)
    raise TypeError(
        f"check_env expects an env id, an EnvSpec, an env class or factory, or an env instance; "
        f"got {type(env).__name__}."
    )


def _spec_class(env_spec: EnvSpec) -> type | None:
    entry_point = env_spec.entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    return creator if isinstance(creator, type) else None


def _sample_from_hook(env_class: type | None) -> EpisodeSample | None:
    hook = getattr(env_class, "sample_episode", None)
    if hook is None:
        return None
    try:
        sample = hook()
    except Exception as exc:
        raise EnvContractError("sample_episode", f"raised {type(exc).__name__}: {exc}") from exc
    if sample is None or isinstance(sample, EpisodeSample):
        return sample
    if isinstance(sample, Mapping) and "prompt" in sample:
        fields = {f.name for f in dataclasses.fields(EpisodeSample)}
        return EpisodeSample(**{k: v for k, v in sample.items() if k in fields})
    raise EnvContractError(
        "sample_episode", f"must return an EpisodeSample, a mapping with 'prompt', or None; got {sample!r}"
    )


def _resolve_sample(
    env_class: type | None,
    prompt: ConversationType | None,
    extras: Mapping[str, Any] | None,
    env_config: Any,
    actions: Sequence[str] | None,
) -> tuple[EpisodeSample, bool]:
    """Merge explicit arguments over the hook's sample; also say whether extras/env_config were given at all."""
    hooked = _sample_from_hook(env_class)
    given = hooked is not None or extras is not None or env_config is not None
    base = hooked or EpisodeSample(prompt=DEFAULT_PROMPT)
    merged = EpisodeSample(
        prompt=list(prompt) if prompt is not None else base.prompt,
        extras=dict(extras) if extras is not None else base.extras,
        env_config=env_config if env_config is not None else base.env_config,
        actions=tuple(actions) if actions is not None else tuple(base.actions),
    )
    return merged, given


class _EnvChecker:
    """Runs the checks for one target and sample, recording the names of the checks that passed."""

    def __init__(self, target: _Target, sample: EpisodeSample, pass_kwargs: bool, max_steps: int) -> None:
        self.target = target
        self.sample = sample
        self.max_steps = max_steps
        self.passed: list[str] = []
        self.kwargs: dict[str, Any] = {}
        if pass_kwargs and target.accepts_kwargs:
            self.kwargs["extras"] = sample.extras
            if sample.env_config is not None:
                self.kwargs["env_config"] = sample.env_config

    def _pass(self, check: str) -> None:
        if check not in self.passed:
            self.passed.append(check)

    def new_env(self, check: str = "construct") -> Any:
        try:
            env = self.target.build(copy.deepcopy(self.kwargs))
        except Exception as exc:
            raise EnvContractError(
                check,
                f"constructing the env raised {type(exc).__name__}: {exc}. If the env needs a prompt, extras or "
                "env_config, pass them to check_env or define a sample_episode() classmethod.",
            ) from exc
        if not isinstance(env, Env):
            raise EnvContractError(check, f"the factory returned {type(env).__name__}, not a skyrl_gym.Env")
        self._pass("construct")
        return env

    def init(self, env: Any, check: str = "init") -> None:
        result = _call(check, env.init, copy.deepcopy(self.sample.prompt))
        if not isinstance(result, tuple) or len(result) != 2:
            raise EnvContractError(check, f"init must return an (observations, info) tuple; got {result!r:.200}")
        observations, info = result
        _check_messages(check, "init observations", observations)
        if not isinstance(info, dict):
            raise EnvContractError(check, f"init info must be a dict; got {type(info).__name__}")
        self._pass("init")

    def step(self, env: Any, action: str, check: str = "step") -> bool:
        out = _call(check, env.step, action)
        done = _check_step_output(check, out)
        self._pass("step")
        if done:
            if out["observations"]:
                raise EnvContractError(
                    "final_observations",
                    f"the step that returns done=True must return observations == []; got {out['observations']!r:.200}",
                )
            self._pass("final_observations")
        return done

    def run_episode(self) -> None:
        env = self.new_env()
        self.init(env)
        for index in range(self.max_steps):
            actions = self.sample.actions
            action = actions[index] if index < len(actions) else FILLER_ACTION
            if self.step(env, action):
                break
        else:
            raise EnvContractError(
                "terminates",
                f"the episode was not done after {self.max_steps} steps; envs must end episodes themselves "
                "(e.g. when turns >= max_turns). Raise max_steps if the env legitimately needs more.",
            )
        self._pass("terminates")
        self.check_metrics(env)
        self.check_close(env)

    def check_metrics(self, env: Any) -> None:
        metrics = _call("get_metrics", env.get_metrics) if hasattr(env, "get_metrics") else None
        if not isinstance(metrics, dict):
            raise EnvContractError("get_metrics", f"get_metrics() must return a dict; got {metrics!r:.200}")
        self._pass("get_metrics")
        owner = self.target.env_class or type(env)
        aggregate = getattr(owner, "aggregate_metrics", None)
        if aggregate is None:
            raise EnvContractError("aggregate_metrics", f"{owner.__name__} has no aggregate_metrics")
        for batch in ([copy.deepcopy(metrics), copy.deepcopy(metrics)], []):
            result = _call("aggregate_metrics", aggregate, batch)
            if not isinstance(result, dict):
                raise EnvContractError(
                    "aggregate_metrics",
                    f"aggregate_metrics({len(batch)} dicts) must return a dict; got {result!r:.200}",
                )
        self._pass("aggregate_metrics")

    def check_close(self, env: Any) -> None:
        _call("close", env.close)
        _call("close", env.close)  # a second close must be a no-op
        self._pass("close")

    def check_context_manager(self) -> None:
        env = self.new_env("context_manager")
        closed: list[bool] = []
        original_close = env.close

        def counting_close() -> None:
            closed.append(True)
            original_close()

        try:
            env.close = counting_close
        except AttributeError:
            # __slots__ or a read-only attribute: close() cannot be observed, so only the rest is checked.
            closed.append(True)

        class _Probe(Exception):
            pass

        try:
            with env as entered:
                if entered is not env:
                    raise EnvContractError("context_manager", f"__enter__ returned {entered!r}, not the env")
                self.init(env, "context_manager")
                raise _Probe
        except _Probe:
            pass
        else:
            raise EnvContractError("context_manager", "__exit__ swallowed an exception raised in the with-block")
        if not closed:
            raise EnvContractError("context_manager", "leaving the with-block did not call close()")
        self._pass("context_manager")

    def check_hostile(self) -> None:
        for name, action in hostile_actions().items():
            check = f"hostile_action[{name}]"
            env = self.new_env(check)
            self.init(env, check)
            self.step(env, action, check)
            _call(check, env.close)
            self._pass(check)


def _call(check: str, func: Callable[..., Any], *args: Any) -> Any:
    try:
        return func(*args)
    except EnvContractError:
        raise
    except Exception as exc:
        raise EnvContractError(check, f"{getattr(func, '__name__', func)} raised {type(exc).__name__}: {exc}") from exc


def _check_messages(check: str, what: str, messages: object) -> None:
    if not isinstance(messages, list):
        raise EnvContractError(check, f"{what} must be a list of chat messages; got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise EnvContractError(check, f"{what}[{index}] must be a dict; got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise EnvContractError(check, f"{what}[{index}] needs a non-empty str 'role'; got {role!r}")
        # Multimodal messages carry a list of content parts instead of a string.
        if not isinstance(content, str | list):
            raise EnvContractError(check, f"{what}[{index}]['content'] must be a str; got {type(content).__name__}")


def _check_step_output(check: str, out: object) -> bool:
    """Validate one step output and return its ``done`` flag."""
    if not isinstance(out, Mapping):
        raise EnvContractError(check, f"step must return a dict; got {type(out).__name__}")
    missing = [key for key in _STEP_KEYS if key not in out]
    if missing:
        raise EnvContractError(check, f"step output lacks keys {missing}; it has {sorted(out)}")
    _check_messages(check, "step observations", out["observations"])
    reward = out["reward"]
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise EnvContractError(check, f"reward must be a finite real number (not a bool); got {reward!r}")
    done = out["done"]
    if not isinstance(done, bool):
        raise EnvContractError(check, f"done must be a bool; got {type(done).__name__} {done!r}")
    if not isinstance(out["metadata"], dict):
        raise EnvContractError(check, f"metadata must be a dict; got {type(out['metadata']).__name__}")
    postprocessed = out.get("postprocessed_action")
    if postprocessed is not None and not isinstance(postprocessed, str):
        raise EnvContractError(check, f"postprocessed_action must be a str or None; got {postprocessed!r}")
    return done


def check_env(
    env: str | EnvSpec | Callable[..., Any] | Env[Any, Any],
    *,
    prompt: ConversationType | None = None,
    extras: Mapping[str, Any] | None = None,
    env_config: Any = None,
    actions: Sequence[str] | None = None,
    max_steps: int = 32,
    check_hostile_actions: bool = True,
) -> list[str]:
    """Check that a text env keeps the step contract (see the module docstring for the list of checks).

    Args:
        env: A registered id, an :class:`EnvSpec`, an env class or factory (called with ``extras=`` and
            ``env_config=`` when those are known), or a freshly constructed env instance (deep-copied per episode;
            ``extras``/``env_config`` cannot be applied to it).
        prompt: The prompt for ``init``; defaults to the env's ``sample_episode()`` or :data:`DEFAULT_PROMPT`.
        extras: The constructor's ``extras``; defaults to the sample's.
        env_config: The constructor's ``env_config``; defaults to the sample's (``None``: not passed).
        actions: Actions to replay before filler actions; defaults to the sample's.
        max_steps: Steps after which an episode that is not done fails the ``terminates`` check.
        check_hostile_actions: Also run the ``hostile_action[...]`` checks.

    Returns:
        The names of the checks that passed, in order.

    Raises:
        skyrl_gym.error.EnvContractError: A check failed; ``.check`` names it.
        ValueError: ``extras`` or ``env_config`` was given together with an env instance.
        TypeError: ``env`` is none of the accepted kinds, or an instance that cannot be deep-copied.
    """
    if isinstance(env, Env) and (extras is not None or env_config is not None):
        raise ValueError("extras/env_config are constructor arguments; pass an env id or class, not an instance.")
    try:
        target = _target_for(env)
    except (copy.Error, TypeError, AttributeError) as exc:
        if isinstance(env, Env):
            raise TypeError(
                f"check_env could not deep-copy {env}: {exc}. Pass the env id or class so fresh envs can be built."
            ) from exc
        raise
    sample, given = _resolve_sample(target.env_class, prompt, extras, env_config, actions)
    checker = _EnvChecker(target, sample, pass_kwargs=given, max_steps=max_steps)
    checker.run_episode()
    checker.check_context_manager()
    if check_hostile_actions:
        checker.check_hostile()
    return list(checker.passed)
