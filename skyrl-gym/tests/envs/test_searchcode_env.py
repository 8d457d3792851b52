import json
import random
import re
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

import skyrl_gym
from skyrl_gym.checker import check_env, hostile_actions
from skyrl_gym.envs.searchcode.env import SearchCodeEnv, first_tag_pair
from skyrl_gym.retrieval import BM25Index, RetrievalServer, bundled_corpus_path, load_bundled_questions, read_corpus


@pytest.fixture(scope="module")
def server() -> Iterator[RetrievalServer]:
    with RetrievalServer(BM25Index.build(read_corpus(bundled_corpus_path()))) as running:
        yield running


@pytest.fixture
def env() -> Iterator[SearchCodeEnv]:
    made = make_env()
    yield made
    made.close()


def make_env(ground_truth: str = "42", max_turns: int = 3, env_config: Any = None) -> SearchCodeEnv:
    extras = {"reward_spec": {"ground_truth": ground_truth}, "max_turns": max_turns}
    made = skyrl_gym.make("searchcode", env_config=env_config, extras=extras)
    assert isinstance(made, SearchCodeEnv)
    return made


# --- construction and parsing ------------------------------------------------------------------------------------


def test_construction(env: SearchCodeEnv) -> None:
    assert (env.ground_truth, env.max_turns, env.turns, env.chat_history) == ("42", 3, 0, [])
    assert env.tool_to_toolgroup == {"search": "SearchToolGroup", "python": "PythonCodeExecutorToolGroup"}
    assert SearchCodeEnv(extras={"reward_spec": {"ground_truth": "1"}}).max_turns == 2


def test_required_extras_use_the_04_messages() -> None:
    with pytest.raises(AssertionError, match="reward_spec field is required"):
        SearchCodeEnv(extras={})
    with pytest.raises(AssertionError, match="ground_truth is required in reward_spec field"):
        SearchCodeEnv(extras={"reward_spec": {}})


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("<tool><search> capital of X </search></tool>", ("SearchToolGroup", "search", ["capital of X"])),
        (
            "think first <tool>\n<python>\nprint(1)\n</python>\n</tool>",
            ("PythonCodeExecutorToolGroup", "python", ["print(1)"]),
        ),
        (
            "<tool><python>a</python></tool><tool><search>b</search></tool>",
            ("PythonCodeExecutorToolGroup", "python", ["a"]),
        ),
        ("<tool><x>no</y><search>q</search></tool>", ("SearchToolGroup", "search", ["q"])),
    ],
)
def test_parse_action(env: SearchCodeEnv, action: str, expected: tuple[str, str, list[str]]) -> None:
    assert env._parse_action(action) == expected


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("no tool here", "No <tool>...</tool> block found in action string."),
        ("<tool><search>unclosed</tool>", "No valid inner tool tag found inside <tool> block."),
        ("<tool><sql>SELECT 1</sql></tool>", "Tool 'sql' not found in any registered tool group"),
    ],
)
def test_parse_errors(env: SearchCodeEnv, action: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        env._parse_action(action)


def test_first_tag_pair_agrees_with_the_regex_it_replaces() -> None:
    pattern = re.compile(r"<(\w+)>(.*?)</\1>", re.DOTALL)
    pieces = ["<a>", "</a>", "<b>", "</b>", "<ab>", "</ab>", "x", " ", "\n", "<", ">", "</", "<a", "é"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        match = pattern.search(text)
        assert first_tag_pair(text) == (match.groups() if match else None), text


def test_first_tag_pair_is_fast_on_hostile_input() -> None:
    hostile = "".join(f"<t{i}>" for i in range(50_000)) + "</t49999>"
    assert first_tag_pair(hostile) == ("t49999", "")


def test_is_done(env: SearchCodeEnv) -> None:
    assert env._is_done("<solution>#### 42</solution>")
    assert not env._is_done("<solution>#### 42")
    env.turns = 3
    assert env._is_done("anything")


# --- steps -------------------------------------------------------------------------------------------------------


def test_python_tool_call_runs_the_code(env: SearchCodeEnv) -> None:
    out = env.step("<tool><python>print(6 * 7)</python></tool>")
    assert (out["done"], out["reward"]) == (False, 0.0)
    assert out["observations"] == [{"role": "user", "content": "42"}]
    assert out["metadata"] == {
        "tool_group": "PythonCodeExecutorToolGroup",
        "tool_name": "python",
        "tool_input": ["print(6 * 7)"],
        "tools": [["search"], ["python"]],
    }
    final = env.step("The answer is <solution>#### 42</solution>")
    assert final == {"observations": [], "reward": 1.0, "done": True, "metadata": {}}
    assert [m["role"] for m in env.chat_history] == ["assistant", "user", "assistant"]


def test_python_errors_are_observations(env: SearchCodeEnv) -> None:
    out = env.step("<tool><python>1 / 0</python></tool>")
    content = out["observations"][0]["content"]
    assert content.startswith("Error executing Python code: ")
    assert "ZeroDivisionError" in content


def test_search_tool_call_against_the_real_server(server: RetrievalServer) -> None:
    question = next(q for q in load_bundled_questions() if q["hops"] == 1)
    env = make_env(env_config={"search_url": server.url, "log_requests": False})
    out = env.step(f"<tool><search>{question['question']}</search></tool>")
    result = json.loads(out["observations"][0]["content"])["result"]
    assert result.startswith("Doc 1: ")
    assert question["golden_answers"][0] in result
    assert out["metadata"]["tool_input"] == [question["question"]]


def test_search_uses_the_default_url_when_no_config_is_given(env: SearchCodeEnv) -> None:
    with mock.patch(
        "skyrl_gym.tools.search.call_search_api", return_value=({"result": [[{"contents": "A"}]]}, None)
    ) as api:
        out = env.step("<tool><search> q </search></tool>")
    assert api.call_args.kwargs["retrieval_service_url"] == "http://127.0.0.1:8000/retrieve"
    assert api.call_args.kwargs["query"] == "q"
    assert json.loads(out["observations"][0]["content"]) == {"result": "Doc 1: A\n"}


def test_parse_errors_become_the_observation(env: SearchCodeEnv) -> None:
    out = env.step("I will just talk.")
    assert out["observations"] == [{"role": "user", "content": "No <tool>...</tool> block found in action string."}]
    assert out["metadata"] == {
        "tool_group": None,
        "tool_name": None,
        "tool_input": "",
        "tools": [["search"], ["python"]],
    }


def test_reward_reads_the_whole_history(env: SearchCodeEnv) -> None:
    env.step("Working: #### 42 so far")
    out = env.step("<solution>done</solution>")
    assert out["reward"] == 1.0
    wrong = make_env(ground_truth="7")
    assert wrong.step("<solution>#### 42</solution>")["reward"] == 0.0
    unformatted = make_env(ground_truth="42")
    assert unformatted.step("<solution>42</solution>")["reward"] == 0.0


def test_max_turns_ends_the_episode() -> None:
    env = make_env(max_turns=1)
    out = env.step("<tool><python>print(1)</python></tool>")
    assert (out["done"], out["observations"], out["reward"]) == (True, [], 0.0)


@pytest.mark.parametrize("name", sorted(hostile_actions()))
def test_hostile_actions_never_raise(name: str) -> None:
    env = make_env(max_turns=5)
    with mock.patch("skyrl_gym.tools.search.call_search_api", return_value=({"result": []}, None)):
        for action in (hostile_actions()[name], f"<tool><search>{hostile_actions()[name]}</search></tool>"):
            out = env.step(action)
            assert out["done"] is False
    env.close()


def test_check_env() -> None:
    passed = check_env(
        "searchcode",
        prompt=[{"role": "user", "content": "What is 6 * 7? End with <solution>#### N</solution>."}],
        extras={"reward_spec": {"ground_truth": "42"}, "max_turns": 3},
        actions=["<tool><python>print(6 * 7)</python></tool>", "<solution>#### 42</solution>"],
    )
    assert "terminates" in passed
    assert "hostile_action[unbalanced_tags]" in passed


def test_check_env_with_the_sample_episode() -> None:
    with mock.patch("skyrl_gym.tools.search.call_search_api") as api:
        assert "final_observations" in check_env("searchcode")
    api.assert_not_called()
    sample = SearchCodeEnv.sample_episode()
    env = SearchCodeEnv(extras=sample.extras)
    env.init(sample.prompt)
    assert env.step(sample.actions[0])["observations"] == [{"role": "user", "content": "42"}]
    assert env.step(sample.actions[1])["reward"] == 1.0
