import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import skyrl_gym
from skyrl_gym.checker import check_env, hostile_actions
from skyrl_gym.envs.sql.data import bundled_db_path, bundled_questions, episode
from skyrl_gym.envs.sql.env import DATA_SOURCES, SQLEnv, Text2SQLEnvConfig, resolve_db_dir
from skyrl_gym.tools.sql import INVALID_ACTION_MESSAGE, SQLCodeExecutorToolGroup

COUNT_BOOKS = "SELECT COUNT(*) FROM books"


def bundled_extras(gold: str = COUNT_BOOKS, db_id: str = "bookstore", **more: Any) -> dict[str, Any]:
    return {"db_id": db_id, "data": "bundled", "reward_spec": {"method": "rule", "ground_truth": gold}, **more}


def make(**more: Any) -> SQLEnv:
    env = skyrl_gym.make("text2sql", extras=bundled_extras(**more))
    assert isinstance(env, SQLEnv)
    return env


def sql_turn(query: str) -> str:
    return f"<think>Let me look at the data.</think>\n<sql>{query}</sql>"


def solution_turn(query: str) -> str:
    return f"<think>I have what I need.</think>\n<solution>{query}</solution>"


def test_query_turn_returns_the_result_table() -> None:
    env = make(max_turns=4)
    prompt = [{"role": "user", "content": "How many books?"}]
    assert env.init(prompt) == (prompt, {})
    out = env.step(sql_turn("SELECT COUNT(*) FROM books"))
    assert out["done"] is False
    assert out["reward"] == 0.0
    assert out["observations"] == [
        {
            "role": "user",
            "content": "\n\n<observation>  0\n120\n<reminder>You have 3 turns left to complete the task."
            "</reminder></observation>\n\n",
        }
    ]
    assert out["metadata"] == {
        "tool_group": "SQLCodeExecutorToolGroup",
        "tool_name": "sql",
        "tool_input": ("bookstore", "SELECT COUNT(*) FROM books", 3),
    }
    assert isinstance(out["metadata"]["tool_input"], tuple)
    assert env.turns == 1


def test_gold_solution_after_a_query_scores_one() -> None:
    env = make(max_turns=4)
    env.step(sql_turn("SELECT title FROM books LIMIT 2"))
    out = env.step(solution_turn("SELECT count(book_id) FROM books"))
    assert (out["reward"], out["done"], out["observations"], out["metadata"]) == (1.0, True, [], {})
    assert env.turns == 2
    assert [m["role"] for m in env.chat_history] == ["assistant", "user", "assistant"]


def test_wrong_solution_scores_zero() -> None:
    env = make()
    out = env.step(solution_turn("SELECT COUNT(*) FROM authors"))
    assert (out["reward"], out["done"]) == (0.0, True)


def test_failing_solution_scores_zero() -> None:
    env = make()
    assert env.step(solution_turn("SELECT nope FROM nowhere"))["reward"] == 0.0


def test_bad_format_scores_minus_one() -> None:
    env = make()
    out = env.step(f"<solution>{COUNT_BOOKS}</solution>")  # no <think> block
    assert (out["reward"], out["done"], out["observations"]) == (-1.0, True, [])


def test_observation_must_be_followed_by_thinking() -> None:
    env = make()
    env.step(sql_turn("SELECT 1"))
    out = env.step(f"<solution>{COUNT_BOOKS}</solution>")  # answers the observation without <think>
    assert out["reward"] == -1.0


def test_turn_budget_ends_the_episode() -> None:
    env = make(max_turns=3)
    outs = [env.step(sql_turn("SELECT 1")) for _ in range(3)]
    assert [o["done"] for o in outs] == [False, False, True]
    assert [o["metadata"].get("tool_input", (None, None, None))[2] for o in outs[:2]] == [2, 1]
    assert outs[-1]["observations"] == []
    assert outs[-1]["reward"] == -1.0  # never gave a solution
    assert env.turns == env.max_turns == 3


def test_last_turn_solution_is_scored() -> None:
    env = make(max_turns=2)
    env.step(sql_turn("SELECT 1"))
    assert env.step(solution_turn(COUNT_BOOKS))["reward"] == 1.0


def test_turn_without_query_gets_the_invalid_action_message() -> None:
    env = make()
    out = env.step("<think>Hmm.</think> I will just chat.")
    content = out["observations"][0]["content"]
    assert content.startswith(f"\n\n<observation>{INVALID_ACTION_MESSAGE}\n<reminder>")
    assert out["metadata"]["tool_input"] == ("bookstore", None, 4)


def test_first_sql_block_is_used() -> None:
    env = make()
    assert env._parse_action("<sql>SELECT 1</sql> and <sql>SELECT 2</sql>") == ["SELECT 1"]
    assert env._parse_action("<sql>SELECT 1") == [None]
    assert env._parse_action("</sql><sql>") == [None]
    assert env._parse_action("no tags") == [None]


def test_tool_errors_become_observations(tmp_path: Path) -> None:
    shutil.copytree(bundled_db_path(), tmp_path / "spider" / "database")
    env = SQLEnv(Text2SQLEnvConfig(db_path=str(tmp_path)), {**bundled_extras(), "data": "spider"})
    (tmp_path / "spider" / "database" / "bookstore" / "bookstore.sqlite").unlink()
    out = env.step(sql_turn("SELECT 1"))
    assert out["done"] is False
    assert "bookstore.sqlite" in out["observations"][0]["content"]


@pytest.mark.parametrize("question", bundled_questions(), ids=lambda q: q["question"][:40])
def test_every_bundled_gold_query_scores_one(question: dict[str, str]) -> None:
    prompt, extras = episode(question)  # type: ignore[arg-type]
    env = skyrl_gym.make("text2sql", extras=extras)
    env.init(prompt)
    assert env.step(solution_turn(question["sql"]))["reward"] == 1.0


def test_attributes() -> None:
    env = make()
    assert env.ground_truth == env.gold_sql == COUNT_BOOKS
    assert env.db_id == "bookstore"
    assert env.data == "bundled"
    assert env.db_file == str(Path(bundled_db_path()) / "bookstore" / "bookstore.sqlite")
    assert isinstance(env.tool_group, SQLCodeExecutorToolGroup)
    assert env.tool_group.get_tool_names() == ["sql"]
    assert env.tool_to_toolgroup == {"sql": "SQLCodeExecutorToolGroup"}
    assert env.chat_history == []
    assert (env.turns, env.max_turns) == (0, 5)
    assert make(max_turns=2).max_turns == 2


# ---------------------------------------------------------------- data sources and env_config


@pytest.fixture
def spider_root(tmp_path: Path) -> Path:
    shutil.copytree(bundled_db_path(), tmp_path / "spider" / "database")
    return tmp_path


@dataclasses.dataclass
class OtherConfig:
    db_path: str


def config_kinds(root: Path) -> list[Any]:
    return [
        Text2SQLEnvConfig(db_path=str(root)),
        OtherConfig(db_path=str(root)),
        {"db_path": str(root)},
        OmegaConf.create({"db_path": str(root), "unrelated": 1}),
        OmegaConf.structured(Text2SQLEnvConfig(db_path=str(root))),
    ]


def test_env_config_kinds_select_db_path(spider_root: Path) -> None:
    extras = {**bundled_extras(), "data": "spider"}
    for env_config in config_kinds(spider_root):
        env = skyrl_gym.make("text2sql", env_config=env_config, extras=extras)
        assert env.db_path == str(spider_root / "spider" / "database")  # type: ignore[attr-defined]
        assert env.step(solution_turn(COUNT_BOOKS))["reward"] == 1.0
    positional = SQLEnv(Text2SQLEnvConfig(db_path=str(spider_root)), extras)
    assert positional.step(solution_turn(COUNT_BOOKS))["reward"] == 1.0


def test_none_env_config_uses_the_default_path() -> None:
    assert Text2SQLEnvConfig().db_path == "/home/ray/default/sql_data"
    with pytest.raises(FileNotFoundError, match="/home/ray/default/sql_data/spider/database/bookstore"):
        SQLEnv(None, {**bundled_extras(), "data": "spider"})


def test_bundled_ignores_db_path(tmp_path: Path) -> None:
    for env_config in [None, *config_kinds(tmp_path / "nowhere")]:
        env = skyrl_gym.make("text2sql", env_config=env_config, extras=bundled_extras())
        assert env.db_path == bundled_db_path()  # type: ignore[attr-defined]


def test_data_source_directories() -> None:
    assert DATA_SOURCES == {
        "synsql": "SynSQL-2.5M/databases",
        "spider": "spider/database",
        "bird": "bird/train/train_databases",
    }
    assert resolve_db_dir("synsql", "/d") == "/d/SynSQL-2.5M/databases"
    assert resolve_db_dir("bird", "/d") == "/d/bird/train/train_databases"
    assert resolve_db_dir("bundled", "/d") == bundled_db_path()
    with pytest.raises(NotImplementedError):
        resolve_db_dir("wikisql", "/d")
    with pytest.raises(NotImplementedError):
        SQLEnv(None, {**bundled_extras(), "data": "wikisql"})


def test_missing_database_file() -> None:
    with pytest.raises(FileNotFoundError, match=r"Database file not found at: .*no_such_db\.sqlite"):
        SQLEnv(None, bundled_extras(db_id="no_such_db"))


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("reward_spec", "reward_spec field is required"),
        ("db_id", "db_id field is required"),
        ("data", "data field is required"),
    ],
)
def test_required_extras(drop: str, message: str) -> None:
    extras = bundled_extras()
    del extras[drop]
    with pytest.raises(AssertionError, match=message):
        skyrl_gym.make("text2sql", extras=extras)


def test_ground_truth_is_required() -> None:
    with pytest.raises(AssertionError, match="ground_truth is required in reward_spec field"):
        SQLEnv(None, {**bundled_extras(), "reward_spec": {"method": "rule"}})
    with pytest.raises(AssertionError, match="reward_spec field is required"):
        SQLEnv(None, None)


# ---------------------------------------------------------------- hostile model output


HOSTILE = {
    **hostile_actions(),
    "sql_100kb": "<think>x</think><sql>SELECT '" + "a" * 100_000 + "'</sql>",
    "many_open_sql_tags": "<sql>" * 20_000 + "</sql>",
    "many_close_then_open": "</sql>" * 10_000 + "<sql>" * 10_000,
    "surrogate": "<think>x</think><sql>SELECT '\ud800'</sql>",
    "nul": "<think>x</think><sql>SELECT 1\x00</sql>",
    "write": "<think>x</think><sql>DROP TABLE books</sql>",
    "two_statements": "<think>x</think><sql>SELECT 1; DELETE FROM books</sql>",
    "unclosed_solution": "<think>x</think><solution>SELECT 1",
    "nested_solution": "<think>x</think><solution><solution>SELECT 1</solution></solution>",
    "latin1ish": "<think>\xe9\xff\xfe</think><sql>SELECT '\x80\x81'</sql>",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_actions_never_raise(spider_root: Path, name: str) -> None:
    env = SQLEnv(Text2SQLEnvConfig(db_path=str(spider_root)), {**bundled_extras(), "data": "spider", "max_turns": 2})
    out = env.step(HOSTILE[name])
    assert isinstance(out["reward"], float)
    if out["done"]:
        assert out["observations"] == []
        assert out["reward"] in (-1.0, 0.0)
        return
    assert out["observations"][0]["content"].startswith("\n\n<observation>")
    out = env.step(solution_turn(COUNT_BOOKS))  # the database is intact and the episode still scores
    assert out["done"] is True
    assert out["reward"] in (1.0, -1.0)


def test_check_env() -> None:
    passed = check_env("text2sql")
    assert "final_observations" in passed
    assert "hostile_action[unbalanced_tags]" in passed
