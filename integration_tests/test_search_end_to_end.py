"""The search env against a retrieval server running as a separate process, over the bundled corpus.

Builds the BM25 index with the library, starts ``python -m skyrl_gym.retrieval serve`` (what
``skyrl-gym serve-retriever`` runs) on a free port, waits for ``/health``, plays scripted episodes for bundled
questions and checks their rewards, then stops the server with SIGTERM and checks that it exits cleanly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

import skyrl_gym
from skyrl_gym.retrieval import build_index, bundled_corpus_path, load_bundled_questions

STARTUP_TIMEOUT_S = 30.0


def _wait_for_health(process: subprocess.Popen[str], base_url: str) -> dict[str, Any]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the retrieval server exited early with status {process.returncode}")
        try:
            response = requests.get(f"{base_url}/health", timeout=1)
            if response.status_code == 200:
                health: dict[str, Any] = response.json()
                return health
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the retrieval server did not become healthy within {STARTUP_TIMEOUT_S}s")


@pytest.fixture(scope="module")
def retrieval_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    index_dir = tmp_path_factory.mktemp("bm25-index")
    index = build_index(bundled_corpus_path(), index_dir)
    command = [sys.executable, "-m", "skyrl_gym.retrieval", "serve", "--index", str(index_dir), "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()  # "Serving N documents at http://127.0.0.1:PORT/retrieve (...)"
        assert " at http://" in banner, f"unexpected first line from the retrieval server: {banner!r}"
        url = banner.split(" at ", 1)[1].split()[0]
        base_url = url.removesuffix("/retrieve")
        assert _wait_for_health(process, base_url) == {"status": "ok", "num_documents": index.num_documents}
        yield url
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0, "the retrieval server did not exit cleanly on SIGTERM"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        _, stderr = process.communicate()
        assert "Traceback" not in stderr, stderr


def _play(url: str, question: dict[str, Any], actions: list[str]) -> tuple[float, list[dict[str, str]]]:
    """Run one episode of scripted actions; return the final reward and the observations seen."""
    env = skyrl_gym.make(
        "search",
        env_config={"search_url": url, "topk": 3, "timeout": 10, "log_requests": False},
        extras={"reward_spec": {"ground_truth": {"target": question["golden_answers"]}}, "max_turns": len(actions)},
    )
    prompt = [{"role": "user", "content": question["question"]}]
    env.init(prompt)
    seen: list[dict[str, str]] = []
    with env:
        for action in actions:
            out = env.step(action)
            seen.extend(out["observations"])
            if out["done"]:
                return float(out["reward"]), seen
    raise AssertionError("the episode did not end")


def _passages(observation: dict[str, str]) -> str:
    content = observation["content"]
    assert content.startswith("\n<information>")
    assert content.endswith("</information>\n")
    return str(json.loads(content[len("\n<information>") : -len("</information>\n")])["result"])


def test_single_hop_questions_are_answered_from_retrieved_passages(retrieval_url: str) -> None:
    questions = [q for q in load_bundled_questions() if q["hops"] == 1][:5]
    for question in questions:
        reward, seen = _play(
            retrieval_url,
            question,
            [f"<search>{question['question']}</search>", f"<answer>{question['golden_answers'][0]}</answer>"],
        )
        assert reward == 1.0
        (observation,) = seen
        assert question["golden_answers"][0] in _passages(observation), question


def test_two_hop_question_with_two_searches(retrieval_url: str) -> None:
    question = next(q for q in load_bundled_questions() if q["hops"] == 2)
    reward, seen = _play(
        retrieval_url,
        question,
        [
            f"<search>{question['question']}</search>",
            "<search>second hop</search>",
            f"<think>combining both passages</think> <answer>{question['golden_answers'][-1]}</answer>",
        ],
    )
    assert reward == 1.0
    assert len(seen) == 2
    assert all(_passages(o).startswith(("Doc 1: ", "No search results")) for o in seen)


def test_wrong_and_missing_answers_score_zero(retrieval_url: str) -> None:
    question = load_bundled_questions()[0]
    wrong, _ = _play(retrieval_url, question, [f"<search>{question['question']}</search>", "<answer>Atlantis</answer>"])
    assert wrong == 0.0
    missing, _ = _play(retrieval_url, question, ["<search>first</search>", "<search>out of turns</search>"])
    assert missing == 0.0
