r"""``search``: retrieval-augmented question answering in the Search-R1 format.

Each turn the model either searches, ``<search>query</search>``, and gets the retrieved passages back as a user
message ``"\n<information>{\"result\": \"...\"}</information>\n"``, or answers, ``<answer>...</answer>``,
which ends the episode. The episode also ends after ``max_turns`` turns (``extras["max_turns"]``, default 2).

Reward: 0 on every step but the last; at the end, 1.0 if the last ``<answer>`` in the whole conversation (the
model's turns and the observations, concatenated) exactly matches one of ``ground_truth["target"]`` after
normalisation (:func:`skyrl_gym.envs.search.utils.compute_score`), else 0.0.

The retrieval service is configured by ``env_config`` (:class:`SearchEnvConfig`, a mapping or a ``DictConfig``);
``skyrl-gym serve-retriever`` runs one over a bundled corpus.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from skyrl_gym.config import config_get
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType, EpisodeSample
from skyrl_gym.envs.search.utils import compute_score
from skyrl_gym.tools.search import SearchToolGroup

__all__ = ["SearchEnv", "SearchEnvConfig"]

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


@dataclasses.dataclass
class SearchEnvConfig:
    """Where and how the env searches."""

    log_requests: bool = False  # log every retrieval request at INFO level
    search_url: str = "http://127.0.0.1:8000/retrieve"  # the retrieval service's /retrieve endpoint
    topk: int = 3  # passages per search
    timeout: int = 30  # seconds per HTTP attempt


def first_block(text: str, open_tag: str, close_tag: str) -> str | None:
    """The raw text between the first ``open_tag`` and the first ``close_tag`` after it, or None.

    Same result as ``re.search(open + "(.*?)" + close, text, re.DOTALL)``, but always linear in ``len(text)``.
    """
    start = text.find(open_tag)
    if start < 0:
        return None
    end = text.find(close_tag, start + len(open_tag))
    return None if end < 0 else text[start + len(open_tag) : end]


class SearchEnv(BaseTextEnv):
    """Search-R1 style QA: search with ``<search>``, finish with ``<answer>``.

    Args:
        env_config: :class:`SearchEnvConfig` or a mapping with its fields; missing fields take their defaults.
        extras: The dataset row; needs ``reward_spec.ground_truth`` (a dict with ``"target"``: one answer or a
            list), may give ``max_turns``.

    Attributes:
        ground_truth: ``extras["reward_spec"]["ground_truth"]``.
        tool_group: The :class:`~skyrl_gym.tools.search.SearchToolGroup` (``search_url``, ``topk``, ``timeout``).
        chat_history: The episode's messages since ``init``: the model's actions and the observations returned.
    """

    def __init__(self, env_config: Any = None, extras: dict[str, Any] = {}) -> None:  # noqa: B006 -- 0.4 signature
        super().__init__()
        assert "reward_spec" in extras, "reward_spec field is required"
        assert "ground_truth" in extras["reward_spec"], "ground_truth is required in reward_spec field"
        self.ground_truth = extras["reward_spec"]["ground_truth"]
        self.max_turns = extras.get("max_turns", 2)
        defaults = SearchEnvConfig()
        # The group's name is fixed ("SearchToolGroup") and its only tool is "search".
        self.tool_group = SearchToolGroup(
            search_url=config_get(env_config, "search_url", defaults.search_url),
            topk=config_get(env_config, "topk", defaults.topk),
            timeout=config_get(env_config, "timeout", defaults.timeout),
            log_requests=config_get(env_config, "log_requests", defaults.log_requests),
        )
        self.init_tool_groups([self.tool_group])
        self.chat_history: ConversationType = []

    def _parse_action(self, action: str) -> list[str | None]:
        """``[query]``: the raw (unstripped) text of the first ``<search>`` block, or ``[None]`` if there is none."""
        return [first_block(action, SEARCH_OPEN, SEARCH_CLOSE)]

    def _is_done(self, action: str) -> bool:
        """True when the turn budget is spent or the action contains both ``<answer>`` and ``</answer>``."""
        if self.turns >= self.max_turns:
            return True
        return ANSWER_OPEN in action and ANSWER_CLOSE in action

    def _get_reward(self, action: str, done: bool) -> float:
        if not done:
            return 0.0
        transcript = "".join(message["content"] for message in self.chat_history)
        return float(compute_score(transcript, self.ground_truth))

    def _execute_tool(self, tool_group_name: str, tool_name: str, tool_input: Any) -> str:
        """Run the tool and wrap its JSON output in ``<information>`` tags, as the model was prompted to expect."""
        output = super()._execute_tool(tool_group_name, tool_name, tool_input)
        return "\n<information>" + str(output) + "</information>\n"

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Answer a search with the retrieved passages, or end the episode on an answer or the last turn.

        Never raises for model output: a failed search becomes the observation text.
        """
        self.turns += 1
        self.chat_history.append({"role": "assistant", "content": action})
        done = self._is_done(action)
        reward = self._get_reward(action, done)
        if done:
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})
        query = self._parse_action(action)
        try:
            observation = self._execute_tool("SearchToolGroup", "search", query)
        except Exception as exc:  # the model must see what went wrong rather than crash the rollout
            observation = str(exc) or type(exc).__name__
        message = {"role": "user", "content": observation}
        self.chat_history.append(message)
        return BaseTextEnvStepOutput(
            observations=[message],
            reward=reward,
            done=False,
            metadata={"tool_group": "SearchToolGroup", "tool_name": "search", "tool_input": query},
        )

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """The first bundled question, answered directly (no search, so no retrieval service is needed)."""
        from skyrl_gym.retrieval.data import load_bundled_questions  # deferred: only check_env needs the data

        question = load_bundled_questions()[0]
        prompt = f"{question['question']} Search with <search>query</search>; answer with <answer>...</answer>."
        return EpisodeSample(
            prompt=[{"role": "user", "content": prompt}],
            extras={"reward_spec": {"ground_truth": {"target": question["golden_answers"]}}, "max_turns": 2},
            actions=(f"<answer>{question['golden_answers'][0]}</answer>",),
        )
