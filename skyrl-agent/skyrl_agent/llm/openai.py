"""A client for OpenAI-compatible servers (vLLM, SGLang, ...) over HTTP, with aiohttp.

Messages go to ``/v1/chat/completions``; token ids go to ``/v1/completions``. The client asks for logprobs and,
when ``return_token_ids`` is set (vLLM), for the sampled token ids. Connection errors and 5xx answers are
retried with backoff; 4xx answers and timeouts are not.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from skyrl_agent.backoff import Backoff
from skyrl_agent.llm.base import (
    Completion,
    LLMConnectionError,
    LLMResponseError,
    LLMServerError,
    LLMTimeoutError,
    Prompt,
    SamplingParams,
    Usage,
)

__all__ = ["HTTPTimeout", "OpenAIClient"]


@dataclass(frozen=True)
class HTTPTimeout:
    """Timeouts of one HTTP call, in seconds (``None``: no limit)."""

    connect_s: float | None = 10.0
    read_s: float | None = 600.0  # between bytes of the answer
    total_s: float | None = None

    def to_aiohttp(self) -> aiohttp.ClientTimeout:
        """The aiohttp form."""
        return aiohttp.ClientTimeout(total=self.total_s, connect=self.connect_s, sock_read=self.read_s)


@dataclass
class OpenAIClient:
    """Completions from an OpenAI-compatible server.

    Attributes:
        base_url: E.g. ``http://localhost:8000/v1``.
        model: The served model's name.
        api_key: Sent as a bearer token when set.
        timeout: Per-call HTTP timeouts.
        backoff: Retries of connection errors and 5xx answers.
        return_token_ids: Ask for sampled token ids (vLLM's ``return_token_ids``).
    """

    base_url: str
    model: str
    api_key: str | None = None
    timeout: HTTPTimeout = field(default_factory=HTTPTimeout)
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=0.5, max_attempts=4))
    return_token_ids: bool = True
    seed: int = 0
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        """Sample one completion; ``timeout_s`` overrides the total HTTP timeout of each try."""
        chat = bool(prompt) and isinstance(prompt[0], dict)
        path = "/chat/completions" if chat else "/completions"
        body = self._body(prompt, params, chat)
        timeout = (
            self.timeout if timeout_s is None else HTTPTimeout(self.timeout.connect_s, self.timeout.read_s, timeout_s)
        )
        rng = random.Random(self.seed)
        for attempt in range(1, self.backoff.max_attempts + 1):
            try:
                data = await self._post(path, body, timeout)
                return _parse(data, chat)
            except (LLMConnectionError, LLMServerError) as exc:
                status = getattr(exc, "status", 500)
                if status < 500 or attempt >= self.backoff.max_attempts:
                    raise
                await asyncio.sleep(self.backoff.delay_s(attempt, rng))
        raise AssertionError("unreachable: the loop returns or raises")

    async def close(self) -> None:
        """Close the HTTP session; idempotent."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _body(self, prompt: Prompt, params: SamplingParams, chat: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": params.logprobs if chat else (1 if params.logprobs else None),
        }
        body["messages" if chat else "prompt"] = list(prompt)
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if self.return_token_ids:
            body["return_token_ids"] = True
        return body

    async def _post(self, path: str, body: dict[str, Any], timeout: HTTPTimeout) -> dict[str, Any]:
        if self._session is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._session = aiohttp.ClientSession(headers=headers)
        url = self.base_url.rstrip("/") + path
        try:
            async with self._session.post(url, json=body, timeout=timeout.to_aiohttp()) as response:
                if response.status >= 400:
                    text = await response.text()
                    raise LLMServerError(f"{url} answered {response.status}: {text[:500]}", response.status)
                data: dict[str, Any] = await response.json()
                return data
        except TimeoutError as exc:
            raise LLMTimeoutError(f"{url} did not answer in time ({timeout})") from exc
        except aiohttp.ClientConnectionError as exc:
            raise LLMConnectionError(f"cannot reach {url}: {exc}; is the server up?") from exc
        except aiohttp.ContentTypeError as exc:
            raise LLMResponseError(f"{url} did not answer JSON: {exc}") from exc


def _parse(data: dict[str, Any], chat: bool) -> Completion:
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        usage = data.get("usage") or {}
        return Completion(
            text=text or "",
            token_ids=choice.get("token_ids"),
            logprobs=_logprobs(choice.get("logprobs"), chat),
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            usage=Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))),
            prompt_token_ids=data.get("prompt_token_ids") or choice.get("prompt_token_ids"),
        )
    except (KeyError, IndexError, TypeError) as exc:
        raise LLMResponseError(f"unexpected completion format: {exc!r} in {str(data)[:300]}") from exc


def _logprobs(raw: Any, chat: bool) -> list[float] | None:
    if not raw:
        return None
    if chat:
        return [float(item["logprob"]) for item in raw["content"]]
    return [float(x) for x in raw["token_logprobs"]]
