import json
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from omegaconf import OmegaConf

import skyrl_gym
import skyrl_gym.tools.search as search_module
from skyrl_gym.checker import check_env, hostile_actions
from skyrl_gym.envs.search.env import SearchEnv, SearchEnvConfig, first_block
from skyrl_gym.retrieval import BM25Index, RetrievalServer, bundled_corpus_path, load_bundled_questions, read_corpus


@pytest.fixture(scope="module")
def server() -> Iterator[RetrievalServer]:
    with RetrievalServer(BM25Index.build(read_corpus(bundled_corpus_path()))) as running:
        yield running


@pytest.fixture
def no_retry_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "MAX_RETRIES", 2)
    monkeypatch.setattr(search_module, "INITIAL_RETRY_DELAY", 0.0)


def make_env(target: Any = "Paris", max_turns: int = 3, **config: Any) -> SearchEnv:
    env_config = OmegaConf.create({"log_requests": False, **config})
    extras = {"reward_spec": {"method": "rule", "ground_truth": {"target": target}}, "max_turns": max_turns}
    env = skyrl_gym.make("search", env_config=env_config, extras=extras)
    assert isinstance(env, SearchEnv)
    return env


def information(observation: str) -> str:
    assert observation.startswith("\n<information>")
    assert observation.endswith("</information>\n")
    return str(json.loads(observation[len("\n<information>") : -len("</information>\n")])["result"])


# --- construction ------------------------------------------------------------------------------------------------


def test_construction_reads_extras_and_config() -> None:
    env = make_env(target="Kel", max_turns=5, search_url="http://host:1/retrieve", topk=7, timeout=9)
    assert env.ground_truth == {"target": "Kel"}
    assert (env.max_turns, env.turns, env.chat_history) == (5, 0, [])
    assert env.tool_group.get_name() == "SearchToolGroup"
    assert env.tool_group.get_tool_names() == ["search"]
    assert (env.tool_group.search_url, env.tool_group.topk, env.tool_group.timeout) == ("http://host:1/retrieve", 7, 9)
    assert env.tool_group.log_requests is False


@pytest.mark.parametrize("env_config", [None, SearchEnvConfig(), {}, OmegaConf.create({"topk": 3})])
def test_config_may_be_omitted_or_partial(env_config: Any) -> None:
    env = SearchEnv(env_config, extras={"reward_spec": {"ground_truth": {"target": "x"}}})
    assert env.max_turns == 2
    assert (env.tool_group.search_url, env.tool_group.topk, env.tool_group.timeout) == (
        "http://127.0.0.1:8000/retrieve",
        3,
        30,
    )


def test_required_extras_use_the_04_messages() -> None:
    with pytest.raises(AssertionError, match="reward_spec field is required"):
        skyrl_gym.make("search", extras={"max_turns": 3})
    with pytest.raises(AssertionError, match="ground_truth is required in reward_spec field"):
        skyrl_gym.make("search", extras={"reward_spec": {"method": "rule"}})


# --- parsing and termination -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("<search>Who founded Tadath Academy?</search>", ["Who founded Tadath Academy?"]),
        ("<search>  spaced  </search>", ["  spaced  "]),
        ("<search>two\nlines</search>", ["two\nlines"]),
        ("plain text", [None]),
        ("<search>unclosed", [None]),
        ("</search> before <search>", [None]),
        ("<search></search>", [""]),
        ("<search>first</search> <search>second</search>", ["first"]),
        ("<search>q</search> <answer>a</answer>", ["q"]),
    ],
)
def test_parse_action(action: str, expected: list[str | None]) -> None:
    assert make_env()._parse_action(action) == expected


def test_first_block_is_linear_on_hostile_input() -> None:
    assert first_block("<search>" * 200_000, "<search>", "</search>") is None


@pytest.mark.parametrize(
    ("action", "turns", "max_turns", "done"),
    [
        ("<answer>x</answer>", 1, 3, True),
        ("<search>q</search>", 1, 3, False),
        ("<search>q</search>", 3, 3, True),
        ("text", 2, 3, False),
        ("<search>q</search> <answer>a</answer>", 1, 3, True),
        ("</answer><answer>", 1, 3, True),
        ("<answer>no close", 1, 3, False),
    ],
)
def test_is_done(action: str, turns: int, max_turns: int, done: bool) -> None:
    env = make_env(max_turns=max_turns)
    env.turns = turns
    assert env._is_done(action) is done


# --- rewards -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "target", "reward", "done"),
    [
        ("<answer>Paris</answer>", "Paris", 1.0, True),
        ("<answer>  the paris. </answer>", ["Lyon", "Paris"], 1.0, True),
        ("<answer>Lyon</answer>", "Paris", 0.0, True),
        ("<answer>Paris</answer>", "The Paris", 1.0, True),
        ("no tags at all", "Paris", 0.0, False),
    ],
)
def test_reward_on_the_first_step(action: str, target: Any, reward: float, done: bool) -> None:
    out = make_env(target=target).step(action)
    assert (out["reward"], out["done"]) == (reward, done)


def test_reward_uses_the_last_answer_in_the_whole_history() -> None:
    env = make_env(target="Paris", max_turns=2)
    env.step("I think <answer>Paris</answer> is wrong")  # done immediately: the answer is in the action
    assert env.turns == 1
    env = make_env(target="Paris", max_turns=2)
    with mock.patch("skyrl_gym.tools.search.call_search_api", return_value=({"result": []}, None)):
        env.step("<search>capital</search>")
    out = env.step("still thinking")  # max turns reached without an answer
    assert (out["done"], out["reward"], out["observations"]) == (True, 0.0, [])


# --- against the real retrieval server over the bundled corpus ---------------------------------------------------


def test_episode_end_to_end_with_the_real_server(server: RetrievalServer) -> None:
    question = next(q for q in load_bundled_questions() if q["hops"] == 1)
    env = make_env(target=question["golden_answers"], search_url=server.url, topk=3)
    prompt = [{"role": "user", "content": question["question"]}]
    assert env.init(prompt) == (prompt, {})

    first = env.step(f"<search>{question['question']}</search>")
    assert (first["done"], first["reward"]) == (False, 0.0)
    (message,) = first["observations"]
    assert message["role"] == "user"
    passages = information(message["content"])
    assert passages.startswith("Doc 1: ")
    assert question["golden_answers"][0] in passages
    assert first["metadata"] == {
        "tool_group": "SearchToolGroup",
        "tool_name": "search",
        "tool_input": [question["question"]],
    }

    final = env.step(f"<think>found it</think><answer>{question['golden_answers'][0]}</answer>")
    assert final == {"observations": [], "reward": 1.0, "done": True, "metadata": {}}
    assert [m["role"] for m in env.chat_history] == ["assistant", "user", "assistant"]


def test_two_hop_episode_with_the_real_server(server: RetrievalServer) -> None:
    question = next(q for q in load_bundled_questions() if q["hops"] == 2)
    env = make_env(target=question["golden_answers"], search_url=server.url, max_turns=4)
    step = env.step(f"<search>{question['question']}</search>")
    assert not step["done"]
    step = env.step("<search>a follow-up query</search>")
    assert not step["done"]
    final = env.step(f"<answer>{question['golden_answers'][0]}</answer>")
    assert final["reward"] == 1.0


def test_no_results_and_wrong_answer(server: RetrievalServer) -> None:
    env = make_env(target="Paris", search_url=server.url)
    out = env.step("<search>the of and</search>")
    assert information(out["observations"][0]["content"]) == "No search results found."
    assert env.step("<answer>London</answer>")["reward"] == 0.0


def test_action_without_a_query_gets_empty_information_and_no_request() -> None:
    with mock.patch("skyrl_gym.tools.search.call_search_api") as api:
        out = make_env().step("<search>unclosed query")
    api.assert_not_called()
    assert out["observations"] == [{"role": "user", "content": "\n<information></information>\n"}]
    assert out["metadata"]["tool_input"] == [None]


@pytest.mark.usefixtures("no_retry_wait")
def test_unreachable_service_becomes_a_search_error_observation() -> None:
    env = make_env(search_url="http://127.0.0.1:9/retrieve")
    out = env.step("<search>anything</search>")
    assert information(out["observations"][0]["content"]).startswith("Search error: ")
    assert out["done"] is False


def test_mocked_api_results_and_errors_reach_the_observation() -> None:
    # The signature 0.4-era tests give their fake: every parameter of call_search_api, with its default.
    def fake(
        retrieval_service_url: str,
        query: str,
        topk: int = 3,
        return_scores: bool = True,
        timeout: float = 30,
        log_requests: bool = True,
        session: Any = None,
    ) -> tuple[Any, str | None]:
        if query == "timeout_query":
            return None, "Timeout Error: Request timed out"
        return {"result": [[{"document": {"contents": "Emmanuel Macron is the President."}}]]}, None

    with mock.patch("skyrl_gym.tools.search.call_search_api", side_effect=fake) as api:
        env = make_env(target="Emmanuel Macron")
        out = env.step("<search>Who is the president of France?</search>")
        assert "Emmanuel Macron" in out["observations"][0]["content"]
        assert api.call_args.kwargs["query"] == "Who is the president of France?"
        assert api.call_args.kwargs["topk"] == 3
        out = env.step("<search>timeout_query</search>")
        assert "Search error: Timeout Error" in out["observations"][0]["content"]
        assert env.step("<answer>Emmanuel Macron</answer>")["reward"] == 1.0


def test_tool_exceptions_become_the_observation() -> None:
    env = make_env()
    with mock.patch.object(env.tool_group, "execute_tool", side_effect=RuntimeError("Tool execution failed")):
        out = env.step("<search>q</search>")
    assert (out["done"], out["reward"]) == (False, 0.0)
    assert out["observations"] == [{"role": "user", "content": "Tool execution failed"}]
    assert env.chat_history[-1] == out["observations"][0]


@pytest.mark.parametrize("name", sorted(hostile_actions()))
def test_hostile_actions_never_raise(name: str, server: RetrievalServer) -> None:
    env = make_env(search_url=server.url, max_turns=5)
    out = env.step(hostile_actions()[name])
    assert isinstance(out["reward"], float)
    assert env.step("<search>" + hostile_actions()[name] + "</search>")["done"] is False


def test_check_env_with_the_real_server(server: RetrievalServer) -> None:
    question = load_bundled_questions()[0]
    passed = check_env(
        "search",
        prompt=[{"role": "user", "content": question["question"]}],
        extras={"reward_spec": {"ground_truth": {"target": question["golden_answers"]}}, "max_turns": 3},
        env_config={"search_url": server.url, "log_requests": False},
        actions=[f"<search>{question['question']}</search>", f"<answer>{question['golden_answers'][0]}</answer>"],
    )
    assert "terminates" in passed
    assert "hostile_action[unbalanced_tags]" in passed


def test_check_env_with_the_sample_episode_needs_no_server() -> None:
    with mock.patch("skyrl_gym.tools.search.call_search_api") as api:
        assert "final_observations" in check_env("search")
    api.assert_not_called()
    sample = SearchEnv.sample_episode()
    env = SearchEnv(sample.env_config, extras=sample.extras)
    env.init(sample.prompt)
    assert env.step(sample.actions[0])["reward"] == 1.0
