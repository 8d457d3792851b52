"""An engine for any OpenAI-compatible completions server (vLLM's in particular), over HTTP with ``aiohttp``.

Token in, token out: each prompt is one ``POST /v1/completions`` whose ``"prompt"`` is the list of token ids,
with vLLM's extensions ``"return_token_ids": true`` (the sampled ids come back as ``choices[0].token_ids``)
and ``"return_tokens_as_token_ids": true`` (log-probability entries are keyed ``"token_id:<id>"``, a fallback
source of the ids). ``"logprobs": 0`` asks for the sampled tokens' log-probabilities only. To get the
trainer's ``log_softmax(logits / T)`` rather than vLLM's default (before temperature), start the server with
``--logprobs-mode processed_logprobs``. Prompt ``i`` of a call with ``seed=s`` is sent with seed ``s + i``.

Concurrency and failures: at most ``max_concurrency`` requests are in flight (an ``asyncio.Semaphore``);
connection errors and 408/429/5xx answers are retried with exponential backoff and jitter
(:class:`RetryPolicy`); timeouts are values (:class:`Timeouts`), applied per attempt.

Control plane (needs a vLLM server started with ``VLLM_SERVER_DEV_MODE=1`` and
``--worker-extension-cls skyrl_train.inference.vllm_worker_ext.WeightUpdateExtension``, and
``RemoteEngineConfig(dev_mode=True)``): ``pause``/``resume`` call ``POST /pause`` and ``POST /resume``;
``update_weights`` writes a safetensors file under ``/dev/shm`` (``transfer_dir``: the server must be able to
read that path, so the same host or a shared filesystem) and calls ``POST /collective_rpc`` with method
``skyrl_load_weights_from_file``, then ``POST /reset_prefix_cache`` so that no prompt is continued from keys and
values cached under the old weights. Without dev mode, ``pause``/``resume`` only hold this client's own requests
and ``update_weights`` raises :class:`WeightUpdateUnsupportedError`.

Exceptions::

    RemoteEngineError (RuntimeError)
     ├── RemoteRequestError            the server refused the request (4xx): fix the request; never retried
     ├── RemoteUnavailableError        connection errors or 408/429/5xx through every retry: check the server
     └── WeightUpdateUnsupportedError  (also NotImplementedError) the server exposes no weight-update route
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from skyrl_train.inference.base import GenerationOutput, SamplingParams, StopReason
from skyrl_train.inference.concurrency import PauseGate
from skyrl_train.inference.weight_sync import save_weights, transfer_path

if TYPE_CHECKING:
    import aiohttp
    import torch

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
TOKEN_ID_PREFIX = "token_id:"


class RemoteEngineError(RuntimeError):
    """Base of the remote engine's errors."""


class RemoteRequestError(RemoteEngineError):
    """The server refused a request (4xx); retrying will not help."""

    def __init__(self, status: int, url: str, body: str) -> None:
        super().__init__(f"{url} answered {status}: {body[:500]}")
        self.status = status
        self.body = body


class RemoteUnavailableError(RemoteEngineError):
    """The server could not be reached, or kept failing, through every retry."""


class WeightUpdateUnsupportedError(RemoteEngineError, NotImplementedError):
    """The server has no weight-update route (start vLLM with VLLM_SERVER_DEV_MODE=1 and the worker extension)."""


@dataclass(frozen=True)
class Timeouts:
    """Per-attempt time limits in seconds; ``None`` disables one."""

    connect: float | None = 10.0  # to open a connection (and wait for a free one in the pool)
    read: float | None = 600.0  # between two reads of a response: a long generation must fit in it
    total: float | None = None  # for a whole attempt


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures (connection errors, 408/429/5xx) are retried."""

    attempts: int = 5  # tries per request, the first one included
    backoff_s: float = 0.5  # wait before the second try; doubles after each failure
    max_backoff_s: float = 10.0  # cap on one wait
    jitter: float = 0.5  # each wait is shortened by a random share up to this, to spread retries out

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number ``attempt`` (0-based)."""
        return min(self.max_backoff_s, self.backoff_s * 2.0**attempt) * (1 - self.jitter * random.random())


@dataclass(frozen=True)
class RemoteEngineConfig:
    """Settings of :class:`RemoteEngine`."""

    model: str | None = None  # the "model" field of requests; None: the server's first model (GET /v1/models)
    api_key: str | None = None  # sent as "Authorization: Bearer <key>"
    max_concurrency: int = 64  # requests in flight at most
    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    dev_mode: bool = False  # the server exposes /pause, /resume, /collective_rpc (VLLM_SERVER_DEV_MODE=1)
    pause_mode: Literal["wait", "keep", "abort"] = "wait"  # what the server does with in-flight requests on /pause
    transfer_dir: str | None = None  # where update_weights writes its file; None: /dev/shm (or the temp dir)


@dataclass
class _LoopState:
    """What must belong to the running event loop: the HTTP session and the concurrency semaphore."""

    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    semaphore: asyncio.Semaphore


class RemoteEngine:
    """An :class:`~skyrl_train.inference.base.InferenceEngine` speaking HTTP to ``base_url`` (e.g. ``http://host:8000``).

    The HTTP session is opened lazily in the running event loop (a new one if a later loop uses the engine);
    :meth:`close` closes it.
    """

    def __init__(self, base_url: str, config: RemoteEngineConfig | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.config = config or RemoteEngineConfig()
        self._gate = PauseGate()
        self._state: _LoopState | None = None
        self._model: str | None = self.config.model

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Sample one completion per prompt (token ids), in order; one HTTP request per prompt."""
        async with self._gate.admit():
            model = await self._model_name()
            bodies = [
                completion_body(prompt, params, None if params.seed is None else params.seed + i, model)
                for i, prompt in enumerate(prompts)
            ]
            answers = await asyncio.gather(*(self._complete(body) for body in bodies))
        return [parse_completion(answer, want_logprobs=params.logprobs) for answer in answers]

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send new weights through a shared file and the server's ``/collective_rpc``, then reset its prefix cache.

        Dev mode only. This client's later ``generate`` calls run on the new weights with nothing cached from the
        old ones; raises :class:`RemoteEngineError` if the server cannot reset its prefix cache.
        """
        if not self.config.dev_mode:
            raise WeightUpdateUnsupportedError(
                "update_weights needs a vLLM server started with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                "skyrl_train.inference.vllm_worker_ext.WeightUpdateExtension, and RemoteEngineConfig(dev_mode=True)"
            )
        path = await asyncio.to_thread(save_weights, weights, transfer_path(self.config.transfer_dir))
        try:
            async with self._gate.quiesced():  # no request of ours may start between the load and the reset
                body = {"method": "skyrl_load_weights_from_file", "args": [str(path)]}
                try:
                    await self._post("/collective_rpc", body)
                except RemoteRequestError as exc:
                    if exc.status == 404:
                        raise WeightUpdateUnsupportedError(f"{self.base_url} has no /collective_rpc route") from exc
                    raise
                await self._reset_prefix_cache()
        finally:
            path.unlink(missing_ok=True)

    async def _reset_prefix_cache(self) -> None:
        """Make the server forget the KV cache computed with the previous weights (dev-mode ``/reset_prefix_cache``).

        Cached blocks are keyed by their tokens, not by the weights that computed them: a prompt sharing a cached
        prefix would otherwise be continued from the old weights' keys and values. Requests running on the server
        are preempted and recompute their cache with the new weights when next scheduled. A paused vLLM server
        clears its cache itself on ``/pause``; ``update_weights`` does not rely on being called inside one.
        Raises :class:`RemoteEngineError` when the server reports that the reset failed.
        """
        answer = await self._post("/reset_prefix_cache", None, query={"reset_running_requests": "true"})
        if not (isinstance(answer, dict) and answer.get("success") is True):
            raise RemoteEngineError(
                f"{self.base_url}/reset_prefix_cache did not reset the prefix cache after new weights were loaded "
                f"(answer: {str(answer)[:300]}); generation would reuse keys and values of the old weights"
            )

    async def pause(self) -> None:
        """Hold this client's new requests, wait for its running ones, then pause the server (dev mode)."""
        await self._gate.pause()
        if self.config.dev_mode:
            await self._post("/pause", None, query={"mode": self.config.pause_mode})

    async def resume(self) -> None:
        """Resume the server (dev mode), then release this client's held requests."""
        if self.config.dev_mode:
            await self._post("/resume", None)
        await self._gate.resume()

    async def close(self) -> None:
        """Close the HTTP session; idempotent. A later call opens a new one."""
        state, self._state = self._state, None
        if state is not None and not state.session.closed and state.loop is asyncio.get_running_loop():
            await state.session.close()

    # -- HTTP ----------------------------------------------------------------------------------------------

    async def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        async with self._loop_state().semaphore:
            answer = await self._post("/v1/completions", body)
        if not isinstance(answer, dict) or not answer.get("choices"):
            raise RemoteEngineError(f"{self.base_url}/v1/completions returned no choices: {str(answer)[:500]}")
        return answer

    async def _model_name(self) -> str | None:
        """The configured model, else the first one the server lists (asked once)."""
        if self._model is None:
            listing = await self._request("GET", "/v1/models", None, None)
            models = listing.get("data") if isinstance(listing, dict) else None
            if models:
                self._model = str(models[0]["id"])
        return self._model

    async def _post(self, path: str, body: Any, query: dict[str, str] | None = None) -> Any:
        return await self._request("POST", path, body, query)

    async def _request(self, method: str, path: str, body: Any, query: dict[str, str] | None) -> Any:
        """Send one request, retrying transient failures; the decoded JSON answer (None when empty)."""
        import aiohttp

        url = self.base_url + path
        retry = self.config.retry
        failure = ""
        for attempt in range(retry.attempts):
            if attempt:
                await asyncio.sleep(retry.delay(attempt - 1))
            session = self._loop_state().session
            try:
                async with session.request(method, url, json=body, params=query) as response:
                    text = await response.text()
                    if response.status < 400:
                        return await _decode_json(response, text)
                    if response.status not in RETRYABLE_STATUS:
                        raise RemoteRequestError(response.status, url, text)
                    failure = f"{response.status}: {text[:300]}"
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
        raise RemoteUnavailableError(f"{method} {url} failed {retry.attempts} times; last: {failure}")

    def _loop_state(self) -> _LoopState:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop or self._state.session.closed:
            limits = self.config.timeouts
            timeout = aiohttp.ClientTimeout(total=limits.total, connect=limits.connect, sock_read=limits.read)
            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else None
            connector = aiohttp.TCPConnector(limit=self.config.max_concurrency + 4)  # room for control calls
            session = aiohttp.ClientSession(timeout=timeout, headers=headers, connector=connector)
            self._state = _LoopState(loop, session, asyncio.Semaphore(self.config.max_concurrency))
        return self._state


async def _decode_json(response: aiohttp.ClientResponse, text: str) -> Any:
    import json

    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RemoteEngineError(f"{response.url} returned non-JSON ({response.status}): {text[:300]}") from exc


def completion_body(
    prompt: Sequence[int], params: SamplingParams, seed: int | None, model: str | None
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/completions`` for one token-id prompt (vLLM's extensions included)."""
    body: dict[str, Any] = {
        "prompt": list(prompt),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": params.min_p,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "include_stop_str_in_output": True,  # the protocol keeps the stop string in the output
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "n": 1,
    }
    if params.logprobs:
        body["logprobs"] = 0  # the sampled token's only
    if seed is not None:
        body["seed"] = seed
    if model is not None:
        body["model"] = model
    return body


def parse_completion(answer: dict[str, Any], *, want_logprobs: bool) -> GenerationOutput:
    """A :class:`GenerationOutput` from a ``/v1/completions`` answer with one choice."""
    choice = answer["choices"][0]
    logprob_block = choice.get("logprobs") or {}
    token_ids = choice.get("token_ids")
    if token_ids is None:  # servers without return_token_ids: recover the ids from "token_id:<id>" entries
        token_ids = [int(str(t).removeprefix(TOKEN_ID_PREFIX)) for t in logprob_block.get("tokens", [])]
    logprobs = None
    if want_logprobs:
        logprobs = [float(lp) for lp in logprob_block.get("token_logprobs") or []]
        if len(logprobs) != len(token_ids):
            raise RemoteEngineError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs in {str(choice)[:300]}")
    finish = choice.get("finish_reason")
    reason: StopReason = finish if finish in ("stop", "length") else "abort"
    metadata: dict[str, object] = {}
    if isinstance(choice.get("stop_reason"), str):
        metadata["stop_string"] = choice["stop_reason"]
    return GenerationOutput([int(t) for t in token_ids], logprobs, reason, choice.get("text"), metadata)
