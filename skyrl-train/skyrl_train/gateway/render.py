r"""OpenAI chat messages to token ids with the model's chat template; conversation keys; tool calls in replies.

Rendering. A whole conversation is rendered with the tokenizer's ``apply_chat_template`` (``tools`` and any
``chat_template_kwargs`` passed through, generation prompt added) and encoded without adding special tokens. New
messages after an assistant turn are rendered as a delta with
:class:`~skyrl_train.generators.chat.ChatEncoder`'s fixed-base-conversation trick, so they get exactly the ids a
full render would give them at that position, while the turns before them keep the ids the engine produced.

Messages are normalised before rendering: ``developer`` becomes ``system``; ``content`` may be a string, ``None``
(rendered as ``""``) or a list of ``{"type": "text"}`` parts (joined); an assistant's ``tool_calls`` keep OpenAI's
shape, with each ``function.arguments`` JSON string parsed into an object (what Hugging Face templates expect).

Conversation keys. ``keys[i]`` is a digest of the template identity (``tools`` and template options) and messages
``0..i``, chained message by message. A message's key ignores what OpenAI clients add or drop when they echo a
reply back: ``None``/empty fields, tool-call ids and types, how ``arguments`` is serialised, and whitespace at the
ends of ``content``. Equal keys mean the same conversation to the merge rule of :mod:`skyrl_train.gateway.sessions`.

Tool calls (Hermes / Qwen format). A reply calls tools by writing, anywhere in its text::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Each block whose JSON object has a string ``name`` (and ``arguments``: an object, a JSON string or absent) becomes
one OpenAI tool call; a block that does not parse stays in the content. The content is the text outside the parsed
blocks, stripped (``None`` when nothing is left). A last block without its closing tag is accepted (a stop string
or the token limit may cut it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from skyrl_train.gateway.errors import InvalidRequestError, UnsupportedParameterError
from skyrl_train.generators.chat import ChatEncoder, decode, encode, find_end_of_turn_token_id, render

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "Conversation",
    "ParsedReply",
    "Renderer",
    "ToolCall",
    "ToolParser",
    "parse_hermes_tool_calls",
]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_ENCODER_CACHE_SIZE = 64  # distinct (tools, template options) whose delta encoders are kept


@dataclass(frozen=True)
class ToolCall:
    """A tool call parsed from a reply; ``arguments`` is a JSON string, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``tool_calls`` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedReply:
    """A reply's text split into what the assistant says and the tools it calls."""

    content: str | None
    tool_calls: list[ToolCall]


ToolParser = Callable[[str], ParsedReply]
"""Turns a reply's text into content and tool calls (:func:`parse_hermes_tool_calls` by default)."""

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)


def parse_hermes_tool_calls(text: str) -> ParsedReply:
    """Parse ``<tool_call>{"name": …, "arguments": …}</tool_call>`` blocks out of a reply (see the module docs)."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    end = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        call = _tool_call_from_json(match.group(1))
        if call is None:
            continue
        kept.append(text[end : match.start()])
        end = match.end()
        calls.append(call)
    if not calls:
        return ParsedReply(text, [])
    kept.append(text[end:])
    content = "".join(kept).strip()
    return ParsedReply(content or None, calls)


def _tool_call_from_json(raw: str) -> ToolCall | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        return ToolCall(value["name"], arguments)
    if isinstance(arguments, dict):
        return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))
    return None


@dataclass(frozen=True)
class Conversation:
    """A request's messages, ready for the template, with their keys (see the module docstring)."""

    messages: list[dict[str, Any]]  # normalised, in the template's input shape
    template_kwargs: dict[str, Any]  # ``tools`` (when given) and the request's chat_template_kwargs
    identity: bytes  # digest of template_kwargs: the template's identity
    keys: list[bytes]  # keys[i]: messages 0..i; empty when the template cannot render deltas


class Renderer:
    """Renders requests for one tokenizer and decodes what the engine sampled.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        tool_parser: How tool calls are read from a reply's text.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tool_parser: ToolParser = parse_hermes_tool_calls) -> None:
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.end_of_turn_token_id = find_end_of_turn_token_id(tokenizer)
        self._encoders: dict[bytes, ChatEncoder | None] = {}

    def conversation(
        self, messages: Sequence[Any], tools: list[dict[str, Any]] | None, options: Mapping[str, Any]
    ) -> Conversation:
        """Normalise ``messages`` (raising :class:`InvalidRequestError` naming the bad one) and key them."""
        normalised = [template_message(message, f"messages[{i}]") for i, message in enumerate(messages)]
        kwargs = dict(options)
        if tools:
            kwargs["tools"] = tools
        identity = _digest(b"", _canonical(kwargs))
        keys: list[bytes] = []
        if self._delta_encoder(identity, kwargs) is not None:
            key = identity
            for message in normalised:
                key = _digest(key, _canonical(message_key(message)))
                keys.append(key)
        return Conversation(normalised, kwargs, identity, keys)

    def full_ids(self, conversation: Conversation) -> list[int]:
        """Ids of the whole conversation with the generation prompt."""
        try:
            text = render(
                self.tokenizer,
                conversation.messages,
                add_generation_prompt=True,
                chat_template_kwargs=conversation.template_kwargs,
            )
        except Exception as exc:  # jinja raises its own errors for conversations a template rejects
            raise InvalidRequestError(
                f"the chat template cannot render these messages: {exc}", param="messages"
            ) from exc
        return encode(self.tokenizer, text)

    def delta_ids(self, conversation: Conversation, start: int) -> list[int]:
        """Ids of messages ``start:`` after an assistant turn that ended with its end-of-turn token."""
        encoder = self._delta_encoder(conversation.identity, conversation.template_kwargs)
        if encoder is None:
            raise RuntimeError("delta_ids needs a conversation whose template renders deltas (non-empty keys)")
        try:
            return encoder.observation_ids(conversation.messages[start:])
        except Exception as exc:  # as in full_ids
            raise InvalidRequestError(
                f"the chat template cannot render these messages: {exc}", param="messages"
            ) from exc

    def reply_key(self, conversation: Conversation, reply: Mapping[str, Any]) -> bytes | None:
        """The key of the conversation followed by the assistant message returned for it."""
        if not conversation.keys:
            return None
        return _digest(conversation.keys[-1], _canonical(message_key(template_message(reply, "reply"))))

    def encode_text(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Ids of a text prompt (``/v1/completions``)."""
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of sampled ids, without special tokens."""
        return decode(self.tokenizer, ids, skip_special_tokens=True)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each id's own text (special tokens included), for log-probability entries."""
        return [decode(self.tokenizer, [token], skip_special_tokens=False) for token in ids]

    def _delta_encoder(self, identity: bytes, kwargs: dict[str, Any]) -> ChatEncoder | None:
        """The cached delta encoder for one template identity; None when the template cannot render deltas."""
        if identity in self._encoders:
            return self._encoders[identity]
        try:
            encoder: ChatEncoder | None = ChatEncoder(
                self.tokenizer, chat_template_kwargs=kwargs, end_of_turn_token_id=self.end_of_turn_token_id
            )
        except Exception:  # this template cannot render a base conversation: only token matches will merge
            encoder = None
        if len(self._encoders) >= _ENCODER_CACHE_SIZE:
            del self._encoders[next(iter(self._encoders))]
        self._encoders[identity] = encoder
        return encoder


def template_message(raw: Any, where: str) -> dict[str, Any]:
    """One OpenAI message in the shape chat templates read; :class:`InvalidRequestError` names what is wrong."""
    if not isinstance(raw, Mapping):
        raise InvalidRequestError(f"{where} must be an object, got {type(raw).__name__}", param=where)
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidRequestError(f"{where}.role must be one of {sorted(ROLES)}, got {role!r}", param=f"{where}.role")
    message: dict[str, Any] = {"role": "system" if role == "developer" else role}
    message["content"] = _content_text(raw.get("content"), f"{where}.content")
    calls = raw.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise InvalidRequestError(f"{where}.tool_calls must be a list on an assistant message", param=where)
        message["tool_calls"] = [_template_tool_call(call, f"{where}.tool_calls[{k}]") for k, call in enumerate(calls)]
    for name in ("name", "tool_call_id"):
        if raw.get(name) is not None:
            if not isinstance(raw[name], str):
                raise InvalidRequestError(f"{where}.{name} must be a string", param=f"{where}.{name}")
            message[name] = raw[name]
    return message


def message_key(message: Mapping[str, Any]) -> dict[str, Any]:
    """What of a normalised message identifies it (see "Conversation keys" in the module docstring)."""
    key: dict[str, Any] = {"role": message["role"], "content": message["content"].strip()}
    if message.get("tool_calls"):
        key["tool_calls"] = [[c["function"]["name"], c["function"]["arguments"]] for c in message["tool_calls"]]
    for name in ("name", "tool_call_id"):
        if message.get(name):
            key[name] = message[name]
    return key


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise UnsupportedParameterError(
                    f"{where}[{k}]: only text content parts are supported, got type {kind!r}", param=f"{where}[{k}]"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequestError(f"{where} must be a string, null or a list of text parts", param=where)


def _template_tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InvalidRequestError(f"{where} must be {{'type': 'function', 'function': {{'name': …}}}}", param=where)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # templates get the string as it is
            arguments = json.loads(arguments) if arguments.strip() else {}
    out: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str).encode()


def _digest(previous: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(previous + data, digest_size=16).digest()
