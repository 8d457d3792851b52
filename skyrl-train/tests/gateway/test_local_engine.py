"""The gateway in front of the real tiny torch model (LocalEngine): what is recorded is what the model saw."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.local import LocalEngine


class Recording:
    """A LocalEngine that keeps every prompt it was asked to continue and every output it returned."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.max_model_len = engine.max_model_len
        self.prompts: list[list[int]] = []
        self.outputs: list[GenerationOutput] = []

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        outputs = await self.engine.generate(prompts, params)
        self.prompts += [list(p) for p in prompts]
        self.outputs += outputs
        return outputs

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        await self.engine.update_weights(weights)

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self) -> None:
        await self.engine.resume()

    async def close(self) -> None:
        await self.engine.close()


def test_tiny_model_episode_is_recorded_as_sampled(
    serve: Any, check_recording: Any, tiny_model_dir: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = Recording(LocalEngine.from_pretrained(tiny_model_dir))
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    sdk = openai.OpenAI(base_url=handle.base_url, api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is 3 + 4?"}]
    for turn in range(3):
        answer = sdk.chat.completions.create(
            model="policy", messages=messages, max_tokens=10, temperature=0.8, seed=turn, logprobs=True
        )
        assert [e.logprob for e in answer.choices[0].logprobs.content] == engine.outputs[-1].logprobs
        messages += [answer.choices[0].message.model_dump(), {"role": "user", "content": f"Check {turn}."}]
    stream = sdk.chat.completions.create(model="policy", messages=messages, max_tokens=6, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == tokenizer.decode(engine.outputs[-1].token_ids, skip_special_tokens=True)
    assert served.gateway.session(handle.session_id).counts.messages == 3
    [sample] = served.gateway.close_session(handle.session_id)
    check_recording(sample, engine)

    # The recorded sequence is the one the model was conditioned on: a trainer's forward pass over it gives back
    # the log-probabilities the engine reported (temperature 0.8 for the first three replies, 1.0 for the last).
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(sample.prompt_ids) - 1 : -1]
    for k, turn_record in enumerate(sample.turns):
        temperature = 0.8 if k < 3 else 1.0
        span = slice(turn_record.start, turn_record.end)
        scaled = torch.log_softmax(logits[span] / temperature, dim=-1)
        expected = scaled.gather(1, torch.tensor(sample.response_ids[span])[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(sample.logprobs[span]), expected, atol=1e-4, rtol=0)


def test_requests_wait_for_a_paused_local_engine(
    serve: Any, tiny_model_dir: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    engine = LocalEngine.from_pretrained(tiny_model_dir)
    served = serve(engine, tokenizer)
    handle = served.gateway.open_session()
    sdk = openai.OpenAI(base_url=handle.base_url, api_key="unused", max_retries=0)
    served.loop.run(engine.pause())
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            sdk.chat.completions.create, model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        time.sleep(0.5)
        assert not held.done()
        assert engine.stats.sequences == 0
        served.loop.run(engine.resume())
        answer = held.result(timeout=60)
    assert answer.choices[0].finish_reason in ("stop", "length")
    [sample] = served.gateway.close_session(handle.session_id)
    assert sum(sample.loss_mask) == answer.usage.completion_tokens
