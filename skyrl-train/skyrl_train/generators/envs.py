"""Making one trajectory's env, the same way in the generator's process and in an env worker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import skyrl_gym
from skyrl_gym import Env

__all__ = ["make_env"]


def make_env(env_class: str, env_config: Any, extras: Mapping[str, Any], max_turns: int) -> Env[Any, Any]:
    """``skyrl_gym.make`` with ``extras`` plus ``max_turns``, in a new dict.

    The copy is shallow on purpose: extras may hold callables and clients (e.g. an ``lm_callback``) that must not
    be duplicated. Envs must not mutate nested values, which the samples of one prompt may share.
    """
    return skyrl_gym.make(env_class, env_config=env_config, extras={**extras, "max_turns": max_turns})
