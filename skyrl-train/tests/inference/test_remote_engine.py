"""The remote engine against a real HTTP server (aiohttp, on a thread) that serves a LocalEngine."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_train.inference.base import InferenceEngine, SamplingParams
from skyrl_train.inference.remote import (
    RemoteEngine,
    RemoteEngineConfig,
    RemoteRequestError,
    RemoteUnavailableError,
    RetryPolicy,
    Timeouts,
    WeightUpdateUnsupportedError,
    completion_body,
    parse_completion,
)

FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.05)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def engine_for(server, **options: object) -> RemoteEngine:  # type: ignore[no-untyped-def]
    return RemoteEngine(server.url, RemoteEngineConfig(retry=FAST_RETRY, **options))  # type: ignore[arg-type]


async def generate_and_close(engine: RemoteEngine, prompts: list[list[int]], params: SamplingParams):  # type: ignore[no-untyped-def]
    try:
        return await engine.generate(prompts, params)
    finally:
        await engine.close()


def test_round_trip_returns_token_ids_and_logprobs(
    completions_server, tiny_model_dir: Path, prompts: list[list[int]], trainer_logprobs
) -> None:
    engine = engine_for(completions_server)
    assert isinstance(engine, InferenceEngine)
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=3)
    outputs = run(generate_and_close(engine, prompts, params))
    again = run(generate_and_close(engine, prompts, params))  # a second event loop: a new session
    assert [o.token_ids for o in outputs] == [o.token_ids for o in again]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outputs, strict=True):
        assert len(out.token_ids) == 12 or out.stop_reason == "stop"
        expected = trainer_logprobs(model, prompt, out.token_ids, 0.8)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-5, rtol=0)
    assert engine._model == completions_server.model_name  # discovered through GET /v1/models


def test_transient_failures_are_retried(completions_server, prompts: list[list[int]]) -> None:
    completions_server.fail_next = 2
    before = completions_server.completion_requests
    outputs = run(generate_and_close(engine_for(completions_server), prompts[:1], SamplingParams(max_tokens=2)))
    assert len(outputs[0].token_ids) <= 2
    assert completions_server.completion_requests - before == 3

    completions_server.fail_next = 10
    with pytest.raises(RemoteUnavailableError, match="503"):
        run(generate_and_close(engine_for(completions_server), prompts[:1], SamplingParams(max_tokens=2)))
    completions_server.fail_next = 0


def test_client_errors_are_not_retried(completions_server, prompts: list[list[int]]) -> None:
    before = completions_server.completion_requests
    with pytest.raises(RemoteRequestError) as caught:
        run(generate_and_close(engine_for(completions_server), prompts[:1], SamplingParams(top_p=0.0)))
    assert caught.value.status == 400
    assert completions_server.completion_requests - before == 1


def test_concurrency_is_bounded(completions_server, prompts: list[list[int]]) -> None:
    completions_server.max_in_flight = 0
    engine = engine_for(completions_server, max_concurrency=2)
    outputs = run(generate_and_close(engine, prompts * 4, SamplingParams(max_tokens=4)))
    assert len(outputs) == 16
    assert completions_server.max_in_flight <= 2


def test_unreachable_server_fails_after_retries(prompts: list[list[int]]) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = RemoteEngineConfig(model="m", retry=FAST_RETRY, timeouts=Timeouts(connect=2.0, read=5.0))
    with pytest.raises(RemoteUnavailableError, match="3 times"):
        run(generate_and_close(RemoteEngine(f"http://127.0.0.1:{port}", config), prompts[:1], SamplingParams()))


def test_request_timeout_s_bounds_a_stalled_request(completions_server, prompts: list[list[int]]) -> None:
    from skyrl_train.config import load_config, resolve
    from skyrl_train.inference.factory import create_engine
    from skyrl_train.wiring import engine_settings

    def remote_engine(timeout_s: float) -> InferenceEngine:
        overrides = [
            "inference.engine=remote",
            f"inference.remote_urls=[{completions_server.url}]",
            f"inference.request_timeout_s={timeout_s}",
            f"model.path={completions_server.model_name}",
        ]
        settings = engine_settings(resolve(load_config(None, overrides)))
        return create_engine(settings.kind, settings.model_path, **{**settings.options, "retry": FAST_RETRY})

    completions_server.stall_s = 2.0  # the server answers every completion after 2 s
    try:
        before = completions_server.completion_requests
        started = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match="Timeout"):
            run(generate_and_close(remote_engine(0.2), prompts[:1], SamplingParams(max_tokens=2)))
        assert time.monotonic() - started < 1.5  # three attempts of 0.2 s each, not one of 2 s
        assert completions_server.completion_requests - before == 3
        outputs = run(generate_and_close(remote_engine(10.0), prompts[:1], SamplingParams(max_tokens=2)))
        assert len(outputs[0].token_ids) <= 2
    finally:
        completions_server.stall_s = 0.0


def test_update_weights_needs_dev_mode(completions_server) -> None:
    with pytest.raises(NotImplementedError, match="VLLM_SERVER_DEV_MODE"):
        run(engine_for(completions_server).update_weights([]))
    assert issubclass(WeightUpdateUnsupportedError, NotImplementedError)


def test_dev_mode_pause_resume_and_weight_update(
    completions_server, tiny_model_dir: Path, prompts: list[list[int]], trainer_logprobs, perturb, tmp_path: Path
) -> None:
    from skyrl_train.inference.weight_sync import sync_weights

    engine = engine_for(completions_server, dev_mode=True, transfer_dir=str(tmp_path))
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    original = [(name, p.detach().clone()) for name, p in trainer.named_parameters()]
    weights = perturb(trainer, seed=5)
    params = SamplingParams(max_tokens=10, seed=1)

    async def scenario() -> None:
        try:
            await engine.pause()
            held = asyncio.create_task(engine.generate(prompts[:1], params))
            await asyncio.sleep(0.2)
            assert not held.done()
            await engine.resume()
            await held
            completions_server.control_calls.clear()
            seconds = await sync_weights(weights, engine)
            assert seconds > 0
            assert completions_server.control_calls == [
                "pause:wait",
                "rpc:skyrl_load_weights_from_file",
                "reset_prefix_cache",
                "resume",
            ]
            assert list(tmp_path.iterdir()) == []  # the transfer file is removed afterwards
            outputs = await engine.generate(prompts, params)
            for prompt, out in zip(prompts, outputs, strict=True):
                expected = trainer_logprobs(trainer, prompt, out.token_ids, 1.0)
                torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-5, rtol=0)
        finally:
            await engine.update_weights(original)
            await engine.close()

    run(scenario())


def test_body_and_parsing_follow_vllm() -> None:
    params = SamplingParams(max_tokens=3, temperature=0.5, stop=("x",), seed=None, logprobs=True)
    body = completion_body([1, 2], params, seed=7, model="m")
    assert body["prompt"] == [1, 2]
    assert body["seed"] == 7
    assert body["logprobs"] == 0
    assert body["top_k"] == -1
    assert body["return_token_ids"]
    assert body["return_tokens_as_token_ids"]
    assert body["include_stop_str_in_output"]
    answer = {
        "choices": [
            {
                "text": "ab",
                "logprobs": {"tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.5, -1.5]},
                "finish_reason": "length",
            }
        ]
    }
    out = parse_completion(answer, want_logprobs=True)  # no token_ids field: recovered from "token_id:<id>"
    assert (out.token_ids, out.logprobs, out.stop_reason, out.text) == ([5, 9], [-0.5, -1.5], "length", "ab")
