"""skyrl-agent: long-horizon LLM agent episodes in sandboxes.

Importing the package registers the ``swe`` env with skyrl-gym (``skyrl_gym.make("swe", extras={"task": ...})``);
the entry point is a string, so nothing of the env (or of Docker) is imported until an env is made.
"""

__version__ = "0.1.0"


def _register_envs() -> None:
    from skyrl_gym.envs.registration import register, registry

    if "swe" not in registry:
        register("swe", entry_point="skyrl_agent.agents.swe_env:SWEEnv")


_register_envs()
