from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from aiohttp import web

from skyrl_agent.dispatch import Backoff
from skyrl_agent.llm.base import LLMServerError, SamplingParams, Usage
from skyrl_agent.llm.openai import OpenAIClient
from skyrl_agent.llm.scripted import LatencyClient, ScriptedClient


class FakeServer:
    """A tiny OpenAI-compatible chat completions server that fails the first ``fail_first`` calls with 503."""

    def __init__(self, fail_first: int = 0, status: int = 503) -> None:
        self.fail_first, self.status, self.calls = fail_first, status, 0
        self.bodies: list[dict[str, Any]] = []

    async def chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.json()
        self.bodies.append(body)
        if self.calls <= self.fail_first:
            return web.Response(status=self.status, text="busy")
        content = "hello world"
        return web.json_response(
            {
                "choices": [
                    {
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                        "logprobs": {
                            "content": [{"token": "hello", "logprob": -0.5}, {"token": " world", "logprob": -1.0}]
                        },
                        "token_ids": [11, 22],
                    }
                ],
                "usage": {"prompt_tokens": 7, "completion_tokens": 2},
                "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7],
            }
        )


async def _with_server(server: FakeServer, body: Any) -> Any:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = OpenAIClient(f"http://127.0.0.1:{port}/v1", "m", backoff=Backoff(base_s=0.001, max_attempts=3))
    try:
        return await body(client)
    finally:
        await client.close()
        await runner.cleanup()


def test_openai_client_logprobs_token_ids_and_retry_on_503() -> None:
    server = FakeServer(fail_first=2)

    async def body(client: OpenAIClient) -> Any:
        return await client.complete([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=5))

    completion = asyncio.run(_with_server(server, body))
    assert server.calls == 3
    assert completion.text == "hello world"
    assert completion.token_ids == [11, 22]
    assert completion.logprobs == [-0.5, -1.0]
    assert completion.usage.total_tokens == 9
    assert completion.prompt_token_ids == [1, 2, 3, 4, 5, 6, 7]
    assert server.bodies[0]["logprobs"] is True
    assert server.bodies[0]["return_token_ids"] is True


def test_openai_client_does_not_retry_4xx_and_gives_up_on_persistent_5xx() -> None:
    for status, expected_calls in [(400, 1), (503, 3)]:
        server = FakeServer(fail_first=99, status=status)

        async def body(client: OpenAIClient) -> Any:
            return await client.complete([{"role": "user", "content": "hi"}], SamplingParams())

        with pytest.raises(LLMServerError):
            asyncio.run(_with_server(server, body))
        assert server.calls == expected_calls


def test_scripted_client_is_stateless_and_respects_max_tokens() -> None:
    client = ScriptedClient(["a", "bb"])
    first = asyncio.run(client.complete([{"role": "user", "content": "x"}], SamplingParams()))
    second = asyncio.run(client.complete([{"role": "assistant", "content": "a"}], SamplingParams()))
    assert (first.text, second.text) == ("a", "bb")
    cut = asyncio.run(ScriptedClient(["abcdef"]).complete([], SamplingParams(max_tokens=3)))
    assert cut.text == "abc"
    assert cut.finish_reason == "length"
    assert len(cut.logprobs or []) == 3


def test_latency_client_models_a_busy_gpu() -> None:
    waits: list[float] = []

    async def fake_sleep(s: float) -> None:
        waits.append(s)
        await asyncio.sleep(0.01)

    client = LatencyClient(ScriptedClient(["x" * 100]), slots=2, base_s=0.1, per_token_s=0.01, seed=3, sleep=fake_sleep)

    async def main() -> None:
        await asyncio.gather(*(client.complete([], SamplingParams()) for _ in range(8)))

    asyncio.run(main())
    assert client.peak_active == 2
    assert len(waits) == 8
    assert all(0.3 < w < 3.0 for w in waits)
    same = [LatencyClient(ScriptedClient(["x"]), seed=5).duration_s(Usage(10, 10)) for _ in range(2)]
    assert same[0] == same[1]  # seeded


def test_package_imports_without_torch_or_skyrl_train() -> None:
    code = (
        "import sys, skyrl_agent.dispatch, skyrl_agent.agents, skyrl_agent.llm, skyrl_agent.llm.openai, "
        "skyrl_agent.integrations.skyrl_train, skyrl_agent.testing; "
        "assert 'torch' not in sys.modules and 'skyrl_train' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
