"""Rendering, conversation keys and tool-call parsing (skyrl_train.gateway.render)."""

from __future__ import annotations

import json

import pytest
from transformers import PreTrainedTokenizerBase

from skyrl_train.gateway.errors import InvalidRequestError, UnsupportedParameterError
from skyrl_train.gateway.render import Renderer, parse_hermes_tool_calls

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_hermes_tool_calls_are_parsed_out_of_the_content() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    parsed = parse_hermes_tool_calls(text)
    assert parsed.content == "Let me look."
    [call] = parsed.tool_calls
    assert call.name == "weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.to_openai()["type"] == "function"
    assert call.id.startswith("call_")


def test_several_calls_string_arguments_and_an_unclosed_last_block() -> None:
    text = '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>{"name": "b"}'
    parsed = parse_hermes_tool_calls(text)
    assert parsed.content is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("a", '{"x": 1}'), ("b", "{}")]


def test_blocks_that_do_not_parse_stay_in_the_content() -> None:
    text = "before <tool_call>{not json}</tool_call> after"
    assert parse_hermes_tool_calls(text).content == text
    assert parse_hermes_tool_calls(text).tool_calls == []
    assert parse_hermes_tool_calls('<tool_call>{"arguments": {}}</tool_call>').tool_calls == []  # no name


def test_echoed_replies_key_like_the_returned_message(tokenizer: PreTrainedTokenizerBase) -> None:
    renderer = Renderer(tokenizer)
    history = [{"role": "user", "content": "hi"}]
    conversation = renderer.conversation(history, None, {})
    returned = {"role": "assistant", "content": "hello ", "tool_calls": None}
    # What the openai SDK's message.model_dump() sends back: extra None fields, content parts, no trailing space.
    echoed = {"role": "assistant", "content": [{"type": "text", "text": "hello"}], "refusal": None, "audio": None}
    again = renderer.conversation([*history, echoed], None, {})
    assert again.keys[-1] == renderer.reply_key(conversation, returned)
    changed = renderer.conversation([*history, {"role": "assistant", "content": "bye"}], None, {})
    assert changed.keys[-1] != again.keys[-1]
    with_tools = renderer.conversation([*history, echoed], [WEATHER], {})
    assert with_tools.keys[-1] != again.keys[-1]  # other tools, another template identity


def test_tool_call_ids_and_argument_spelling_do_not_change_the_key(tool_tokenizer: PreTrainedTokenizerBase) -> None:
    renderer = Renderer(tool_tokenizer)
    history = [{"role": "user", "content": "weather?"}]
    conversation = renderer.conversation(history, [WEATHER], {})
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    returned = {"role": "assistant", "content": None, "tool_calls": [call]}
    respelled = {**call, "id": "other", "function": {"name": "weather", "arguments": '{ "city":"Paris" }'}}
    echoed = renderer.conversation([*history, {"role": "assistant", "tool_calls": [respelled]}], [WEATHER], {})
    assert echoed.keys[-1] == renderer.reply_key(conversation, returned)


def test_delta_ids_equal_the_tail_of_a_full_render(tool_tokenizer: PreTrainedTokenizerBase) -> None:
    renderer = Renderer(tool_tokenizer)
    call = {"type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c"},
    ]
    whole = renderer.full_ids(renderer.conversation(messages, [WEATHER], {}))
    head = renderer.full_ids(renderer.conversation(messages[:2], [WEATHER], {}))
    text = tool_tokenizer.decode(whole, skip_special_tokens=False)
    assert '"arguments": {"city": "Paris"}' in text  # arguments reach the template as an object
    assert "Tools: " in text
    delta = renderer.delta_ids(renderer.conversation(messages, [WEATHER], {}), 3)
    assert whole[-len(delta) :] == delta
    assert delta[0] != renderer.end_of_turn_token_id  # the delta starts after the end-of-turn token
    assert whole[: len(head)] == head


def test_malformed_messages_name_the_bad_field(tokenizer: PreTrainedTokenizerBase) -> None:
    renderer = Renderer(tokenizer)
    with pytest.raises(InvalidRequestError) as caught:
        renderer.conversation([{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}], None, {})
    assert caught.value.param == "messages[1].role"
    with pytest.raises(UnsupportedParameterError):
        renderer.conversation([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], None, {})
    with pytest.raises(InvalidRequestError, match="must be an object"):
        renderer.conversation(["hello"], None, {})
    with pytest.raises(InvalidRequestError, match="content"):
        renderer.conversation([{"role": "user", "content": 3}], None, {})
