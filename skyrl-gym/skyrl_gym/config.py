"""Reading ``env_config`` whatever its type.

An env's ``env_config`` reaches it as ``None``, a dataclass (or any object with attributes), a ``Mapping``, or an
OmegaConf ``DictConfig``. ``config_get`` reads all four the same way, by duck typing, so skyrl-gym never imports
omegaconf::

    search_url = config_get(env_config, "search_url", "http://127.0.0.1:8000/retrieve")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["config_get"]


def config_get(env_config: object, key: str, default: Any = None) -> Any:
    """Read ``key`` from ``env_config``, or return ``default`` when it is absent.

    Lookup rules, in order:

    * ``None`` → ``default``.
    * A ``Mapping`` (``dict``, and OmegaConf ``DictConfig``, which is a ``MutableMapping``) → ``env_config[key]``
      if ``key in env_config``, else ``default``. Using ``in`` rather than ``.get`` keeps struct-mode
      ``DictConfig`` objects from raising on unknown keys.
    * Anything else (dataclass, namespace, pydantic model) → ``getattr(env_config, key, default)``.

    A key that is present with the value ``None`` returns ``None``, not ``default``: the config said "None".
    Nested configs come back as they are stored (a nested ``DictConfig`` stays one); call ``config_get`` on them.

    Args:
        env_config: The config object, or ``None``.
        key: A single key (no dotted paths).
        default: What to return when ``key`` is absent.

    Returns:
        The stored value or ``default``.
    """
    if env_config is None:
        return default
    if isinstance(env_config, Mapping):
        return env_config[key] if key in env_config else default  # noqa: SIM401 -- see above
    return getattr(env_config, key, default)
