"""Fixtures for the inference tests: the tiny model in transformers, forward-pass log-probabilities, and a real
HTTP server speaking the token-id subset of vLLM's OpenAI completions API in front of a ``LocalEngine``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.local import LocalEngine
from skyrl_train.inference.weight_sync import load_weights

ForwardLogprobs = Callable[[PreTrainedModel, Sequence[int], Sequence[int], float], torch.Tensor]


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Chat prompts of different lengths (so batches are really left-padded)."""
    questions = ["What is 3 + 4?", "Solve: 12 apples and 7 books, how many?", "hi", "What is 40 + 2? think first"]
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def load_model(path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture
def make_local_engine(tiny_model_dir: Path) -> Iterator[Callable[..., LocalEngine]]:
    """Build local engines on the tiny model; each is closed after the test."""
    engines: list[LocalEngine] = []

    def make(**options: Any) -> LocalEngine:
        engine = LocalEngine.from_pretrained(tiny_model_dir, **options)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        asyncio.run(engine.close())


def forward_logprobs(
    model: PreTrainedModel, prompt: Sequence[int], tokens: Sequence[int], temperature: float = 1.0
) -> torch.Tensor:
    """What a trainer recomputes: log_softmax(logits / T) of ``tokens`` after ``prompt``, one unpadded forward."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(list(tokens))[:, None])[:, 0]


@pytest.fixture(scope="session")
def trainer_logprobs() -> ForwardLogprobs:
    return forward_logprobs


def perturbed_weights(model: PreTrainedModel, seed: int, scale: float = 0.05) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of ``model`` plus seeded Gaussian noise (the tied embedding included), applied in place too."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in model.named_parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return [(name, param.detach().clone()) for name, param in model.named_parameters()]


@pytest.fixture(scope="session")
def perturb() -> Callable[..., list[tuple[str, torch.Tensor]]]:
    return perturbed_weights


# -- a real HTTP server in front of a LocalEngine ---------------------------------------------------------------


class CompletionsServer:
    """An aiohttp server on its own thread and event loop, serving ``engine`` on 127.0.0.1.

    Implements what the remote engine uses of vLLM's server: ``GET /v1/models``, ``POST /v1/completions`` with
    token-id prompts (``return_token_ids``, ``return_tokens_as_token_ids``, ``logprobs``), and the dev routes
    ``/pause``, ``/resume``, ``/collective_rpc`` (method ``skyrl_load_weights_from_file``) and
    ``/reset_prefix_cache``. ``fail_next`` answers that many completion requests with 503 first, to exercise
    client retries; ``stall_s`` holds every completion request that long before answering it, to exercise client
    timeouts.
    """

    def __init__(self, engine: LocalEngine, model_name: str = "tiny") -> None:
        self.engine = engine
        self.model_name = model_name
        self.fail_next = 0
        self.stall_s = 0.0
        self.completion_requests = 0  # every POST /v1/completions, failed ones included
        self.in_flight = 0
        self.max_in_flight = 0
        self.control_calls: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: Any = None
        self.url = ""

    def start(self) -> str:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self.url

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    async def _start(self) -> str:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/pause", self._pause)
        app.router.add_post("/resume", self._resume)
        app.router.add_post("/collective_rpc", self._collective_rpc)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self.engine.close()

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def _completions(self, request: Any) -> Any:
        from aiohttp import web

        self.completion_requests += 1
        if self.stall_s > 0:
            await asyncio.sleep(self.stall_s)
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response({"error": "overloaded"}, status=503)
        body = await request.json()
        try:
            prompts, params = _parse_request(body)
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            outputs = await self.engine.generate(prompts, params)
        finally:
            self.in_flight -= 1
        choices = [_choice(i, out, params.logprobs) for i, out in enumerate(outputs)]
        return web.json_response({"object": "text_completion", "model": self.model_name, "choices": choices})

    async def _pause(self, request: Any) -> Any:
        from aiohttp import web

        self.control_calls.append(f"pause:{request.query.get('mode', 'abort')}")
        await self.engine.pause()
        return web.json_response({"status": "paused"})

    async def _resume(self, request: Any) -> Any:
        from aiohttp import web

        self.control_calls.append("resume")
        await self.engine.resume()
        return web.json_response({"status": "resumed"})

    async def _reset_prefix_cache(self, request: Any) -> Any:
        from aiohttp import web

        self.control_calls.append("reset_prefix_cache")  # a LocalEngine keeps no prefix cache to reset
        return web.json_response({"success": True})

    async def _collective_rpc(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        self.control_calls.append(f"rpc:{body['method']}")
        if body["method"] != "skyrl_load_weights_from_file":
            return web.json_response({"error": f"unknown method {body['method']}"}, status=400)
        weights = await asyncio.to_thread(load_weights, body["args"][0])
        await self.engine.update_weights(weights)
        return web.json_response({"results": [None]})


def _parse_request(body: dict[str, Any]) -> tuple[list[list[int]], SamplingParams]:
    prompt = body["prompt"]
    prompts = [prompt] if prompt and isinstance(prompt[0], int) else prompt
    stop = body.get("stop") or []
    params = SamplingParams(
        max_tokens=int(body.get("max_tokens", 16)),
        temperature=float(body.get("temperature", 1.0)),
        top_p=float(body.get("top_p", 1.0)),
        top_k=int(body.get("top_k", -1)),
        min_p=float(body.get("min_p", 0.0)),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stop_token_ids=tuple(body.get("stop_token_ids") or ()),
        logprobs=body.get("logprobs") is not None,
        seed=body.get("seed"),
    )
    from skyrl_train.inference.local import validate_sampling_params

    validate_sampling_params(params)
    return prompts, params


def _choice(index: int, out: GenerationOutput, with_logprobs: bool) -> dict[str, Any]:
    logprobs = None
    if with_logprobs:
        logprobs = {
            "tokens": [f"token_id:{t}" for t in out.token_ids],
            "token_logprobs": out.logprobs,
            "top_logprobs": [None] * len(out.token_ids),
            "text_offset": [],
        }
    return {
        "index": index,
        "text": out.text or "",
        "token_ids": out.token_ids,
        "logprobs": logprobs,
        "finish_reason": out.stop_reason,
        "stop_reason": out.metadata.get("stop_string"),
    }


@pytest.fixture(scope="module")
def completions_server(tiny_model_dir: Path) -> Iterator[CompletionsServer]:
    server = CompletionsServer(LocalEngine.from_pretrained(tiny_model_dir))
    server.start()
    yield server
    server.stop()


def choose_stops(tokens: Sequence[int], tokenizer: PreTrainedTokenizerBase) -> tuple[int, int, str, int]:
    """From a sampled completion, a stop token and a stop string whose first occurrence is known.

    Returns ``(stop_id, id_end, stop_text, text_end)``: generation with that stop should return exactly
    ``tokens[:id_end]`` (resp. ``tokens[:text_end]``). The stop string is one token's clean ASCII text that
    does not occur earlier in the decoded completion.
    """
    id_index = next(k for k in range(3, len(tokens)) if tokens[k] not in tokens[:k])
    for k in range(3, len(tokens)):
        piece = tokenizer.decode([tokens[k]])
        clean = piece.isascii() and piece.strip() and piece.isprintable()
        if clean and piece not in tokenizer.decode(tokens[:k]):
            return tokens[id_index], id_index + 1, piece, k + 1
    raise AssertionError(f"no usable stop string in {tokens}")


@pytest.fixture(scope="session")
def pick_stops() -> Callable[[Sequence[int], PreTrainedTokenizerBase], tuple[int, int, str, int]]:
    return choose_stops


def assert_continued_under_new_weights(
    outputs: Sequence[GenerationOutput], reference: Sequence[GenerationOutput]
) -> None:
    """Each output: tokens of version 0, then of version 1 (weights loaded in between); the version-0 tokens and
    their log-probabilities are those of ``reference`` (the same seeded call, never interrupted), so nothing was
    aborted and sampled again; afterwards the new weights decide."""
    for out, before in zip(outputs, reference, strict=True):
        versions = out.token_policy_versions
        assert versions is not None
        assert len(versions) == len(out.token_ids)
        switch = versions.index(1)
        assert switch > 0
        assert versions == [0] * switch + [1] * (len(versions) - switch)
        assert out.token_ids[:switch] == before.token_ids[:switch]
        assert out.logprobs is not None
        assert before.logprobs is not None
        torch.testing.assert_close(torch.tensor(out.logprobs[:switch]), torch.tensor(before.logprobs[:switch]))
        assert out.logprobs[switch:] != before.logprobs[switch : len(out.logprobs)]
