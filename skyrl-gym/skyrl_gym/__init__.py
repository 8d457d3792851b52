"""skyrl-gym: tool-use text environments for reinforcement learning of LLM agents.

``import skyrl_gym`` registers the built-in envs (by name only; their modules load on first ``make``) and has no
other side effects. Optional pieces are separate modules: :mod:`skyrl_gym.checker`,
:mod:`skyrl_gym.gymnasium_bridge`, :mod:`skyrl_gym.async_env`, :mod:`skyrl_gym.config`.
"""

from skyrl_gym import envs, error, tools
from skyrl_gym.core import Env
from skyrl_gym.envs.registration import deregister, make, pprint_registry, register, registry, spec

__version__ = "0.1.0"

__all__ = [
    "Env",
    "__version__",
    "deregister",
    "envs",
    "error",
    "make",
    "pprint_registry",
    "register",
    "registry",
    "spec",
    "tools",
]
