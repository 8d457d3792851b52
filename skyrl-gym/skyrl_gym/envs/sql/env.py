"""``text2sql``: multi-turn text-to-SQL with a SQLite query tool and execution-match reward.

Each turn the model writes ``<think>...</think>`` and then either ``<sql>query</sql>``, answered with the query's
result in an ``<observation>`` block, or ``<solution>query</solution>``, which ends the episode. The reward is
0.0 until the end; the final reward scores the whole episode (see
:func:`skyrl_gym.envs.sql.utils.compute_score_single`): -1.0 for a malformed episode, 1.0 when the solution
returns the same rows as the gold query, else 0.0.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

from skyrl_gym.config import config_get
from skyrl_gym.envs._extras import ground_truth, require, turn_budget
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType, EpisodeSample
from skyrl_gym.envs.sql import utils
from skyrl_gym.envs.sql.data import BUNDLED, bundled_db_path, bundled_questions, episode
from skyrl_gym.tools.sql import SQLCodeExecutorToolGroup

__all__ = ["DATA_SOURCES", "DEFAULT_DB_PATH", "DEFAULT_MAX_TURNS", "SQLEnv", "Text2SQLEnvConfig", "resolve_db_dir"]

logger = logging.getLogger(__name__)

DEFAULT_DB_PATH = "/home/ray/default/sql_data"
DEFAULT_MAX_TURNS = 5

DATA_SOURCES: dict[str, str] = {
    "synsql": "SynSQL-2.5M/databases",
    "spider": "spider/database",
    "bird": "bird/train/train_databases",
}
"""``extras["data"]`` value → directory of its databases under ``env_config.db_path``. ``"bundled"`` also works."""


@dataclasses.dataclass
class Text2SQLEnvConfig:
    """Configuration of the ``text2sql`` env."""

    # Root directory holding the dataset database folders of DATA_SOURCES (ignored for data="bundled").
    db_path: str = DEFAULT_DB_PATH


def resolve_db_dir(data: str, db_path: str) -> str:
    """The directory whose ``{db_id}/{db_id}.sqlite`` files hold the databases of data source ``data``.

    Raises:
        NotImplementedError: ``data`` is neither a key of :data:`DATA_SOURCES` nor ``"bundled"``.
    """
    if data == BUNDLED:
        return bundled_db_path()
    subdir = DATA_SOURCES.get(data)
    if subdir is None:
        known = [*DATA_SOURCES, BUNDLED]
        raise NotImplementedError(f"text2sql data source {data!r} is not supported; use one of {known}")
    return os.path.join(db_path, subdir)


class SQLEnv(BaseTextEnv):
    """Text-to-SQL episodes on one SQLite database.

    Args:
        env_config: Anything with a ``db_path`` (a :class:`Text2SQLEnvConfig`, a mapping or a ``DictConfig``);
            ``None`` uses :data:`DEFAULT_DB_PATH`.
        extras: ``db_id`` (the database), ``data`` (the data source, see :data:`DATA_SOURCES`; ``"bundled"`` for
            the databases shipped with skyrl-gym), ``reward_spec.ground_truth`` (the gold SQL) and optionally
            ``max_turns`` (default :data:`DEFAULT_MAX_TURNS`).

    Attributes:
        db_id: The database of the episode.
        data: The data source name.
        db_path: Directory of the data source's databases.
        db_file: The database file, ``{db_path}/{db_id}/{db_id}.sqlite``.
        ground_truth: The gold SQL (also readable as ``gold_sql``).
        tool_group: The :class:`SQLCodeExecutorToolGroup` answering ``<sql>`` queries.
        chat_history: The episode's assistant turns and tool observations, in order (the prompt is not included).

    Model output never makes ``step`` raise: the first complete ``<sql>...</sql>`` block is run and anything after
    a closing tag is ignored (0.4 asserted that nothing followed it); a turn without a query, a failing query or
    a failing tool call is answered with an observation saying so.

    Raises:
        AssertionError: A required field of ``extras`` is missing (0.4 messages).
        NotImplementedError: ``extras["data"]`` names an unknown data source.
        FileNotFoundError: The database file does not exist.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.ground_truth = ground_truth(extras)
        require("db_id" in extras, "db_id field is required")
        require("data" in extras, "data field is required")
        self.db_id: str = extras["db_id"]
        self.data: str = extras["data"]
        self.db_path = resolve_db_dir(self.data, config_get(env_config, "db_path", DEFAULT_DB_PATH))
        self.db_file = os.path.join(self.db_path, self.db_id, f"{self.db_id}.sqlite")
        if not os.path.exists(self.db_file):
            raise FileNotFoundError(f"Database file not found at: {self.db_file}")
        self.tool_group = SQLCodeExecutorToolGroup(db_file_path=self.db_path)
        self.init_tool_groups([self.tool_group])
        self.chat_history: ConversationType = []
        self.max_turns = turn_budget(extras, DEFAULT_MAX_TURNS)

    @property
    def gold_sql(self) -> Any:
        """The gold SQL (same as ``ground_truth``)."""
        return self.ground_truth

    def _parse_action(self, action: str) -> list[str | None]:
        """``[text of the first <sql>...</sql> block]``, or ``[None]`` when there is no complete block."""
        start = action.find(utils.SQL_START)
        end = action.find(utils.SQL_END, start + len(utils.SQL_START)) if start >= 0 else -1
        # str.find instead of a regex: linear time however many unclosed tags the model writes.
        return [action[start + len(utils.SQL_START) : end]] if end >= 0 else [None]

    def _is_done(self, action: str) -> bool:
        if self.turns >= self.max_turns:
            return True
        return utils.SOLUTION_START in action and utils.SOLUTION_END in action

    def _final_reward(self) -> float:
        transcript = "\n".join(str(message["content"]) for message in self.chat_history)
        return utils.compute_score_single(transcript, self.ground_truth, self.db_file)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Run the turn's ``<sql>`` query, or end the episode on ``<solution>`` or when out of turns.

        Returns:
            While running: one user message with the tool's observation, reward 0.0, and metadata
            ``{"tool_group", "tool_name", "tool_input": (db_id, sql or None, turns_left)}``. At the end: no
            observations and the episode's reward.
        """
        self.turns += 1
        self.chat_history.append({"role": "assistant", "content": action})
        if self._is_done(action):
            return BaseTextEnvStepOutput(observations=[], reward=self._final_reward(), done=True, metadata={})
        group_name, tool_name = self.tool_group.get_name(), "sql"
        tool_input = (self.db_id, self._parse_action(action)[0], self.max_turns - self.turns)
        try:
            content = str(self._execute_tool(group_name, tool_name, tool_input))
        except Exception as exc:  # e.g. the database vanished: report it to the model instead of ending the rollout
            logger.warning("text2sql tool call failed (%s): %s", type(exc).__name__, exc)
            content = str(exc)
        observation = {"role": "user", "content": content}
        self.chat_history.append(observation)
        metadata = {"tool_group": group_name, "tool_name": tool_name, "tool_input": tool_input}
        return BaseTextEnvStepOutput(observations=[observation], reward=0.0, done=False, metadata=metadata)

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """A bundled question: one exploratory query, then the gold SQL as the solution."""
        question = bundled_questions()[0]
        prompt, extras = episode(question, max_turns=3)
        actions = (
            "<think>I should check what the books table holds.</think>\n<sql>SELECT COUNT(*) FROM books</sql>",
            f"<think>Counting the rows answers the question.</think>\n<solution>{question['sql']}</solution>",
        )
        return EpisodeSample(prompt=prompt, extras=extras, actions=actions)
