"""Fixtures of the gateway tests: a scripted token engine, an event loop on a thread, a running gateway."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from skyrl_train.gateway import Gateway, GatewayConfig, Sample
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.concurrency import PauseGate

T = TypeVar("T")

# A ChatML template that renders tools (in a system turn) and tool calls the Hermes way, as Qwen's does.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    '{{ \'<tool_call>{"name": "\' + call.function.name + \'", "arguments": \' + (call.function.arguments | tojson)'
    " + '}</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tool_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = TOOL_TEMPLATE
    return tok


@dataclass
class TokenEngine:
    """An InferenceEngine that answers from a script of replies, in order of arrival.

    A reply is text (tokenized, then the EOS token, like a model that stops by itself), a list of ids (returned as
    they are), or a callable of the prompt returning either. ``max_tokens`` cuts a reply short (stop reason
    ``length``); stop strings are not applied. Log-probabilities are ``-(position + 1) / 100 - id / 1e5`` so every
    recorded value can be checked. ``version`` goes into ``metadata["policy_version"]`` when set.
    """

    tokenizer: PreTrainedTokenizerBase
    replies: list[Any] = field(default_factory=list)
    default: Any = "ok"
    delay_s: float = 0.0
    version: int | None = None
    prompts: list[list[int]] = field(default_factory=list)
    outputs: list[GenerationOutput] = field(default_factory=list)
    params: list[SamplingParams] = field(default_factory=list)
    fail_with: BaseException | None = None
    gate: PauseGate = field(default_factory=PauseGate)

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        async with self.gate.admit():
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.fail_with is not None:
                raise self.fail_with
            return [self._answer(list(prompt), params) for prompt in prompts]

    def _answer(self, prompt: list[int], params: SamplingParams) -> GenerationOutput:
        self.prompts.append(prompt)
        self.params.append(params)
        reply = self.replies.pop(0) if self.replies else self.default
        if callable(reply):
            reply = reply(prompt)
        if isinstance(reply, str):
            ids = [*list(self.tokenizer.encode(reply, add_special_tokens=False)), self.tokenizer.eos_token_id]
        else:
            ids = list(reply)
        reason = "stop"
        if len(ids) > params.max_tokens:
            ids, reason = ids[: params.max_tokens], "length"
        logprobs = [-(k + 1) / 100 - t / 1e5 for k, t in enumerate(ids)]
        metadata: dict[str, object] = {} if self.version is None else {"policy_version": self.version}
        out = GenerationOutput(ids, logprobs, reason, None, metadata)  # type: ignore[arg-type]
        self.outputs.append(out)
        return out

    async def update_weights(self, weights: Iterable[Any]) -> None:
        for _ in weights:
            pass

    async def pause(self) -> None:
        await self.gate.pause()

    async def resume(self) -> None:
        await self.gate.resume()

    async def close(self) -> None:
        pass


def _check_recording(sample: Sample, engine: Any) -> None:
    """The sample is the engine's first prompt, then each later prompt's new ids, then the last reply."""
    prompts, outputs = engine.prompts, engine.outputs
    assert sample.prompt_ids == prompts[0]
    expected_ids, expected_mask, expected_logprobs = [], [], []
    for k, output in enumerate(outputs):
        if k:
            grown = prompts[k][len(prompts[k - 1]) + len(outputs[k - 1].token_ids) :]
            assert prompts[k][: len(prompts[k - 1])] == prompts[k - 1]
            expected_ids += grown
            expected_mask += [0] * len(grown)
            expected_logprobs += [0.0] * len(grown)
        expected_ids += output.token_ids
        expected_mask += [1] * len(output.token_ids)
        expected_logprobs += output.logprobs
    assert sample.response_ids == expected_ids
    assert sample.loss_mask == expected_mask
    assert sample.logprobs == expected_logprobs  # bitwise: the engine's floats, untouched


class LoopThread:
    """An asyncio loop on a daemon thread: the gateway and its engine live there, test code calls in."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@dataclass
class Served:
    gateway: Gateway
    engine: Any
    loop: LoopThread


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    """Start gateways on a loop thread: ``serve(engine, tokenizer, **config)``; all stopped after the test."""
    loop = LoopThread()
    started: list[Served] = []

    def start(engine: Any, tokenizer: PreTrainedTokenizerBase, **config: Any) -> Served:
        async def make() -> Gateway:
            gateway = Gateway(engine, tokenizer, GatewayConfig(**config))
            await gateway.start()
            return gateway

        served = Served(loop.run(make()), engine, loop)
        started.append(served)
        return served

    yield start
    for served in started:
        loop.run(served.gateway.stop())
        loop.run(served.engine.close())
    loop.stop()


@pytest.fixture
def make_engine() -> type[TokenEngine]:
    """The scripted engine class: ``make_engine(tokenizer, replies=[...], ...)``."""
    return TokenEngine


@pytest.fixture
def check_recording() -> Callable[[Sample, Any], None]:
    """Assert a sample is exactly what an engine with ``prompts`` and ``outputs`` lists saw and sampled."""
    return _check_recording
