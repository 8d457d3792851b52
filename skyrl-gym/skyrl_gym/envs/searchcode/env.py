"""``searchcode``: a multi-tool env where the model may search or run Python before answering.

Each turn the model calls one tool, ``<tool><search>query</search></tool>`` or ``<tool><python>code</python></tool>``
(the inner tag names the tool), and gets the tool's output back as a user message: for ``search`` the JSON string
``{"result": "..."}``, for ``python`` the program's stripped stdout or ``"Error executing Python code: ..."``. An
action that is not a valid tool call gets the parse error as its observation. A tool that returns nothing (a
program that prints nothing) gets no observation message, as in skyrl-gym 0.4.

The episode ends when an action contains ``<solution>`` and ``</solution>``, or after ``max_turns`` turns
(``extras["max_turns"]``, default 2). Reward: 0 until then; at the end the GSM8K score
(:func:`skyrl_gym.envs.gsm8k.utils.compute_score`: the first ``#### <number>`` in the conversation must equal the
ground truth) over the whole conversation joined by newlines.

``env_config`` is optional; if it gives ``search_url``, ``topk``, ``timeout`` or ``log_requests`` they configure the
search tool (skyrl-gym 0.4 ignored ``env_config`` and always used the defaults, which are the same).
"""

from __future__ import annotations

import bisect
import re
from typing import Any

from skyrl_gym.config import config_get
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType, EpisodeSample
from skyrl_gym.envs.gsm8k.utils import compute_score
from skyrl_gym.envs.search.env import SearchEnvConfig, first_block
from skyrl_gym.tools.python import PythonCodeExecutorToolGroup
from skyrl_gym.tools.search import SearchToolGroup

__all__ = ["SearchCodeEnv", "first_tag_pair"]

_OPENING_TAG = re.compile(r"<(\w+)>")
_CLOSING_TAG = re.compile(r"</(\w+)>")


def first_tag_pair(text: str) -> tuple[str, str] | None:
    r"""``(name, inner_text)`` of the first ``<name>...</name>`` in ``text``, or None.

    Same result as ``re.search(r"<(\w+)>(.*?)</\1>", text, re.DOTALL)``: the leftmost opening tag that has a
    matching closing tag after it, paired with the first such closing tag. Unlike that regex, which rescans the
    rest of the text for every opening tag, this runs in O(n log n), so hostile model output cannot stall it.
    """
    closings: dict[str, list[int]] = {}
    for match in _CLOSING_TAG.finditer(text):
        closings.setdefault(match.group(1), []).append(match.start())
    for match in _OPENING_TAG.finditer(text):
        starts = closings.get(match.group(1))
        if not starts:
            continue
        index = bisect.bisect_left(starts, match.end())
        if index < len(starts):
            return match.group(1), text[match.end() : starts[index]]
    return None


class SearchCodeEnv(BaseTextEnv):
    """Search and Python tools, GSM8K-style final answer.

    Args:
        env_config: Optional; search settings as in :class:`~skyrl_gym.envs.search.env.SearchEnvConfig`.
        extras: The dataset row; needs ``reward_spec.ground_truth`` (the answer as a string), may give
            ``max_turns``.

    Attributes:
        ground_truth: ``extras["reward_spec"]["ground_truth"]``.
        chat_history: The episode's messages since ``init``: the model's actions and the observations returned.
    """

    def __init__(self, env_config: Any = None, extras: dict[str, Any] = {}) -> None:  # noqa: B006 -- 0.4 signature
        super().__init__()
        assert "reward_spec" in extras, "reward_spec field is required"
        assert "ground_truth" in extras["reward_spec"], "ground_truth is required in reward_spec field"
        self.ground_truth = extras["reward_spec"]["ground_truth"]
        self.max_turns = extras.get("max_turns", 2)
        defaults = SearchEnvConfig()
        search = SearchToolGroup(
            search_url=config_get(env_config, "search_url", defaults.search_url),
            topk=config_get(env_config, "topk", defaults.topk),
            timeout=config_get(env_config, "timeout", defaults.timeout),
            log_requests=config_get(env_config, "log_requests", defaults.log_requests),
        )
        self.init_tool_groups([search, PythonCodeExecutorToolGroup()])
        self.chat_history: ConversationType = []

    def _parse_action(self, action: str) -> tuple[str, str, list[str]]:
        """``(tool_group_name, tool_name, [stripped_input])`` for the first ``<tool><name>...</name></tool>``.

        Raises:
            ValueError: There is no ``<tool>`` block, no ``<name>...</name>`` pair inside it, or no such tool.
        """
        block = first_block(action, "<tool>", "</tool>")
        if block is None:
            raise ValueError("No <tool>...</tool> block found in action string.")
        pair = first_tag_pair(block)
        if pair is None:
            raise ValueError("No valid inner tool tag found inside <tool> block.")
        tool_name, tool_input = pair
        if tool_name not in self.tool_to_toolgroup:
            raise ValueError(
                f"Tool '{tool_name}' not found in any registered tool group; "
                f"available tools: {sorted(self.tool_to_toolgroup)}."
            )
        return self.tool_to_toolgroup[tool_name], tool_name, [tool_input.strip()]

    def _is_done(self, action: str) -> bool:
        """True when the turn budget is spent or the action contains both ``<solution>`` and ``</solution>``."""
        if self.turns >= self.max_turns:
            return True
        return "<solution>" in action and "</solution>" in action

    def _get_reward(self, action: str, done: bool) -> float:
        if not done:
            return 0.0
        transcript = "\n".join(message["content"] for message in self.chat_history)
        return float(compute_score(transcript, self.ground_truth))

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Run the requested tool and return its output, or end the episode on a solution or the last turn.

        Never raises for model output: parse and tool errors become the observation text.
        """
        self.turns += 1
        self.chat_history.append({"role": "assistant", "content": action})
        done = self._is_done(action)
        reward = self._get_reward(action, done)
        if done:
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})
        group_name: str | None = None
        tool_name: str | None = None
        tool_input: list[str] | str = ""
        try:
            group_name, tool_name, tool_input = self._parse_action(action)
            observation = str(self._execute_tool(group_name, tool_name, tool_input))
        except Exception as exc:  # the model must see what went wrong rather than crash the rollout
            group_name, tool_name, tool_input = None, None, ""
            observation = str(exc) or type(exc).__name__
        observations = [{"role": "user", "content": observation}] if observation else []
        self.chat_history.extend(observations)
        metadata = {
            "tool_group": group_name,
            "tool_name": tool_name,
            "tool_input": tool_input,
            "tools": [group.get_tool_names() for group in self.tool_groups],
        }
        return BaseTextEnvStepOutput(observations=observations, reward=reward, done=False, metadata=metadata)

    def close(self) -> None:
        """Release the tool groups' resources (the Python tool's interpreters). Idempotent."""
        for group in self.tool_groups:
            close = getattr(group, "close", None)
            if callable(close):
                close()

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """A one-tool episode: compute with Python, then answer (no retrieval service is needed)."""
        return EpisodeSample(
            prompt=[
                {
                    "role": "user",
                    "content": "What is 6 * 7? Use <tool><python>...</python></tool> if useful, "
                    "then answer as <solution>#### N</solution>.",
                }
            ],
            extras={"reward_spec": {"ground_truth": "42"}, "max_turns": 3},
            actions=("<tool><python>print(6 * 7)</python></tool>", "<solution>#### 42</solution>"),
        )
