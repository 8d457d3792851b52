"""Exceptions raised by skyrl-gym.

Every exception the library raises on purpose derives from :class:`Error`, so ``except skyrl_gym.error.Error``
catches them all. A few also derive from a builtin exception, because skyrl-gym 0.4 signalled the same
condition with that builtin and existing code catches it::

    skyrl_gym.error.Error
    ├── RegistrationError                 register(): the id is taken or the spec is malformed
    │   └── InvalidEntryPointError        (+ AssertionError) entry point missing or not "module.path:Attr"
    ├── UnregisteredEnvError              (+ ValueError) no env with this id: make(), spec(), deregister()
    ├── InvalidEnvError                   (+ AssertionError) an entry point built something that is not an Env
    ├── ToolNotFoundError                 (+ ValueError) ToolGroup.execute_tool() with an unknown tool name
    └── EnvContractError                  checker.check_env(): an env broke the step contract
"""

from __future__ import annotations

__all__ = [
    "EnvContractError",
    "Error",
    "InvalidEntryPointError",
    "InvalidEnvError",
    "RegistrationError",
    "ToolNotFoundError",
    "UnregisteredEnvError",
]


class Error(Exception):
    """Base class of every error skyrl-gym raises on purpose."""


class RegistrationError(Error):
    """An env could not be registered, e.g. because its id is already taken."""


class InvalidEntryPointError(RegistrationError, AssertionError):
    """An entry point is missing or is a string not of the form ``"module.path:AttrName"``.

    Also an ``AssertionError``: skyrl-gym 0.4 checked the entry point with an ``assert``.
    """


class UnregisteredEnvError(Error, ValueError):
    """No env is registered under the requested id.

    Also a ``ValueError``: ``metrics.aggregate_for_environment`` raised ``ValueError`` for unknown ids in 0.4.
    """


class InvalidEnvError(Error, AssertionError):
    """An entry point returned an object that is not a :class:`skyrl_gym.Env`.

    Also an ``AssertionError``: skyrl-gym 0.4 checked the created object with an ``assert``.
    """


class ToolNotFoundError(Error, ValueError):
    """A tool group was asked for a tool it does not have.

    Also a ``ValueError``, which is what 0.4 raised.
    """


class EnvContractError(Error):
    """An env broke the contract that :func:`skyrl_gym.checker.check_env` verifies.

    Attributes:
        check: Name of the failed check, e.g. ``"step"`` or ``"hostile_action[empty]"``.
        detail: What was wrong, in words.
    """

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"check_env: check {check!r} failed: {detail}")
        self.check = check
        self.detail = detail

    def __reduce__(self) -> tuple[type[EnvContractError], tuple[str, str]]:
        # The default reduction would call __init__ with the formatted message only; keep it picklable
        # so the error survives a trip through a process pool.
        return (type(self), (self.check, self.detail))
