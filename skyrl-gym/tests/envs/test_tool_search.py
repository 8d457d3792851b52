import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock

import pytest
import requests

import skyrl_gym.tools.search as search_module
from skyrl_gym.retrieval import BM25Index, RetrievalServer
from skyrl_gym.tools import SearchToolGroup
from skyrl_gym.tools.search import call_search_api, format_search_response

DOCS = [
    {"id": "0", "contents": '"Ovel River"\nThe Ovel River flows into the Grey Sea.'},
    {"id": "1", "contents": '"Grey Sea"\nThe Grey Sea is cold.'},
    {"id": "2", "contents": '"Mount Kel"\nMount Kel is 3000 metres high.'},
]


@pytest.fixture(scope="module")
def server() -> Iterator[RetrievalServer]:
    with RetrievalServer(BM25Index.build(DOCS)) as running:
        yield running


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "MAX_RETRIES", 4)
    monkeypatch.setattr(search_module, "INITIAL_RETRY_DELAY", 0.01)


def failure(url: str, **kwargs: Any) -> str:
    """The error message of a call_search_api call that must fail."""
    body, error = call_search_api(retrieval_service_url=url, query="Ovel", log_requests=False, **kwargs)
    assert body is None
    assert error is not None
    return error


def result_of(tool_output: str) -> str:
    parsed = json.loads(tool_output)
    assert set(parsed) == {"result"}
    return str(parsed["result"])


class FlakyServer:
    """A real HTTP server that answers the first ``failures`` POSTs with ``status``, then a fixed result."""

    def __init__(self, failures: int, status: int = 503, body: bytes | None = None) -> None:
        self.attempts = 0
        self.payloads: list[Any] = []
        outer = self
        ok_body = body or json.dumps({"result": [[{"document": DOCS[0], "score": 1.0}]]}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.payloads.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                outer.attempts += 1
                failing = outer.attempts <= failures
                data = b'{"error": "busy"}' if failing else ok_body
                self.send_response(status if failing else 200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"

    def __enter__(self) -> "FlakyServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


# --- against the real retrieval server ---------------------------------------------------------------------------


def test_group_name_tools_and_attributes() -> None:
    group = SearchToolGroup(search_url="http://example.invalid/retrieve", topk=5, timeout=7, log_requests=False)
    assert group.get_name() == "SearchToolGroup"
    assert group.get_tool_names() == ["search"]
    assert (group.search_url, group.topk, group.timeout, group.log_requests) == (
        "http://example.invalid/retrieve",
        5,
        7,
        False,
    )
    default = SearchToolGroup()
    assert (default.search_url, default.topk, default.timeout, default.log_requests) == (
        "http://127.0.0.1:8000/retrieve",
        3,
        30,
        True,
    )


def test_search_formats_passages_from_the_real_server(server: RetrievalServer) -> None:
    group = SearchToolGroup(search_url=server.url, topk=2, log_requests=False)
    text = result_of(group.execute_tool("search", "  Ovel River, Grey Sea  "))
    assert text == f"Doc 1: {DOCS[0]['contents']}\nDoc 2: {DOCS[1]['contents']}\n"


def test_search_without_results(server: RetrievalServer) -> None:
    group = SearchToolGroup(search_url=server.url, log_requests=False)
    assert result_of(group.search("zebra")) == "No search results found."


def test_none_query_returns_empty_string_without_a_request() -> None:
    with mock.patch("skyrl_gym.tools.search.call_search_api") as api:
        assert SearchToolGroup().search(None) == ""
    api.assert_not_called()


def test_call_search_api_against_the_real_server(server: RetrievalServer) -> None:
    body, error = call_search_api(retrieval_service_url=server.url, query="Mount Kel", topk=1, log_requests=False)
    assert error is None
    assert body is not None
    assert body["result"][0][0]["document"] == DOCS[2]
    assert body["result"][0][0]["score"] > 0


def test_sessions_are_shared_per_service() -> None:
    a = SearchToolGroup._session_for("http://127.0.0.1:9/retrieve")
    assert SearchToolGroup._session_for("http://127.0.0.1:9/other") is a
    assert SearchToolGroup._session_for("http://127.0.0.1:10/retrieve") is not a


def test_concurrent_searches_share_the_session(server: RetrievalServer) -> None:
    group = SearchToolGroup(search_url=server.url, topk=1, log_requests=False)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(result_of(group.search("Grey Sea")))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [f"Doc 1: {DOCS[1]['contents']}\n"] * 8


# --- mocking the API, as code written for skyrl-gym 0.4 does -----------------------------------------------------


def test_patching_call_search_api_replaces_the_http_call() -> None:
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
        return {"result": [[{"document": {"contents": f"about {query}"}}]]}, None

    with mock.patch("skyrl_gym.tools.search.call_search_api", side_effect=fake) as api:
        text = result_of(SearchToolGroup(topk=4, timeout=9).search(" Kel "))
    assert text == "Doc 1: about Kel\n"
    kwargs = api.call_args.kwargs
    assert api.call_args.args == ()
    assert kwargs["query"] == "Kel"
    assert (kwargs["retrieval_service_url"], kwargs["topk"], kwargs["timeout"]) == (
        "http://127.0.0.1:8000/retrieve",
        4,
        9,
    )
    assert kwargs["log_requests"] is True
    assert isinstance(kwargs["session"], requests.Session)


@pytest.mark.parametrize(
    ("api_result", "expected"),
    [
        ((None, "Timeout Error: Request timed out"), "Search error: Timeout Error: Request timed out"),
        (({"result": []}, None), "No search results found."),
        (({"result": [[]]}, None), "No search results found."),
        (({"unexpected": 1}, None), "No search results found."),
        (({"result": "oops"}, None), "Search error: unexpected response"),
        (([1, 2], None), "Search error: unexpected response"),
        (({"result": [[{"document": {}}]]}, None), "Search error: unexpected response"),
        ((None, None), "Search error:"),
    ],
)
def test_tool_output_for_every_api_outcome(api_result: tuple[Any, Any], expected: str) -> None:
    with mock.patch("skyrl_gym.tools.search.call_search_api", return_value=api_result):
        assert result_of(SearchToolGroup().search("q")).startswith(expected)


def test_format_accepts_documents_with_or_without_scores_and_joins_queries() -> None:
    response = {
        "result": [
            [{"document": {"id": "1", "contents": "A"}, "score": 2.0}, {"document": {"contents": "B"}, "score": 1.0}],
            [{"id": "3", "contents": "C"}],
        ]
    }
    assert format_search_response(response) == "Doc 1: A\nDoc 2: B\n\n---\nDoc 1: C\n"


# --- retries against real servers -------------------------------------------------------------------------------


@pytest.mark.usefixtures("fast_retries")
def test_retries_transient_errors_until_the_server_recovers() -> None:
    with FlakyServer(failures=2, status=503) as flaky:
        text = result_of(SearchToolGroup(search_url=flaky.url, log_requests=False).search("Ovel"))
    assert flaky.attempts == 3
    assert text == f"Doc 1: {DOCS[0]['contents']}\n"
    assert flaky.payloads[0] == {"query": "Ovel", "topk": 3, "return_scores": True}


@pytest.mark.usefixtures("fast_retries")
def test_gives_up_after_max_retries() -> None:
    with FlakyServer(failures=100, status=502) as flaky:
        error = failure(flaky.url)
    assert flaky.attempts == 4
    assert "4 attempts" in error
    assert "502" in error


@pytest.mark.usefixtures("fast_retries")
def test_client_errors_are_not_retried() -> None:
    with FlakyServer(failures=100, status=400) as flaky:
        error = failure(flaky.url)
    assert flaky.attempts == 1
    assert "HTTP 400" in error
    assert "busy" in error


@pytest.mark.usefixtures("fast_retries")
def test_a_body_that_is_not_json_is_an_error() -> None:
    with FlakyServer(failures=0, body=b"<html>") as flaky:
        error = failure(flaky.url)
    assert "not JSON" in error


@pytest.mark.usefixtures("fast_retries")
def test_connection_refused_is_retried_then_reported() -> None:
    with FlakyServer(failures=0) as gone:
        url = gone.url  # a port that was just free: nothing listens on it after the server closes
    error = failure(url)
    assert "4 attempts" in error
    assert "ConnectionError" in error
    assert result_of(SearchToolGroup(search_url=url).search("Ovel")).startswith("Search error: ")


def test_an_invalid_url_is_reported_without_retrying() -> None:
    assert failure("not a url").startswith("Request failed")


@pytest.mark.usefixtures("fast_retries")
def test_timeouts_are_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    def slow(url: str, json: Any, timeout: float) -> requests.Response:
        calls.append(timeout)
        raise requests.ReadTimeout("read timed out")

    monkeypatch.setattr(requests, "post", slow)
    assert "ReadTimeout" in failure("http://x/retrieve", timeout=3)
    assert calls == [3, 3, 3, 3]
