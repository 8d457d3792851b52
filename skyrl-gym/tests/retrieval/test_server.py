import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from skyrl_gym.retrieval import BM25Index, RetrievalServer
from skyrl_gym.retrieval.server import MAX_BODY_BYTES, BadRequest, parse_retrieve_request

DOCS = [
    {"id": "ovel", "contents": '"Ovel River"\nThe Ovel River flows into the Grey Sea.'},
    {"id": "grey", "contents": '"Grey Sea"\nThe Grey Sea is cold. The Ovel and the Tarn flow into the Grey Sea.'},
    {"id": "tarn", "contents": '"Tarn River"\nThe Tarn River rises on Mount Kel.'},
    {"id": "kel", "contents": '"Mount Kel"\nMount Kel is 3000 metres high.'},
]


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index.build(DOCS)


@pytest.fixture(scope="module")
def server(index: BM25Index) -> Iterator[RetrievalServer]:
    with RetrievalServer(index, port=0, default_topk=2) as running:
        yield running


def post(server: RetrievalServer, payload: Any) -> requests.Response:
    return requests.post(server.url, json=payload, timeout=10)


def test_health(server: RetrievalServer) -> None:
    response = requests.get(f"{server.base_url}/health", timeout=10)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "num_documents": 4}


def test_single_query_with_scores_matches_the_index(server: RetrievalServer, index: BM25Index) -> None:
    response = post(server, {"query": "Tarn River", "topk": 3, "return_scores": True})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    (hits,) = response.json()["result"]
    expected = index.search("Tarn River", 3)
    assert [h["document"]["id"] for h in hits] == [DOCS[e.row]["id"] for e in expected]
    assert [h["score"] for h in hits] == pytest.approx([e.score for e in expected])
    assert hits[0]["document"] == DOCS[2]
    assert hits[0]["score"] > hits[-1]["score"] > 0


def test_without_return_scores_hits_are_bare_documents(server: RetrievalServer) -> None:
    (hits,) = post(server, {"query": "Mount Kel"}).json()["result"]
    assert hits[0] == DOCS[3]
    assert all(set(hit) == {"id", "contents"} for hit in hits)


def test_batch_queries_get_one_list_each_in_order(server: RetrievalServer) -> None:
    body = post(server, {"queries": ["Mount Kel", "Grey Sea", "unknown words"], "topk": 1}).json()
    assert [[hit["id"] for hit in hits] for hits in body["result"]] == [["kel"], ["grey"], []]


def test_default_topk_is_the_servers(server: RetrievalServer) -> None:
    (hits,) = post(server, {"query": "Ovel Tarn Grey Kel river sea"}).json()["result"]
    assert len(hits) == 2


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([1, 2], "JSON object"),
        ({}, "exactly one of"),
        ({"query": "a", "queries": ["b"]}, "exactly one of"),
        ({"query": 3}, '"query" must be a string'),
        ({"queries": "abc"}, '"queries" must be a list'),
        ({"queries": ["a", 1]}, '"queries" must be a list'),
        ({"query": "a", "topk": 0}, '"topk"'),
        ({"query": "a", "topk": "3"}, '"topk"'),
        ({"query": "a", "topk": True}, '"topk"'),
        ({"query": "a", "topk": 10**6}, '"topk"'),
        ({"query": "a", "return_scores": "yes"}, '"return_scores"'),
    ],
)
def test_malformed_requests_get_400_with_the_reason(server: RetrievalServer, payload: Any, message: str) -> None:
    response = post(server, payload)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_invalid_json_gets_400(server: RetrievalServer) -> None:
    response = requests.post(server.url, data=b"{not json", timeout=10)
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]


def test_unknown_paths_get_404(server: RetrievalServer) -> None:
    assert requests.get(f"{server.base_url}/retrieve", timeout=10).status_code == 404
    assert requests.post(f"{server.base_url}/search", json={"query": "a"}, timeout=10).status_code == 404


def test_oversized_and_unsized_bodies_are_refused_without_reading_them(server: RetrievalServer) -> None:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    connection.putrequest("POST", "/retrieve")
    connection.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    assert response.getheader("Connection") == "close"
    connection.close()
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    connection.putrequest("POST", "/retrieve")
    connection.endheaders()
    assert connection.getresponse().status == 411
    connection.close()


def test_a_kept_alive_connection_serves_many_requests(server: RetrievalServer) -> None:
    with requests.Session() as session:
        for payload in ({"query": "Kel"}, {"query": 1}, {"query": "Ovel"}):
            session.post(server.url, json=payload, timeout=10)
        assert session.post(server.url, json={"query": "Ovel", "topk": 1}, timeout=10).json()["result"][0][0] == DOCS[0]


def test_concurrent_requests(server: RetrievalServer) -> None:
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with requests.Session() as session:
                for _ in range(10):
                    hits = session.post(server.url, json={"query": "Mount Kel", "topk": 1}, timeout=10).json()
                    assert hits["result"][0][0]["id"] == "kel"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def request_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if "process_request_thread" in t.name}


def test_stop_closes_kept_alive_connections_and_is_idempotent(index: BM25Index) -> None:
    before = request_threads()
    server = RetrievalServer(index, port=0).start()
    session = requests.Session()  # keeps its connection open, so a handler thread waits on it
    assert session.post(server.url, json={"query": "Kel"}, timeout=10).status_code == 200
    handlers = request_threads() - before
    assert handlers
    server.stop()
    server.stop()
    for thread in handlers:
        thread.join(timeout=5)
        assert not thread.is_alive()
    with pytest.raises(requests.ConnectionError):
        session.post(server.url, json={"query": "Kel"}, timeout=2)
    session.close()


def test_port_zero_picks_a_free_port_and_url_is_ready_to_use(index: BM25Index) -> None:
    with RetrievalServer(index) as first, RetrievalServer(index) as second:
        assert first.port != second.port
        assert first.url == f"http://127.0.0.1:{first.port}/retrieve"


def test_binding_a_busy_port_fails_clearly(index: BM25Index) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError, match="in use"):
            RetrievalServer(index, port=busy.getsockname()[1])


def test_wildcard_host_is_reported_as_loopback(index: BM25Index) -> None:
    server = RetrievalServer(index, host="0.0.0.0")
    try:
        assert server.base_url == f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def test_parse_retrieve_request_defaults() -> None:
    assert parse_retrieve_request(json.dumps({"query": "x"}).encode(), 5) == (["x"], 5, False)
    assert parse_retrieve_request(b'{"queries": [], "topk": 2, "return_scores": true}', 5) == ([], 2, True)
    with pytest.raises(BadRequest):
        parse_retrieve_request(b"\xff\xfe", 5)
