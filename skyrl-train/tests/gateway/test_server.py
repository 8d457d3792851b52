"""The gateway over HTTP, with the official openai client, in front of a scripted token engine."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from transformers import PreTrainedTokenizerBase

from skyrl_train.gateway import SessionHandle
from skyrl_train.timeline import Timeline

WEATHER = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def client(handle: SessionHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.base_url, api_key="unused", max_retries=0)


def post(url: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_multi_turn_chat_is_one_sample_with_the_engine_ids_bitwise(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer, replies=["the answer is 4", "5 apples", "done"])
    served = serve(engine, tokenizer)
    timeline = served.gateway.spans = Timeline()
    handle = served.gateway.open_session("episode-0")
    sdk = client(handle)
    messages: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    for turn in range(3):
        answer = sdk.chat.completions.create(model="policy", messages=messages)
        messages += [answer.choices[0].message.model_dump(), {"role": "user", "content": f"and {turn}?"}]
    assert answer.choices[0].message.content == "done"
    # Each engine call is timed: on the run's timeline (its engine lane) and in the gateway's counters.
    assert [(span.lane, span.name) for span in timeline.spans] == [("engine", "generate")] * 3
    assert served.gateway.stats.engine_calls == 3
    assert served.gateway.stats.engine_s == pytest.approx(sum(span.seconds for span in timeline.spans), abs=0.05)
    assert served.gateway.session("episode-0").counts.messages == 2
    [sample] = served.gateway.close_session("episode-0")
    check_recording(sample, engine)
    assert sample.loss_mask.count(1) == sum(len(o.token_ids) for o in engine.outputs)
    assert [t.stop_reason for t in sample.turns] == ["stop"] * 3


def test_a_reply_that_retokenises_differently_still_merges(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    spelled = [int(tokenizer.convert_tokens_to_ids(c)) for c in "the"] + [tokenizer.eos_token_id]
    assert tokenizer.encode("the", add_special_tokens=False) != spelled[:-1]  # not how the tokenizer spells it
    engine = make_engine(tokenizer, replies=[spelled, "ok"])
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    sdk = client(handle)
    messages: list[Any] = [{"role": "user", "content": "Say the."}]
    first = sdk.chat.completions.create(model="m", messages=messages)
    assert first.choices[0].message.content == "the"
    messages += [{"role": "assistant", "content": "the"}, {"role": "user", "content": "again"}]
    sdk.chat.completions.create(model="m", messages=messages)
    counts = served.gateway.session(handle.session_id).counts
    assert (counts.messages, counts.tokens, counts.new) == (1, 0, 1)
    [sample] = served.gateway.close_session(handle.session_id)
    assert sample.response_ids[:4] == spelled  # the sampled spelling, not a re-tokenisation
    check_recording(sample, engine)


def test_a_reshaped_echo_merges_by_tokens_and_a_rewritten_context_splits(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer, replies=["the answer", "more", "summary done"])
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    sdk = client(handle)
    question = {"role": "user", "content": "What is the answer?"}
    sdk.chat.completions.create(model="m", messages=[question])
    # An extra field changes the message key but not the rendering: the ids still extend the recorded ones.
    echoed = {"role": "assistant", "content": "the answer", "name": "bot"}
    sdk.chat.completions.create(model="m", messages=[question, echoed, {"role": "user", "content": "more?"}])
    summary = [{"role": "user", "content": "Summary: the answer. Continue."}]
    sdk.chat.completions.create(model="m", messages=summary)
    counts = served.gateway.session(handle.session_id).counts
    assert (counts.messages, counts.tokens, counts.new) == (0, 1, 2)
    first, second = served.gateway.close_session(handle.session_id)
    assert second.prompt_ids == engine.prompts[2]
    assert second.response_ids == engine.outputs[2].token_ids
    assert set(second.loss_mask) == {1}
    assert first.response_ids[-len(engine.outputs[1].token_ids) :] == engine.outputs[1].token_ids


def test_streaming_with_usage_gives_the_same_reply(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer, default="the answer is 4")
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    sdk = client(handle)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    stream = sdk.chat.completions.create(
        model="m", messages=messages, stream=True, stream_options={"include_usage": True}, logprobs=True
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "the answer is 4"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(engine.outputs[0].token_ids)
    streamed = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == engine.outputs[0].logprobs[: len(streamed)]
    plain = sdk.chat.completions.create(model="m", messages=messages)
    assert plain.choices[0].message.content == content
    samples = served.gateway.close_session(handle.session_id)
    assert len(samples) == 2  # the same first request twice: two samples of the episode


def test_n_seed_stop_max_tokens_and_logprobs(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer, replies=["the answer is 4", "the answer is 5", "the answer is 6"])
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    sdk = client(handle)
    messages: list[Any] = [{"role": "user", "content": "Guess."}]
    two = sdk.chat.completions.create(
        model="m", messages=messages, n=2, seed=11, temperature=0.5, logprobs=True, top_logprobs=3, stop=["is 5"]
    )
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].message.content == "the answer is 4"
    assert two.choices[1].message.content == "the answer "  # the stop string is left out of the content
    params = engine.params[0]
    assert (params.seed, params.temperature, params.stop, params.logprobs) == (11, 0.5, ("is 5",), True)
    entries = two.choices[0].logprobs.content
    assert [e.logprob for e in entries] == engine.outputs[0].logprobs
    assert "".join(e.token for e in entries[:-1]) == "the answer is 4"
    assert entries[0].top_logprobs[0].logprob == entries[0].logprob
    # Continue from the second choice with a token limit: the cut reply gets an end-of-turn token (mask 0).
    messages += [two.choices[1].message.model_dump(), {"role": "user", "content": "Sure?"}]
    short = sdk.chat.completions.create(model="m", messages=messages, max_completion_tokens=2)
    assert short.choices[0].finish_reason == "length"
    assert engine.params[-1].max_tokens == 2
    messages += [short.choices[0].message.model_dump(), {"role": "user", "content": "Go on."}]
    sdk.chat.completions.create(model="m", messages=messages, max_tokens=3)
    first, second = served.gateway.close_session(handle.session_id)
    assert first.response_ids == engine.outputs[0].token_ids  # choice 0: one reply
    assert second.loss_mask[: len(engine.outputs[1].token_ids)] == [1] * len(engine.outputs[1].token_ids)
    cut_end = second.turns[1].end
    assert second.response_ids[cut_end] == tokenizer.eos_token_id
    assert second.loss_mask[cut_end] == 0
    assert [t.stop_reason for t in second.turns] == ["stop", "length", "stop"]


def test_tool_calls_round_trip(serve, make_engine, check_recording, tool_tokenizer: PreTrainedTokenizerBase) -> None:
    call = 'Checking.<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
    engine = make_engine(tool_tokenizer, replies=[call, "It is sunny.", call, call])
    served = serve(engine, tool_tokenizer)
    handle = served.gateway.open_session()
    sdk = client(handle)
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    answer = sdk.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    [tool_call] = choice.message.tool_calls
    assert tool_call.function.name == "weather"
    assert json.loads(tool_call.function.arguments) == {"city": "Paris"}
    assert "Tools: " in tool_tokenizer.decode(engine.prompts[0])  # tools reached the template
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "sunny"},
    ]
    final = sdk.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    assert final.choices[0].message.content == "It is sunny."
    assert final.choices[0].message.tool_calls is None
    assert served.gateway.session(handle.session_id).counts.messages == 1
    stream = sdk.chat.completions.create(model="m", messages=messages[:1], tools=[WEATHER], stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    streamed_calls = [t for d in deltas for t in d.tool_calls or []]
    assert [t.function.name for t in streamed_calls] == ["weather"]
    none = sdk.chat.completions.create(model="m", messages=messages[:1], tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.tool_calls is None
    assert "<tool_call>" in (none.choices[0].message.content or "")
    samples = served.gateway.close_session(handle.session_id)
    check_recording(samples[0], make_engine(tool_tokenizer, prompts=engine.prompts[:2], outputs=engine.outputs[:2]))


def test_completions_with_token_ids_merge_by_tokens(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer, replies=["the answer", "is 4"], version=3)
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    sdk = client(handle)
    prompt = tokenizer.encode("What is 2 + 2?", add_special_tokens=False)
    first = sdk.completions.create(model="m", prompt=prompt, logprobs=1, extra_body={"return_token_ids": True})
    sampled = first.model_dump()["choices"][0]["token_ids"]
    assert sampled == engine.outputs[0].token_ids
    assert first.choices[0].logprobs.token_logprobs == engine.outputs[0].logprobs
    follow = prompt + sampled + tokenizer.encode(" so", add_special_tokens=False)
    second = sdk.completions.create(model="m", prompt=follow, max_tokens=8)
    assert second.choices[0].text == "is 4"
    text = sdk.completions.create(model="m", prompt="plain text", max_tokens=1)
    assert text.choices[0].finish_reason == "length"
    counts = served.gateway.session(handle.session_id).counts
    assert (counts.tokens, counts.new) == (1, 2)
    merged, plain = served.gateway.close_session(handle.session_id)
    check_recording(merged, make_engine(tokenizer, prompts=engine.prompts[:2], outputs=engine.outputs[:2]))
    assert merged.policy_version == 3
    assert plain.policy_version == 3


def test_the_api_key_names_the_session_on_the_bare_routes(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    served = serve(make_engine(tokenizer), tokenizer)
    handle = served.gateway.open_session("by-key")
    sdk = openai.OpenAI(base_url=served.gateway.url + "/v1", api_key=handle.api_key, max_retries=0)
    sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert [m.id for m in sdk.models.list()] == ["policy"]
    assert len(served.gateway.close_session("by-key")) == 1
    with pytest.raises(openai.AuthenticationError) as caught:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "invalid_api_key"


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer)
    served = serve(engine, tokenizer, max_model_len=64)
    handle = served.gateway.open_session()
    url = handle.base_url + "/chat/completions"
    hi = [{"role": "user", "content": "hi"}]
    cases: list[tuple[bytes | dict[str, Any], int, str | None, str | None]] = [
        (b"{not json", 400, "invalid_request", None),
        (b"[1, 2]", 400, "invalid_request", None),
        ({"model": "m"}, 400, "invalid_request", "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_request", "messages[0].role"),
        ({"messages": [{"role": "user"}, "x"]}, 400, "invalid_request", "messages[1]"),
        ({"messages": hi, "temperature": "hot"}, 400, "invalid_request", "temperature"),
        ({"messages": hi, "n": 1000}, 400, "invalid_request", "n"),
        ({"messages": hi, "top_logprobs": 2}, 400, "invalid_request", "top_logprobs"),
        ({"messages": hi, "logit_bias": {"1": 5}}, 400, "unsupported_parameter", "logit_bias"),
        ({"messages": hi, "tool_choice": "required"}, 400, "unsupported_parameter", "tool_choice"),
        ({"messages": hi, "response_format": {"type": "json_object"}}, 400, "unsupported_parameter", None),
        ({"messages": [{"role": "user", "content": "word " * 80}]}, 400, "context_length_exceeded", "messages"),
        ({"messages": hi, "max_tokens": 60}, 400, "context_length_exceeded", "max_tokens"),
    ]
    for body, status, code, param in cases:
        got, answer = post(url, body)
        assert got == status, (body, answer)
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]
        assert (error["type"], error["code"]) == ("invalid_request_error", code), (body, error)
        if param is not None:
            assert error["param"] == param, (body, error)
    completions = handle.base_url + "/completions"
    for body in ({"prompt": []}, {"prompt": [10**6]}, {"prompt": "x", "echo": True}, {"prompt": [[1], "a"]}):
        assert post(completions, body)[0] == 400, body
    got, answer = post(served.gateway.url + "/s/nobody/v1/chat/completions", {"messages": hi})
    assert (got, answer["error"]["code"]) == (404, "session_not_found")
    got, answer = post(served.gateway.url + "/v1/chat/completions", {"messages": hi})  # no key at all
    assert (got, answer["error"]["code"]) == (401, "invalid_api_key")
    got, answer = post(served.gateway.url + "/v1/embeddings", {"input": "x"})
    assert got == 404
    assert answer["error"]["type"] == "invalid_request_error"
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(url, timeout=30)  # GET on a POST route
    assert caught.value.code == 405
    assert "error" in json.loads(caught.value.read())
    engine.fail_with = RuntimeError("GPU fell off")
    got, answer = post(url, {"messages": hi})
    assert (got, answer["error"]["code"], answer["error"]["type"]) == (500, "engine_error", "server_error")
    assert "GPU fell off" in answer["error"]["message"]
    engine.fail_with = None
    sdk = client(handle)
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model="m", messages=hi, max_tokens=100)
    assert bad.value.code == "context_length_exceeded"
    assert sdk.chat.completions.create(model="m", messages=hi).choices[0].message.content == "ok"
    [sample] = served.gateway.close_session(handle.session_id)  # only the request that succeeded
    assert sample.response_ids == engine.outputs[-1].token_ids
    assert served.gateway.stats.errors >= len(cases) + 8


def test_a_paused_engine_holds_requests_until_it_resumes(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer, default="after the sync")
    served = serve(engine, tokenizer, stream_keepalive_s=0.05)
    handle = served.gateway.open_session()
    sdk = client(handle)
    served.loop.run(engine.pause())
    with ThreadPoolExecutor(2) as pool:
        plain = pool.submit(sdk.chat.completions.create, model="m", messages=[{"role": "user", "content": "a"}])
        raw = pool.submit(read_stream, handle.base_url + "/chat/completions", [{"role": "user", "content": "b"}])
        time.sleep(1.0)
        assert not plain.done()
        assert not raw.done()
        assert engine.prompts == []
        served.loop.run(engine.resume())
        assert plain.result(timeout=30).choices[0].message.content == "after the sync"
        lines = raw.result(timeout=30)
    assert lines.count(": keep-alive") >= 3  # the stream stayed alive while the engine was paused
    assert [line for line in lines if line][-1] == "data: [DONE]"
    assert len(served.gateway.close_session(handle.session_id)) == 2


def read_stream(url: str, messages: list[Any]) -> list[str]:
    body = json.dumps({"messages": messages, "stream": True}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read().decode().split("\n")


def test_closing_a_session_cancels_its_requests_in_flight(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer)
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    served.loop.run(engine.pause())
    result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: result.update(
            answer=post(handle.base_url + "/chat/completions", {"messages": [{"role": "user", "content": "a"}]})
        )
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not served.gateway._sessions[handle.session_id].tasks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.gateway.close_session(handle.session_id) == []
    thread.join(timeout=30)
    status, answer = result["answer"]
    assert (status, answer["error"]["code"]) == (404, "session_closed")
    served.loop.run(engine.resume())
    assert engine.prompts == []


def test_many_sessions_at_once_keep_their_own_samples(
    serve, make_engine, check_recording, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = make_engine(tokenizer, default=lambda prompt: f"reply {len(prompt)}", delay_s=0.01)
    served = serve(engine, tokenizer)
    handles = [served.gateway.open_session(f"ep{k}") for k in range(8)]

    def episode(handle: SessionHandle) -> None:
        sdk = client(handle)
        messages: list[Any] = [{"role": "user", "content": f"episode {handle.session_id}"}]
        for _ in range(3):
            answer = sdk.chat.completions.create(model="m", messages=messages)
            messages += [answer.choices[0].message.model_dump(), {"role": "user", "content": "next"}]

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(episode, handles))
    for handle in handles:
        [sample] = served.gateway.close_session(handle.session_id)
        assert len(sample.turns) == 3
        assert f"episode {handle.session_id}" in tokenizer.decode(sample.prompt_ids)


def test_odd_bodies_never_break_the_server(serve, make_engine, tokenizer: PreTrainedTokenizerBase) -> None:
    served = serve(make_engine(tokenizer), tokenizer)
    handle = served.gateway.open_session()
    chat, completions = handle.base_url + "/chat/completions", handle.base_url + "/completions"
    hi = [{"role": "user", "content": "hi"}]
    odd: list[tuple[str, Any]] = [
        (chat, {"messages": [{"role": "assistant", "tool_calls": "x"}]}),
        (chat, {"messages": [{"role": "user", "tool_calls": [{"function": {"name": "f"}}]}]}),
        (chat, {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}),
        (chat, {"messages": [{"role": "user", "content": [1]}]}),
        (chat, {"messages": [{"role": "user", "content": "a", "name": 5}]}),
        (chat, {"messages": "hi"}),
        (chat, {"messages": hi, "stop": [""]}),
        (chat, {"messages": hi, "stop": 3}),
        (chat, {"messages": hi, "stop_token_ids": ["a"]}),
        (chat, {"messages": hi, "tools": [{"type": "function"}]}),
        (chat, {"messages": hi, "tools": [{"type": "code_interpreter"}]}),
        (chat, {"messages": hi, "tools": "x"}),
        (chat, {"messages": hi, "stream": True, "stream_options": {"include_usage": 1}}),
        (chat, {"messages": hi, "stream_options": {"include_usage": True}}),
        (chat, {"messages": hi, "chat_template_kwargs": []}),
        (chat, {"messages": hi, "seed": 1.5}),
        (chat, {"messages": hi, "max_tokens": 0}),
        (chat, {"messages": hi, "top_p": 0}),
        (chat, {"messages": hi, "logprobs": "yes"}),
        (chat, {"messages": hi, "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        (chat, {"messages": hi, "model": 3}),
        (chat, {"messages": hi, "n": True}),
        (completions, {"prompt": "x", "logprobs": 9}),
        (completions, {"prompt": [True, 1]}),
        (completions, {"prompt": None}),
        (completions, {"prompt": "x", "best_of": 2}),
    ]
    for url, body in odd:
        status, answer = post(url, body)
        assert 400 <= status < 500, (body, status, answer)
        assert answer["error"]["message"], body
    assert post(chat, {"messages": hi})[0] == 200
    assert post(completions, {"prompt": "hi", "max_tokens": 2})[0] == 200
    assert len(served.gateway.close_session(handle.session_id)) == 2


def test_session_ids_are_checked(serve, make_engine, tokenizer: PreTrainedTokenizerBase) -> None:
    served = serve(make_engine(tokenizer), tokenizer)
    gateway = served.gateway
    handle = gateway.open_session("a.b-c_d~1")
    assert handle.base_url == f"{gateway.url}/s/a.b-c_d~1/v1"
    assert handle.api_key == "a.b-c_d~1"
    with pytest.raises(ValueError, match="already open"):
        gateway.open_session("a.b-c_d~1")
    with pytest.raises(ValueError, match="session ids"):
        gateway.open_session("has/slash")
    assert gateway.close_session("a.b-c_d~1") == []
    with pytest.raises(KeyError):
        gateway.close_session("a.b-c_d~1")
    assert len(gateway.open_session().session_id) == 32
    assert (gateway.stats.sessions_opened, gateway.stats.sessions_closed) == (2, 1)
