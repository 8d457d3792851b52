"""Text envs: observations are OpenAI-style chat messages, actions are the model's text.

A text env is built once per episode with ``(env_config=None, extras={})``: ``env_config`` is the env's own
configuration (dataclass, mapping or OmegaConf ``DictConfig``; read it with :func:`skyrl_gym.config.config_get`),
``extras`` the dataset row's other columns plus ``max_turns``. Then::

    observations, info = env.init(prompt)        # prompt: list of {"role", "content"} messages
    out = env.step(model_text)                    # out["observations"]: messages to append
    ...                                           # until out["done"]; the final observations are []
    metrics = env.get_metrics()
    env.close()
"""

# No `from __future__ import annotations` here: TypedDict on Python 3.11 cannot see NotRequired inside string
# annotations, and would make `postprocessed_action` a required key.
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NotRequired

from skyrl_gym._aggregation import default_aggregate_metrics
from skyrl_gym.core import Env, EnvStepOutput

if TYPE_CHECKING:
    from skyrl_gym.tools.core import ToolGroup

__all__ = [
    "BaseTextEnv",
    "BaseTextEnvStepOutput",
    "ConversationType",
    "EpisodeSample",
    "MessageType",
]

MessageType = dict[str, str]
"""One chat message: ``{"role": "user" | "assistant" | "system" | "tool", "content": str}``."""

ConversationType = list[MessageType]
"""A chat conversation: messages in order."""


class BaseTextEnvStepOutput(EnvStepOutput[ConversationType]):
    """What :meth:`BaseTextEnv.step` returns (a plain dict at run time).

    Attributes:
        observations: Messages to append to the conversation; ``[]`` on the final step.
        reward: The step's reward.
        done: True when the episode is over.
        metadata: Free-form per-step information.
        postprocessed_action: Deprecated, optional: a rewritten action to use instead of the model's text.
            Rewriting actions breaks token-in-token-out training, so new envs should leave it out.
    """

    postprocessed_action: NotRequired[str | None]


@dataclasses.dataclass(frozen=True)
class EpisodeSample:
    """A small, self-contained example episode for an env: what tools need to run it without a dataset.

    Envs advertise one through the optional ``sample_episode()`` classmethod. :func:`skyrl_gym.checker.check_env`
    uses it to exercise the env, and the Gymnasium bridge uses it when ``reset`` is given no prompt.

    Attributes:
        prompt: The prompt passed to ``init``.
        extras: The ``extras`` passed to the constructor (e.g. ``{"reward_spec": {"ground_truth": "4"}}``).
        env_config: The ``env_config`` passed to the constructor; ``None`` means "do not pass one".
        actions: Model outputs to replay in order, e.g. a correct solution, before any filler actions.
    """

    prompt: ConversationType
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_config: Any = None
    actions: tuple[str, ...] = ()


class BaseTextEnv(Env[ConversationType, str]):
    """Base class of text envs.

    Attributes:
        turns: Steps taken so far; subclasses increment it in ``step``.
        max_turns: The turn budget; multi-turn envs end the episode when ``turns >= max_turns``.
        tool_groups: The env's :class:`~skyrl_gym.tools.core.ToolGroup` objects.
        tool_to_toolgroup: Tool name → name of the group that owns it.
    """

    def __init__(self) -> None:
        self.turns = 0
        self.max_turns = 1
        self.tool_groups: list[ToolGroup] = []
        self.tool_to_toolgroup: dict[str, str] = {}

    def init_tool_groups(self, tool_groups: Sequence["ToolGroup"] = ()) -> None:
        """Install the env's tool groups and index their tools by name.

        Tool names must be unique across groups: a later group's tool of the same name wins.
        """
        self.tool_groups = list(tool_groups)
        self.tool_to_toolgroup = {}
        for group in self.tool_groups:
            self.tool_to_toolgroup.update(group.get_tool_to_group_mapping())

    def _execute_tool(self, tool_group_name: str, tool_name: str, tool_input: Sequence[Any]) -> Any:
        """Run ``tool_name`` of the group named ``tool_group_name`` with ``tool_input`` as positional arguments.

        Raises:
            ValueError: No installed group has that name.
            skyrl_gym.error.ToolNotFoundError: The group has no such tool (a ``ValueError``).
        """
        for group in self.tool_groups:
            if group.name == tool_group_name:
                return group.execute_tool(tool_name, *tool_input)
        known = [group.name for group in self.tool_groups]
        raise ValueError(f"ToolGroup '{tool_group_name}' not found; this env has tool groups {known}.")

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the episode. The default returns the prompt unchanged and an empty info dict."""
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Consume the model's text and return the next messages, reward and done flag.

        Must not raise on malformed model output: answer it with an observation (and usually zero reward).
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release the env's resources. Idempotent; the default does nothing."""

    def get_metrics(self) -> dict[str, Any]:
        """Per-episode metrics, read by the trainer after the episode ends. The default is ``{}``."""
        return {}

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """Combine the ``get_metrics()`` dicts of many episodes; the default averages numeric values."""
        return dict(default_aggregate_metrics(metrics))

    @classmethod
    def sample_episode(cls) -> EpisodeSample | None:
        """An optional example episode (see :class:`EpisodeSample`); ``None`` when the env offers none."""
        return None
