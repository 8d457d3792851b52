"""Chat templating for multi-turn rollouts: appended observation ids never drift from a full re-render."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from skyrl_train.generators.chat import ChatEncoder, encode, find_end_of_turn_token_id, render

# A Qwen2.5-style template: a default system prompt when none is given, a tool list in the system turn, assistant
# tool calls as <tool_call> JSON, and consecutive tool results grouped into one user turn of <tool_response>s.
QWEN_STYLE_TEMPLATE = (
    "{%- set default_system = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' -%}"
    "{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{{- messages[0]['content'] if has_system else default_system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call functions. Their signatures are in <tools></tools>:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    '{{- \'\\n</tools>\\n\\nCall one as <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>\' -}}'
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in messages -%}"
    "{%- set previous = messages[loop.index0 - 1]['role'] if not loop.first else '' -%}"
    "{%- set following = messages[loop.index0 + 1]['role'] if not loop.last else '' -%}"
    "{%- if message['role'] == 'system' and loop.first -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if previous != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}"
    "{%- if following != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message['content'] -%}{{- '\\n' + message['content'] -}}{%- endif -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' -}}"
    "{{- call['function']['arguments'] | tojson -}}{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]

# A template whose end of turn (<|endoftext|>) is not the tokenizer's EOS (<|im_end|>), and that has no system role.
PLAIN_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ raise_exception('no system role') }}{%- endif -%}"
    "{{- message['role'] + ': ' + message['content'] + '<|endoftext|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}"
)


@pytest.fixture
def with_template(tokenizer: PreTrainedTokenizerBase) -> Iterator[Any]:
    """Switch the session tokenizer's chat template for one test, then restore it."""
    original = tokenizer.chat_template

    def use(template: str | None) -> PreTrainedTokenizerBase:
        tokenizer.chat_template = template if template is not None else original
        return tokenizer

    yield use
    tokenizer.chat_template = original


CONVERSATIONS: dict[str, tuple[list[dict[str, str]], list[tuple[str, list[dict[str, str]]]]]] = {
    # name: (prompt messages, [(assistant reply, observation messages after it), ...])
    "feedback": (
        [{"role": "user", "content": "What is 3 + 4? End with #### <number>."}],
        [
            ("3 + 4 = 8\n#### 8", [{"role": "user", "content": "Your answer is incorrect. Try again."}]),
            ("Sorry, I could not say.", [{"role": "user", "content": "I could not find a final answer."}]),
            ("3 + 4 = 7\n#### 7", []),
        ],
    ),
    "system_and_tools": (
        [
            {"role": "system", "content": "You solve problems with tools."},
            {"role": "user", "content": "Compute 12 * 9 and 5 - 2."},
        ],
        [
            (
                '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 9"}}\n</tool_call>',
                [
                    {"role": "tool", "content": "108"},
                    {"role": "tool", "content": "3"},
                ],
            ),
            ("Thinking more.", []),  # an env may answer with no message: just a new assistant turn
            ("The answers are 108 and 3.", [{"role": "user", "content": "Thanks!"}]),
        ],
    ),
}


def incremental_ids(
    encoder: ChatEncoder, prompt: list[dict[str, str]], turns: list[tuple[str, list[dict[str, str]]]], *, final: bool
) -> list[int]:
    """What the generator builds: prompt ids, then per turn the reply's ids + EOS and the observation's ids."""
    ids = encoder.prompt_ids(prompt)
    for i, (reply, observations) in enumerate(turns):
        ids += [*encode(encoder.tokenizer, reply), encoder.end_of_turn_token_id]
        last = i == len(turns) - 1
        ids += encoder.observation_ids(observations, add_generation_prompt=not (last and final))
    return ids


def full_conversation(
    prompt: list[dict[str, str]], turns: list[tuple[str, list[dict[str, str]]]]
) -> list[dict[str, str]]:
    messages = list(prompt)
    for reply, observations in turns:
        messages += [{"role": "assistant", "content": reply}, *observations]
    return messages


@pytest.mark.parametrize("template", ["chatml", "qwen", "qwen_tools"])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("final", [False, True])
def test_appended_ids_equal_full_rerender(with_template: Any, template: str, name: str, final: bool) -> None:
    tokenizer = with_template(None if template == "chatml" else QWEN_STYLE_TEMPLATE)
    kwargs = {"tools": TOOLS} if template == "qwen_tools" else {}
    encoder = ChatEncoder(tokenizer, chat_template_kwargs=kwargs)
    prompt, turns = CONVERSATIONS[name]
    for n in range(1, len(turns) + 1):
        expected_text = render(
            tokenizer,
            full_conversation(prompt, turns[:n]),
            add_generation_prompt=not final,
            chat_template_kwargs=kwargs,
        )
        got = incremental_ids(encoder, prompt, turns[:n], final=final)
        assert got == encode(tokenizer, expected_text)
        assert tokenizer.decode(got) == expected_text


def test_chatml_observation_starts_after_end_of_turn(tokenizer: PreTrainedTokenizerBase) -> None:
    encoder = ChatEncoder(tokenizer)
    ids = encoder.observation_ids([{"role": "user", "content": "Try again."}])
    assert tokenizer.decode(ids) == "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"
    closing = encoder.observation_ids([], add_generation_prompt=False)
    assert tokenizer.decode(closing) == "\n"


def test_qwen_default_system_prompt_is_not_repeated(with_template: Any) -> None:
    tokenizer = with_template(QWEN_STYLE_TEMPLATE)
    encoder = ChatEncoder(tokenizer)
    prompt_text = tokenizer.decode(encoder.prompt_ids([{"role": "user", "content": "Hi"}]))
    assert prompt_text.startswith("<|im_start|>system\nYou are Qwen")
    observation = tokenizer.decode(encoder.observation_ids([{"role": "user", "content": "More"}]))
    assert "system" not in observation
    assert observation == "\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"


def test_tool_results_are_grouped_into_one_turn(with_template: Any) -> None:
    tokenizer = with_template(QWEN_STYLE_TEMPLATE)
    encoder = ChatEncoder(tokenizer)
    tools = [{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    text = tokenizer.decode(encoder.observation_ids(tools))
    assert text.count("<|im_start|>user") == 1
    assert text.count("<tool_response>") == 2


def test_end_of_turn_token_detection(with_template: Any) -> None:
    tokenizer = with_template(None)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert find_end_of_turn_token_id(tokenizer) == im_end
    assert find_end_of_turn_token_id(with_template(QWEN_STYLE_TEMPLATE)) == im_end
    # Not the EOS token: the template decides.
    assert find_end_of_turn_token_id(with_template(PLAIN_TEMPLATE)) == tokenizer.convert_tokens_to_ids("<|endoftext|>")


def test_template_without_system_role_and_other_end_of_turn(with_template: Any) -> None:
    tokenizer = with_template(PLAIN_TEMPLATE)
    encoder = ChatEncoder(tokenizer)
    prompt = [{"role": "user", "content": "Hi"}]
    turns = [("Hello", [{"role": "user", "content": "Bye"}])]
    expected = render(tokenizer, full_conversation(prompt, turns), add_generation_prompt=True)
    assert incremental_ids(encoder, prompt, turns, final=False) == encode(tokenizer, expected)


def test_needs_end_of_turn(tokenizer: PreTrainedTokenizerBase) -> None:
    encoder = ChatEncoder(tokenizer)
    eot = encoder.end_of_turn_token_id
    assert not encoder.needs_end_of_turn([5, 6, eot])  # sampled by the model: kept as generated
    assert encoder.needs_end_of_turn([5, 6])  # stop string or length: the generator adds it, masked
    assert encoder.needs_end_of_turn([])


def test_explicit_end_of_turn_must_appear_in_the_template(tokenizer: PreTrainedTokenizerBase) -> None:
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ChatEncoder(tokenizer, end_of_turn_token_id=im_end).end_of_turn_token_id == im_end
    with pytest.raises(ValueError, match="end-of-turn token"):
        ChatEncoder(tokenizer, end_of_turn_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"))


def test_decode_drops_special_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    encoder = ChatEncoder(tokenizer)
    assert encoder.decode([*encode(tokenizer, "#### 5"), tokenizer.eos_token_id]) == "#### 5"
