"""A weight update through the remote engine must not leave the vLLM server's prefix cache on the old weights.

vLLM caches the keys and values of full KV blocks (128 tokens on CPU) by the tokens they hold, not by the weights
that computed them. Without a reset, a prompt seen before the update is continued from the old weights' cache
while its tokens are counted as the new policy's. The end-to-end cases run a real vLLM server as a subprocess (~60 s to
start on CPU).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.remote import RemoteEngine, RemoteEngineConfig, RemoteEngineError
from skyrl_train.inference.vllm_worker_ext import EXTENSION_CLASS
from skyrl_train.inference.weight_sync import NamedTensors, sync_weights

from .conftest import ForwardLogprobs, load_model, perturbed_weights
from .test_remote_vllm_server import free_port, wait_until_ready

PROMPT_TOKENS = 300  # two full 128-token blocks are cached, the rest is recomputed
CACHED_TOKENS = 256
TOLERANCE = 1e-3  # vLLM on CPU matches a transformers fp32 forward pass to ~1e-6


@pytest.fixture(scope="module")
def caching_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dev-mode vLLM server on the tiny model with prefix caching on and cached-token counts in ``usage``."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-prefix-cache") / "server.log"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
        "--kv-cache-memory-bytes", str(128 * 2**20),
        "--logprobs-mode", "processed_logprobs",
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--worker-extension-cls", EXTENSION_CLASS,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def long_prompt(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """``PROMPT_TOKENS`` token ids of plain text."""
    text = " ".join(f"Step {i}: add {i} apples to the basket and count them again." for i in range(200))
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) >= PROMPT_TOKENS
    return ids[:PROMPT_TOKENS]


def cached_prompt_tokens(url: str, prompt: list[int]) -> int:
    """How many of ``prompt``'s tokens the server took from its prefix cache for a one-token completion."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        usage = json.loads(response.read())["usage"]
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def load(engine: RemoteEngine, weights: NamedTensors, paused: bool) -> None:
    """Load ``weights``, through a pause and resume of the server when ``paused``."""
    if paused:
        await sync_weights(weights, engine)
    else:
        await engine.update_weights(weights)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize(
    ("pause_mode", "paused"),
    [("wait", False), ("keep", True), ("wait", True)],
    # vLLM 0.32's /pause clears the cache itself; update_weights must not depend on being called inside one.
    ids=["no-pause", "pause-keep", "pause-wait"],
)
def test_update_weights_resets_the_server_prefix_cache(
    caching_server: str,
    tiny_model_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    trainer_logprobs: ForwardLogprobs,
    pause_mode: Literal["wait", "keep"],
    paused: bool,
) -> None:
    engine = RemoteEngine(caching_server, RemoteEngineConfig(dev_mode=True, pause_mode=pause_mode))
    restorer = RemoteEngine(caching_server, RemoteEngineConfig(dev_mode=True))  # "wait" pauses clear the cache
    trainer = load_model(tiny_model_dir)
    original = [(name, p.detach().clone()) for name, p in trainer.named_parameters()]
    prompt = long_prompt(tokenizer)
    greedy = SamplingParams(max_tokens=16, temperature=0.0, logprobs=True)

    def gap(out: GenerationOutput) -> float:
        assert out.logprobs is not None
        reference = trainer_logprobs(trainer, prompt, out.token_ids, 1.0)
        return float((torch.tensor(out.logprobs) - reference).abs().max())

    async def scenario() -> None:
        try:
            [before] = await engine.generate([prompt], greedy)
            assert gap(before) < TOLERANCE
            # Without a cache hit here the test would pass whether or not updates reset the cache.
            assert await asyncio.to_thread(cached_prompt_tokens, caching_server, prompt) >= CACHED_TOKENS
            await load(engine, perturbed_weights(trainer, seed=5), paused)  # the trainer now holds them too
            [after] = await engine.generate([prompt], greedy)
            assert after.logprobs != before.logprobs
            worst = gap(after)
            assert worst < TOLERANCE, f"logprobs after the update are off by {worst:.2e} from the new weights"
        finally:
            await sync_weights(original, restorer)  # the next case starts from the original weights, uncached
            await engine.close()
            await restorer.close()

    asyncio.run(scenario())


def test_a_failed_reset_fails_the_update(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A server that cannot reset its prefix cache fails the update rather than serve the old weights' cache."""
    calls: list[str] = []

    async def post(self: RemoteEngine, path: str, body: Any, query: dict[str, str] | None = None) -> Any:
        calls.append(path)
        return {"success": False} if path == "/reset_prefix_cache" else {"results": [0.0]}

    monkeypatch.setattr(RemoteEngine, "_post", post)
    engine = RemoteEngine("http://127.0.0.1:9", RemoteEngineConfig(dev_mode=True, transfer_dir=str(tmp_path)))
    with pytest.raises(RemoteEngineError, match="did not reset the prefix cache"):
        asyncio.run(engine.update_weights([("model.norm.weight", torch.ones(4))]))
    assert calls == ["/collective_rpc", "/reset_prefix_cache"]
    assert list(tmp_path.iterdir()) == []  # the transfer file is removed on failure too
