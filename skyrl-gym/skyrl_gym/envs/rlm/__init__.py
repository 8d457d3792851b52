"""Recursive-language-model (RLM) episodes: the model answers a query by programming a persistent Python REPL.

* :class:`BaseRLMEnv` (``skyrl_gym.envs.rlm.env``): the text env; subclass it, override ``_get_reward``, and
  register the subclass (``BaseRLMEnv`` itself is not registered).
* :class:`PersistentREPL` (``skyrl_gym.envs.rlm.repl``): the REPL, usable on its own.

See ``docs/gym/rlm.md`` for the action format, the REPL helpers and the isolation options.
"""

from skyrl_gym.envs.rlm.env import BaseRLMEnv
from skyrl_gym.envs.rlm.repl import PersistentREPL, REPLResult, REPLStartError, REPLTimeoutError

__all__ = ["BaseRLMEnv", "PersistentREPL", "REPLResult", "REPLStartError", "REPLTimeoutError"]
