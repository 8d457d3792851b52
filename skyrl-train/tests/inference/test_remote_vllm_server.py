"""The remote engine against a real vLLM OpenAI-compatible server (a subprocess; ~40-60 s to start on CPU)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_train.inference.base import SamplingParams
from skyrl_train.inference.remote import RemoteEngine, RemoteEngineConfig
from skyrl_train.inference.vllm_worker_ext import EXTENSION_CLASS
from skyrl_train.inference.weight_sync import sync_weights

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the vLLM server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(1)
    pytest.fail(f"the vLLM server did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
        "--kv-cache-memory-bytes", str(128 * 2**20),
        "--logprobs-mode", "processed_logprobs",  # log_softmax(logits / T), what the trainer recomputes
        "--worker-extension-cls", EXTENSION_CLASS,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # exposes /pause, /resume and /collective_rpc
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log)
        yield url
    finally:
        process.terminate()  # SIGTERM stops the server and its engine-core child
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def test_generation_and_weight_sync_against_vllm(
    vllm_server: str, tiny_model_dir: Path, prompts: list[list[int]], trainer_logprobs, perturb
) -> None:
    engine = RemoteEngine(vllm_server, RemoteEngineConfig(dev_mode=True))
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = [(name, p.detach().clone()) for name, p in trainer.named_parameters()]
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=3)

    def gap(outputs: list) -> torch.Tensor:  # type: ignore[type-arg]
        return torch.cat(
            [
                (torch.tensor(out.logprobs) - trainer_logprobs(trainer, prompt, out.token_ids, 1.0)).abs()
                for prompt, out in zip(prompts, outputs, strict=True)
            ]
        )

    async def scenario() -> None:
        try:
            before = await engine.generate(prompts, params)
            assert all(0 < len(o.token_ids) <= 16 for o in before)
            assert gap(before).max() < 1e-4
            seconds = await sync_weights(perturb(trainer, seed=21), engine)
            after = await engine.generate(prompts, params)
            assert [o.logprobs for o in after] != [o.logprobs for o in before]
            mean, worst = gap(after).mean().item(), gap(after).max().item()
            print(f"vLLM server weight sync {seconds * 1000:.0f} ms; |rollout - trainer| {mean:.2e} (max {worst:.2e})")
            assert worst < 1e-4
        finally:
            await sync_weights(original, engine)
            await engine.close()

    asyncio.run(scenario())
