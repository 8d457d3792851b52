"""The OpenAI wire format: request bodies to typed requests (validated), sampled replies to response bodies.

Parameters the gateway implements: ``n``, ``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``,
``stop``, ``seed``, ``logprobs`` / ``top_logprobs``, ``stream`` / ``stream_options.include_usage``, ``tools`` /
``tool_choice`` (``"auto"`` or ``"none"``), and vLLM's extensions ``top_k``, ``min_p``, ``stop_token_ids``,
``chat_template_kwargs``, ``return_token_ids`` and (completions) ``add_special_tokens``. Parameters whose effect the
gateway cannot give (``logit_bias``, penalties, ``response_format`` other than text, ``tool_choice`` ``"required"``
or a named function, ``echo``, ``suffix``, ``best_of`` > 1, audio, …) are refused with
:class:`~skyrl_train.gateway.errors.UnsupportedParameterError` when set to anything but their neutral value.
Other unknown fields are ignored, as vLLM does. ``model`` is echoed back, whatever it names.

Log-probabilities: engines report the sampled token's only, so every ``top_logprobs`` list holds that one entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skyrl_train.gateway.errors import InvalidRequestError, UnsupportedParameterError
from skyrl_train.gateway.render import ParsedReply, ToolCall
from skyrl_train.inference.base import GenerationOutput, SamplingParams, StopReason

__all__ = [
    "ChatRequest",
    "Choice",
    "CompletionRequest",
    "Head",
    "Sampling",
    "chat_chunks",
    "chat_message",
    "chat_response",
    "completion_chunks",
    "completion_response",
    "finish_reason",
    "parse_chat_request",
    "parse_completion_request",
]

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat; completions allow up to 5


def _set(value: Any) -> bool:
    return value is not None and value is not False and value != [] and value != {} and value != ""


def _nonzero(value: Any) -> bool:
    return value is not None and value != 0


_UNSUPPORTED_COMMON: dict[str, Callable[[Any], bool]] = {
    "logit_bias": _set,
    "presence_penalty": _nonzero,
    "frequency_penalty": _nonzero,
    "repetition_penalty": lambda v: v is not None and v != 1,
}
_UNSUPPORTED_CHAT: dict[str, Callable[[Any], bool]] = {
    **_UNSUPPORTED_COMMON,
    "response_format": lambda v: v is not None and not (isinstance(v, Mapping) and v.get("type") == "text"),
    "functions": _set,
    "function_call": _set,
    "audio": _set,
    "prediction": _set,
    "web_search_options": _set,
    "modalities": lambda v: v is not None and v != ["text"],
    "continue_final_message": _set,
}
_UNSUPPORTED_COMPLETION: dict[str, Callable[[Any], bool]] = {
    **_UNSUPPORTED_COMMON,
    "echo": _set,
    "suffix": _set,
    "best_of": lambda v: v is not None and v != 1,
}


@dataclass(frozen=True)
class Sampling:
    """Sampling settings common to both endpoints."""

    n: int = 1
    max_tokens: int | None = None  # None: GatewayConfig.default_max_tokens, capped by the context left
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def params(self, max_tokens: int) -> SamplingParams:
        """The engine's sampling parameters (log-probabilities always on: they are recorded)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            logprobs=True,
            seed=self.seed,
        )


@dataclass(frozen=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body (messages are normalised by the renderer)."""

    messages: list[Any]
    sampling: Sampling = field(default_factory=Sampling)
    tools: list[dict[str, Any]] | None = None
    parse_tool_calls: bool = False  # tools were given and tool_choice is not "none"
    template_options: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    model: str | None = None


@dataclass(frozen=True)
class CompletionRequest:
    """A validated ``POST /v1/completions`` body: one or more prompts, each text or token ids."""

    prompts: list[str | list[int]]
    sampling: Sampling = field(default_factory=Sampling)
    add_special_tokens: bool = True  # for text prompts
    logprobs: int | None = None  # None: no log-probabilities in the answer
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    model: str | None = None


class _Fields:
    """Typed reads of a JSON object's fields; every error names its parameter."""

    def __init__(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise InvalidRequestError(f"the request body must be a JSON object, got {type(body).__name__}")
        self.body = body

    def get(self, name: str) -> Any:
        return self.body.get(name)

    def integer(self, name: str, default: int | None, minimum: int | None = None, maximum: int | None = None) -> Any:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(f"{name} must be an integer, got {value!r}", param=name)
        _check_range(name, value, minimum, maximum)
        return value

    def number(self, name: str, default: float, minimum: float | None = None, maximum: float | None = None) -> float:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequestError(f"{name} must be a number, got {value!r}", param=name)
        _check_range(name, value, minimum, maximum)
        return float(value)

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InvalidRequestError(f"{name} must be true or false, got {value!r}", param=name)
        return value

    def mapping(self, name: str) -> dict[str, Any]:
        value = self.body.get(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise InvalidRequestError(f"{name} must be an object, got {value!r}", param=name)
        return value

    def refuse(self, unsupported: Mapping[str, Callable[[Any], bool]]) -> None:
        for name, is_set in unsupported.items():
            if name in self.body and is_set(self.body[name]):
                raise UnsupportedParameterError(
                    f"{name}={self.body[name]!r} is not supported by this server; remove it", param=name
                )


def _check_range(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"[{'-inf' if minimum is None else minimum}, {'inf' if maximum is None else maximum}]"
        raise InvalidRequestError(f"{name} must be in {bounds}, got {value!r}", param=name)


def _sampling(fields: _Fields, max_n: int) -> Sampling:
    stop = fields.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise InvalidRequestError("stop must be a non-empty string or a list of them", param="stop")
    stop_ids = fields.get("stop_token_ids")
    if stop_ids is not None and (
        not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids)
    ):
        raise InvalidRequestError("stop_token_ids must be a list of integers", param="stop_token_ids")
    max_tokens = fields.integer("max_completion_tokens", None, minimum=1)
    if max_tokens is None:
        max_tokens = fields.integer("max_tokens", None, minimum=1)
    top_p = fields.number("top_p", 1.0, minimum=0.0, maximum=1.0)
    if top_p == 0:
        raise InvalidRequestError("top_p must be in (0, 1], got 0", param="top_p")
    return Sampling(
        n=fields.integer("n", 1, minimum=1, maximum=max_n),
        max_tokens=max_tokens,
        temperature=fields.number("temperature", 1.0, minimum=0.0),
        top_p=top_p,
        top_k=fields.integer("top_k", -1, minimum=-1),
        min_p=fields.number("min_p", 0.0, minimum=0.0, maximum=1.0),
        stop=tuple(stop or ()),
        stop_token_ids=tuple(stop_ids or ()),
        seed=fields.integer("seed", None),
    )


def _stream_options(fields: _Fields, stream: bool) -> bool:
    options = fields.mapping("stream_options")
    if options and not stream:
        raise InvalidRequestError("stream_options is only allowed with stream=true", param="stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise InvalidRequestError("stream_options.include_usage must be true or false", param="stream_options")
    return include


def _model(fields: _Fields) -> str | None:
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequestError("model must be a string", param="model")
    return model


def parse_chat_request(body: Any, *, max_n: int) -> ChatRequest:
    """Validate a chat completions body; raises :class:`InvalidRequestError` (or its subclasses)."""
    fields = _Fields(body)
    fields.refuse(_UNSUPPORTED_CHAT)
    messages = fields.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of messages", param="messages")
    tools = _tools(fields.get("tools"))
    tool_choice = fields.get("tool_choice")
    if tool_choice not in (None, "auto", "none"):
        raise UnsupportedParameterError(
            f"tool_choice={tool_choice!r} is not supported: use 'auto' or 'none'", param="tool_choice"
        )
    logprobs = fields.flag("logprobs")
    top_logprobs = fields.integer("top_logprobs", 0, minimum=0, maximum=MAX_TOP_LOGPROBS)
    if top_logprobs and not logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    stream = fields.flag("stream")
    return ChatRequest(
        messages=messages,
        sampling=_sampling(fields, max_n),
        tools=tools,
        parse_tool_calls=bool(tools) and tool_choice != "none",
        template_options=fields.mapping("chat_template_kwargs"),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        stream=stream,
        include_usage=_stream_options(fields, stream),
        return_token_ids=fields.flag("return_token_ids"),
        model=_model(fields),
    )


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise InvalidRequestError("tools must be a list of function tools", param="tools")
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise UnsupportedParameterError(f"tools[{k}]: only function tools are supported", param=f"tools[{k}]")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequestError(f"tools[{k}].function.name must be a string", param=f"tools[{k}]")
    return tools


def parse_completion_request(body: Any, *, max_n: int) -> CompletionRequest:
    """Validate a completions body; ``prompt`` may be a string, a list of strings, ids, or a list of id lists."""
    fields = _Fields(body)
    fields.refuse(_UNSUPPORTED_COMPLETION)
    stream = fields.flag("stream")
    return CompletionRequest(
        prompts=_prompts(fields.get("prompt")),
        sampling=_sampling(fields, max_n),
        add_special_tokens=fields.flag("add_special_tokens", True),
        logprobs=fields.integer("logprobs", None, minimum=0, maximum=5),
        stream=stream,
        include_usage=_stream_options(fields, stream),
        return_token_ids=fields.flag("return_token_ids"),
        model=_model(fields),
    )


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _prompts(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if _is_ids(prompt):
            return [list(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(_is_ids(p) and p for p in prompt):
            return [list(p) for p in prompt]
    raise InvalidRequestError(
        "prompt must be a string, a list of strings, a list of token ids or a list of such lists", param="prompt"
    )


# -- answers ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One sampled completion as the client sees it."""

    index: int
    output: GenerationOutput
    text: str  # the decoded reply, without special tokens and without the stop string it stopped on
    reply: ParsedReply  # the text as content and tool calls (no tool calls unless they are parsed)
    token_texts: list[str] | None  # each sampled id's text, when log-probabilities are returned

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish reason."""
        return finish_reason(self.output.stop_reason, bool(self.reply.tool_calls))


def finish_reason(stop_reason: StopReason, called_tools: bool) -> str:
    """``length``, ``tool_calls`` or ``stop`` (``abort`` when the engine aborted)."""
    if stop_reason == "stop" and called_tools:
        return "tool_calls"
    return stop_reason


def chat_message(choice: Choice) -> dict[str, Any]:
    """The assistant message of a chat choice."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.reply.content}
    if choice.reply.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in choice.reply.tool_calls]
    return message


def _logprob_entries(choice: Choice, top: int) -> list[dict[str, Any]]:
    texts = choice.token_texts or []
    entries = []
    for text, logprob in zip(texts, choice.output.logprobs or [], strict=True):
        entry: dict[str, Any] = {"token": text, "logprob": logprob, "bytes": list(text.encode())}
        entry["top_logprobs"] = [dict(entry)] if top else []
        entries.append(entry)
    return entries


def _completion_logprobs(choice: Choice, top: int) -> dict[str, Any]:
    texts = choice.token_texts or []
    logprobs = list(choice.output.logprobs or [])
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": texts,
        "token_logprobs": logprobs,
        "top_logprobs": [{t: lp} for t, lp in zip(texts, logprobs, strict=True)] if top else None,
        "text_offset": offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


@dataclass(frozen=True)
class Head:
    """What every answer of one request shares."""

    id: str
    created: int
    model: str
    prompt_tokens: int  # summed over the request's prompts
    prompt_ids: list[list[int]]  # the engine's prompt of each of the request's prompts


def _envelope(head: Head, kind: str) -> dict[str, Any]:
    return {"id": head.id, "object": kind, "created": head.created, "model": head.model}


def _completion_tokens(choices: Sequence[Choice]) -> int:
    return sum(len(c.output.token_ids) for c in choices)


def chat_response(head: Head, request: ChatRequest, choices: Sequence[Choice]) -> dict[str, Any]:
    """The body of a non-streamed chat completion."""
    out = []
    for choice in choices:
        entry: dict[str, Any] = {"index": choice.index, "message": chat_message(choice), "logprobs": None}
        if request.logprobs:
            entry["logprobs"] = {"content": _logprob_entries(choice, request.top_logprobs)}
        entry["finish_reason"] = choice.finish_reason
        if request.return_token_ids:
            entry["token_ids"] = choice.output.token_ids
        out.append(entry)
    body: dict[str, Any] = {
        "id": head.id,
        "object": "chat.completion",
        "created": head.created,
        "model": head.model,
        "choices": out,
        "usage": usage(head.prompt_tokens, _completion_tokens(choices)),
    }
    if request.return_token_ids:
        body["prompt_token_ids"] = head.prompt_ids[0]
    return body


def chat_chunks(head: Head, request: ChatRequest, choices: Sequence[Choice]) -> list[dict[str, Any]]:
    """The chunks of a streamed chat completion: role, content, tool calls, finish (and usage) per choice."""

    def chunk(index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        entry = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        return {**_envelope(head, "chat.completion.chunk"), "choices": [entry]}

    chunks = []
    for choice in choices:
        chunks.append(chunk(choice.index, {"role": "assistant", "content": ""}))
        if choice.reply.content:
            logprobs = {"content": _logprob_entries(choice, request.top_logprobs)} if request.logprobs else None
            chunks.append(chunk(choice.index, {"content": choice.reply.content}, logprobs=logprobs))
        if choice.reply.tool_calls:
            calls = [_stream_call(k, call) for k, call in enumerate(choice.reply.tool_calls)]
            chunks.append(chunk(choice.index, {"tool_calls": calls}))
        extra: dict[str, Any] = {"finish_reason": choice.finish_reason}
        if request.return_token_ids:
            extra["token_ids"] = choice.output.token_ids
        chunks.append(chunk(choice.index, {}, **extra))
    if request.include_usage:
        chunks.append(_usage_chunk(head, "chat.completion.chunk", choices))
    return chunks


def _stream_call(index: int, call: ToolCall) -> dict[str, Any]:
    return {"index": index, **call.to_openai()}


def _usage_chunk(head: Head, kind: str, choices: Sequence[Choice]) -> dict[str, Any]:
    return {**_envelope(head, kind), "choices": [], "usage": usage(head.prompt_tokens, _completion_tokens(choices))}


def _completion_choice(choice: Choice, request: CompletionRequest, prompt_ids: list[int]) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": choice.index, "text": choice.text, "logprobs": None}
    if request.logprobs is not None:
        entry["logprobs"] = _completion_logprobs(choice, request.logprobs)
    entry["finish_reason"] = choice.finish_reason
    if request.return_token_ids:
        entry["token_ids"] = choice.output.token_ids
        entry["prompt_token_ids"] = prompt_ids
    return entry


def completion_response(
    head: Head, request: CompletionRequest, choices: Sequence[Choice], prompt_of: Sequence[int]
) -> dict[str, Any]:
    """The body of a non-streamed completion; ``prompt_of[k]`` is the prompt index of choice ``k``."""
    out = [_completion_choice(c, request, head.prompt_ids[p]) for c, p in zip(choices, prompt_of, strict=True)]
    return {
        "id": head.id,
        "object": "text_completion",
        "created": head.created,
        "model": head.model,
        "choices": out,
        "usage": usage(head.prompt_tokens, _completion_tokens(choices)),
    }


def completion_chunks(
    head: Head, request: CompletionRequest, choices: Sequence[Choice], prompt_of: Sequence[int]
) -> list[dict[str, Any]]:
    """The chunks of a streamed completion: one per choice (its text), then usage when asked for."""
    chunks = []
    for choice, prompt in zip(choices, prompt_of, strict=True):
        entry = _completion_choice(choice, request, head.prompt_ids[prompt])
        chunks.append({**_envelope(head, "text_completion"), "choices": [entry]})
    if request.include_usage:
        chunks.append(_usage_chunk(head, "text_completion", choices))
    return chunks
