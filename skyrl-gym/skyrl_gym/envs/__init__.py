"""Built-in envs and the registry.

Importing this package registers the built-in envs by ``"module.path:ClassName"`` strings only: no env module
is imported until ``make`` asks for it, so a missing optional dependency of one env cannot break the others.
"""

from __future__ import annotations

from skyrl_gym.envs.base_text_env import (
    BaseTextEnv,
    BaseTextEnvStepOutput,
    ConversationType,
    EpisodeSample,
    MessageType,
)
from skyrl_gym.envs.registration import (
    EnvSpec,
    deregister,
    make,
    pprint_registry,
    register,
    registry,
    spec,
)

__all__ = [
    "BUILTIN_ENVS",
    "BaseTextEnv",
    "BaseTextEnvStepOutput",
    "ConversationType",
    "EnvSpec",
    "EpisodeSample",
    "MessageType",
    "deregister",
    "make",
    "pprint_registry",
    "register",
    "registry",
    "spec",
]

BUILTIN_ENVS: dict[str, str] = {
    "aime": "skyrl_gym.envs.aime.env:AIMEEnv",
    "gsm8k": "skyrl_gym.envs.gsm8k.env:GSM8kEnv",
    "gsm8k_multi_turn": "skyrl_gym.envs.gsm8k.multi_turn_env:GSM8kMultiTurnEnv",
    "text2sql": "skyrl_gym.envs.sql.env:SQLEnv",
    "search": "skyrl_gym.envs.search.env:SearchEnv",
    "lcb": "skyrl_gym.envs.lcb.env:LCBEnv",
    "searchcode": "skyrl_gym.envs.searchcode.env:SearchCodeEnv",
}
"""Built-in env id → entry point."""


def _register_builtins() -> None:
    for env_id, entry_point in BUILTIN_ENVS.items():
        existing = registry.get(env_id)
        # Skip ids already registered to the same entry point, so re-importing this module (importlib.reload)
        # does not raise; a different entry point under a built-in id is still reported as a conflict.
        if existing is not None and existing.entry_point == entry_point:
            continue
        register(id=env_id, entry_point=entry_point)


_register_builtins()
