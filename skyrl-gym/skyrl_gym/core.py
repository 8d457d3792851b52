"""The environment contract: :class:`Env` and the dict a step returns.

An episode is ``obs, info = env.init(...)`` followed by ``env.step(action)`` until the returned ``done`` is true,
then ``env.close()``. One env object serves one episode; create a fresh one (``skyrl_gym.make``) per episode.
Unlike Gymnasium there is no ``reset``, ``render`` or observation/action space: ``init`` takes the episode's
starting point (for text envs, the prompt) and returns the first observations.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypedDict, TypeVar

if TYPE_CHECKING:
    from skyrl_gym.envs.registration import EnvSpec

__all__ = ["ActType", "Env", "EnvStepOutput", "ObsType"]

ObsType = TypeVar("ObsType")
ActType = TypeVar("ActType")


class EnvStepOutput(TypedDict, Generic[ObsType]):
    """What :meth:`Env.step` returns. A plain dict at run time: index it as ``out["reward"]``.

    Attributes:
        observations: The new observations the step produced (for text envs: chat messages to append).
        reward: The step's reward. A real number; ``float(out["reward"])`` is always valid.
        done: True when the episode is over; the caller must not step again.
        metadata: Free-form per-step information (parsed action, tool call, ...).
    """

    observations: ObsType
    reward: float
    done: bool
    metadata: dict[str, Any]


class Env(Generic[ObsType, ActType]):
    """Base class of every environment.

    Subclasses implement :meth:`init` and :meth:`step`, and :meth:`close` when they hold resources.

    Attributes:
        spec: The :class:`~skyrl_gym.envs.registration.EnvSpec` the env was made from, set by
            :func:`skyrl_gym.make`; ``None`` for envs constructed directly.
    """

    spec: EnvSpec | None = None

    def init(self, *args: Any, **kwargs: Any) -> tuple[ObsType, dict[str, Any]]:
        """Start the episode.

        Returns:
            ``(observations, info)``: the first observations and a dict of extra information.
        """
        raise NotImplementedError

    def step(self, action: ActType) -> EnvStepOutput[ObsType]:
        """Apply one action and return the step's observations, reward, done flag and metadata."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the env's resources. Must be idempotent: a second call is a no-op."""

    def __str__(self) -> str:
        return f"Env({type(self).__name__})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        self.close()
        # Never swallow the exception that ended the with-block.
        return False
