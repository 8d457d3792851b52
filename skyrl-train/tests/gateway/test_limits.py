"""What a hostile client of a session can make the gateway do: big bodies, its own template, requests for many rows.

Each test is an attack a policy can make through its harness's OpenAI client; the gateway must answer it with a
clear 4xx (or serve it off the event loop) and keep serving everyone else.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from skyrl_train.gateway.errors import SessionLimitError
from skyrl_train.gateway.limits import SessionBudget, text_chars


def post(url: str, body: bytes | dict[str, Any], timeout: float = 120) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get_models(url: str, timeout: float = 120) -> int:
    with urllib.request.urlopen(url + "/v1/models", timeout=timeout) as answer:
        return int(answer.status)


def test_rendering_runs_off_the_event_loop(serve, make_engine, tokenizer: PreTrainedTokenizerBase) -> None:
    """While one request's template is rendered (held here until a liveness check is answered), others are served."""
    served = serve(make_engine(tokenizer), tokenizer)
    gateway = served.gateway
    handle = gateway.open_session()
    rendering, release = threading.Event(), threading.Event()
    render = gateway.renderer.full_ids

    def slow_render(conversation: Any) -> list[int]:
        rendering.set()
        release.wait(30)  # a slow template or a huge message: the loop must not be the one waiting
        return render(conversation)

    gateway.renderer.full_ids = slow_render  # type: ignore[method-assign]
    answer: dict[str, Any] = {}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    sender = threading.Thread(target=lambda: answer.update(status=post(handle.base_url + "/chat/completions", body)[0]))
    sender.start()
    try:
        assert rendering.wait(30)
        assert get_models(gateway.url, timeout=10) == 200  # answered while the render is held
    finally:
        release.set()
        sender.join(60)
    assert answer["status"] == 200


def test_a_thirty_megabyte_body_is_refused_at_once(serve, make_engine, tokenizer: PreTrainedTokenizerBase) -> None:
    served = serve(make_engine(tokenizer), tokenizer)
    handle = served.gateway.open_session()
    body = {"messages": [{"role": "user", "content": "x" * (30 * 2**20)}]}
    status, answer = post(handle.base_url + "/chat/completions", body)
    assert status == 413
    assert "GatewayConfig.max_body_bytes" in answer["error"]["message"]
    assert get_models(served.gateway.url) == 200
    assert served.gateway.session(handle.session_id).samples() == []


def test_text_over_the_character_cap_is_refused_before_rendering(
    serve, make_engine, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer)
    served = serve(engine, tokenizer, max_prompt_chars=1000)
    handle = served.gateway.open_session()
    tools = [{"type": "function", "function": {"name": "f" * 600, "parameters": {"type": "object"}}}]
    cases = [
        {"messages": [{"role": "user", "content": "y" * 1001}]},
        {"messages": [{"role": "user", "content": "hi"}], "tools": tools * 2},  # every string counts
    ]
    for body in cases:
        status, answer = post(handle.base_url + "/chat/completions", body)
        assert status == 413
        assert "GatewayConfig.max_prompt_chars" in answer["error"]["message"]
    status, _ = post(handle.base_url + "/completions", {"prompt": "z" * 1001})
    assert status == 413
    assert engine.prompts == []  # nothing reached the engine


def test_a_request_cannot_bring_its_own_template(serve, make_engine, tokenizer: PreTrainedTokenizerBase) -> None:
    engine = make_engine(tokenizer)
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    url = handle.base_url + "/chat/completions"
    hi = [{"role": "user", "content": "hi"}]
    looping = "{% for i in range(10**12) %}x{% endfor %}"
    for options in ({"chat_template": looping}, {"chat_template": "{{ 'owned' }}"}, {"custom_flag": True}):
        status, answer = post(url, {"messages": hi, "chat_template_kwargs": options})
        assert status == 400, options
        assert answer["error"]["param"] == "chat_template_kwargs"
        assert "GatewayConfig.template_kwargs" in answer["error"]["message"]
    status, _ = post(url, {"messages": hi, "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200
    assert len(engine.prompts) == 1


def test_one_request_cannot_record_a_thousand_rows(serve, make_engine, tokenizer: PreTrainedTokenizerBase) -> None:
    engine = make_engine(tokenizer, default=[5, 6])
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    body = {"prompt": [[7, 8, 9]] * 64, "n": 16, "max_tokens": 2}
    status, answer = post(handle.base_url + "/completions", body)
    assert status == 413
    assert "GatewayConfig.max_samples_per_request" in answer["error"]["message"]
    assert engine.prompts == []
    status, _ = post(handle.base_url + "/completions", {"prompt": [[7, 8, 9]] * 4, "n": 16, "max_tokens": 2})
    assert status == 200  # 64 samples: at the cap
    assert len(served.gateway.close_session(handle.session_id)) == 64


def test_request_tokens_are_capped(serve, make_engine, tokenizer: PreTrainedTokenizerBase) -> None:
    served = serve(make_engine(tokenizer), tokenizer, max_request_tokens=40)
    handle = served.gateway.open_session()
    status, answer = post(handle.base_url + "/completions", {"prompt": [[7] * 10], "n": 4, "max_tokens": 8})
    assert status == 413  # 4 × (10 + 8) = 72 tokens
    assert "GatewayConfig.max_request_tokens" in answer["error"]["message"]
    assert post(handle.base_url + "/completions", {"prompt": [[7] * 10], "n": 2, "max_tokens": 8})[0] == 200


def test_a_session_has_a_budget_of_requests_samples_and_tokens(
    serve, make_engine, tokenizer: PreTrainedTokenizerBase
) -> None:
    served = serve(make_engine(tokenizer), tokenizer, max_session_requests=3, max_session_samples=5)
    gateway = served.gateway
    first, second = gateway.open_session(), gateway.open_session()
    url = first.base_url + "/chat/completions"
    hi = [{"role": "user", "content": "hi"}]
    assert post(url, {"messages": hi, "n": 2})[0] == 200
    assert post(url, {"messages": hi, "n": 2})[0] == 200
    status, answer = post(url, {"messages": hi, "n": 2})  # 6 samples > 5
    assert status == 429
    assert answer["error"]["code"] == "session_limit"
    assert "GatewayConfig.max_session_samples" in answer["error"]["message"]
    assert post(url, {"messages": hi})[0] == 200  # 5 samples, 3 requests: at both caps
    status, answer = post(url, {"messages": hi})
    assert status == 429
    assert "GatewayConfig.max_session_requests" in answer["error"]["message"]
    assert post(second.base_url + "/chat/completions", {"messages": hi})[0] == 200  # other sessions unaffected
    assert len(gateway.close_session(first.session_id)) == 5


def test_budget_refuses_a_request_whole() -> None:
    class Caps:
        max_session_requests, max_session_samples, max_session_tokens = 10, 10, 100

    budget = SessionBudget()
    budget.admit(4, 60, Caps())  # type: ignore[arg-type]
    with pytest.raises(SessionLimitError, match="max_session_tokens"):
        budget.admit(4, 50, Caps())  # type: ignore[arg-type]
    assert (budget.requests, budget.samples, budget.tokens) == (1, 4, 60)  # nothing charged for the refused one


def test_text_chars_counts_every_string() -> None:
    assert text_chars({"ab": ["cde", {"f": "gh"}, 3, None]}) == 8
    assert text_chars([[[[[[[["deep"]]]]]]]] * 3) == 12
