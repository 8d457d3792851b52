"""The skyrl-train bridge: TrainEngineClient on a real local engine, and AgentGenerator on shipped SWE tasks."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the skyrl-train bridge tests need torch (pip install ./skyrl-train)")
pytest.importorskip("skyrl_train", reason="the skyrl-train bridge tests need skyrl-train (pip install ./skyrl-train)")

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from skyrl_agent.agents.actions import SUBMIT, bash_block
from skyrl_agent.agents.swe_env import instructions
from skyrl_agent.dispatch import Backoff, DispatcherConfig, Episode, Timeouts
from skyrl_agent.integrations.skyrl_train import AgentGenerator, AgentGeneratorConfig, TrainEngineClient
from skyrl_agent.integrations.tokens import between_turns
from skyrl_agent.llm.base import Completion, LLMClient, LLMError, Prompt, SamplingParams
from skyrl_agent.llm.scripted import null_policy, oracle_replies
from skyrl_agent.pipeline import TASK_LABEL
from skyrl_agent.run import ORACLE_PATCH, make_llm
from skyrl_agent.sandbox.base import Sandbox, SandboxSpec, SandboxStartError, Snapshot
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import SWETask, load_suite
from skyrl_agent.testing import ByteChatTemplate
from skyrl_train.experience import to_experience
from skyrl_train.generators.base import Generator, GeneratorInput, GeneratorOutput
from skyrl_train.generators.chat import ChatEncoder
from skyrl_train.inference.base import SamplingParams as EngineParams
from skyrl_train.inference.local import LocalEngine
from skyrl_train.models.tiny import TinyModelSpec, build_tiny_model
from skyrl_train.timeline import Timeline

MAX_TURNS = 5
SUBMIT_REPLY = bash_block(SUBMIT)
CHAT = ByteChatTemplate()


def forward_logprobs(model: PreTrainedModel, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """What a trainer recomputes at temperature 1: log_softmax(logits) of ``tokens`` after ``prompt``."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


# -- TrainEngineClient on a real engine ------------------------------------------------------------------------


def test_train_engine_client_returns_the_engines_ids_and_logprobs(tiny_model_dir: Path) -> None:
    engine = LocalEngine.from_pretrained(tiny_model_dir)
    assert engine.tokenizer is not None
    chat = ChatEncoder(engine.tokenizer)
    client = TrainEngineClient(engine, chat)
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=5)
    direct_params = EngineParams(max_tokens=12, temperature=1.0, seed=5, stop_token_ids=(chat.end_of_turn_token_id,))

    async def main() -> tuple[Completion, Completion, list[Any]]:
        try:
            first = await client.complete(messages, params)
            direct = await engine.generate([chat.prompt_ids(messages)], direct_params)
            reply = {"role": "assistant", "content": first.text}
            second = await client.complete([*messages, reply, {"role": "user", "content": "and 5?"}], params)
        finally:
            await engine.close()
        with pytest.raises(LLMError, match=r"engine\.generate raised"):
            await client.complete(messages, params)  # a closed engine is the model side failing
        return first, second, direct

    first, second, direct = asyncio.run(main())
    assert first.prompt_token_ids == chat.prompt_ids(messages)
    assert first.token_ids == direct[0].token_ids  # the same request, the same seed: the same sample
    assert first.logprobs == direct[0].logprobs
    assert first.token_ids
    assert first.logprobs is not None
    assert len(first.logprobs) == len(first.token_ids)
    assert first.usage.prompt_tokens == len(first.prompt_token_ids)
    # The second prompt extends the first prompt and the ids sampled, never re-tokenising them.
    assert second.prompt_token_ids is not None
    observation = between_turns(chat, first.token_ids, [{"role": "user", "content": "and 5?"}])
    assert second.prompt_token_ids == first.prompt_token_ids + first.token_ids + observation
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for completion in (first, second):
        assert completion.prompt_token_ids is not None
        assert completion.token_ids
        assert completion.logprobs is not None
        expected = forward_logprobs(model, completion.prompt_token_ids, completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


def test_train_engine_client_reports_a_full_context_without_calling_the_engine() -> None:
    class NoEngine:
        async def generate(self, prompts: Any, params: Any) -> Any:
            raise AssertionError("a prompt that does not fit must not reach the engine")

    client = TrainEngineClient(NoEngine(), CHAT, max_input_length=10)  # type: ignore[arg-type]
    out = asyncio.run(client.complete([{"role": "user", "content": "a long question"}], SamplingParams()))
    assert (out.token_ids, out.finish_reason) == ([], "length")
    assert out.usage.prompt_tokens == len(CHAT.prompt_ids([{"role": "user", "content": "a long question"}]))


# -- AgentGenerator on the process backend with scripted policies ------------------------------------------------


def _batch(tasks: list[SWETask], samples: int, **params: Any) -> GeneratorInput:
    rows = [(task, k) for task in tasks for k in range(samples)]
    return GeneratorInput(
        prompts=[[] for _ in rows],
        env_classes=["swe"] * len(rows),
        env_extras=[{"task": task} for task, _ in rows],
        trajectory_ids=[f"{task.id}:{k}" for task, k in rows],
        sampling_params=EngineParams(**params),
    )


def _oracle_or_null(episode: Episode) -> LLMClient:
    """Sample 0 of every prompt runs the oracle, the others the null policy."""
    oracle = make_llm("scripted:oracle")
    return oracle(episode) if episode.id.endswith(":0") else null_policy()


def _fast(**timeouts: Any) -> AgentGeneratorConfig:
    backoff = Backoff(base_s=0.01, max_s=0.02, max_attempts=2)
    dispatcher = DispatcherConfig(backoff=backoff, timeouts=Timeouts(**timeouts))
    return AgentGeneratorConfig(max_turns=MAX_TURNS, dispatcher=dispatcher)


def _check_aligned(output: GeneratorOutput, n: int) -> None:
    assert len(output) == n == len(output.prompt_token_ids) == len(output.stop_reasons) == len(output.env_metrics)
    assert output.rollout_logprobs is not None
    for i in range(n):
        width = len(output.response_ids[i])
        assert len(output.loss_masks[i]) == len(output.rewards[i]) == len(output.rollout_logprobs[i]) == width
        assert output.prompt_token_ids[i]  # collating needs at least one prompt token


def test_generator_on_shipped_tasks_with_scripted_policies() -> None:
    tasks = load_suite()[:2]
    batch = _batch(tasks, samples=2)
    generator = AgentGenerator(ProcessBackend(), CHAT, llm=_oracle_or_null, config=_fast())
    assert isinstance(generator, Generator)
    output = asyncio.run(generator.generate(batch))
    _check_aligned(output, 4)
    assert output.trajectory_ids == batch.trajectory_ids
    assert output.stop_reasons == ["stop"] * 4
    assert output.metrics["agent/outcome/resolved/count"] == 2
    for i, tid in enumerate(output.trajectory_ids):
        task, oracle = tasks[i // 2], tid.endswith(":0")
        replies = oracle_replies(task.gold_patch, workdir=".", patch_path=ORACLE_PATCH) if oracle else [SUBMIT_REPLY]
        mask, response, logprobs = output.loss_masks[i], output.response_ids[i], output.rollout_logprobs[i]  # type: ignore[index]
        assert output.prompt_token_ids[i] == CHAT.prompt_ids(instructions(task, MAX_TURNS + 1))
        generated = [token for token, m in zip(response, mask, strict=True) if m]
        assert bytes(generated).decode() == "".join(replies)  # exactly the policy's tokens are trained on
        assert mask[-1] == 1  # the row ends on a generated token
        # Between turns: the observations (and an end-of-turn token the policy did not sample), untrained.
        assert (0 in mask) == (len(replies) > 1)
        assert all(lp == (-0.1 if m else 0.0) for lp, m in zip(logprobs, mask, strict=True))
        assert output.rewards[i][-1] == sum(output.rewards[i]) == (1.0 if oracle else 0.0)
        metrics = output.env_metrics[i]
        assert (metrics["outcome"], metrics["treatment"]) == (("resolved" if oracle else "unresolved"), "train")
        assert metrics["turns"] == len(replies)
    experience = to_experience(output, pad_token_id=0)  # the trainer can collate it
    assert experience.group_index.tolist() == [0, 0, 1, 1]  # the samples of one task form one group


def test_a_runs_timeline_gets_sandbox_env_and_reward_spans() -> None:
    tasks = load_suite()[:2]
    generator = AgentGenerator(ProcessBackend(), CHAT, llm=_oracle_or_null, config=_fast())
    timeline = Timeline()
    generator.timeline = timeline  # what a skyrl-train run does with a generator that has the attribute
    output = asyncio.run(generator.generate(_batch(tasks, samples=2)))
    count = Counter((span.lane, span.name) for span in timeline.spans)
    turns = sum(int(metrics["turns"]) for metrics in output.env_metrics)
    assert count[("sandbox", "start")] == count[("sandbox", "close")] == 4  # one sandbox per episode
    assert count[("env", "init")] == 4
    assert count[("env", "step")] == turns  # each tool call the agent made
    assert count[("reward", "grade")] == 4  # every episode submitted, and each submission was graded
    assert all(span.end >= span.start for span in timeline.spans)
    assert {"sandbox", "env", "reward"} <= set(timeline.lanes())


class FailingBackend:
    """The process backend, except that sandboxes for ``task_id`` never start."""

    name = "process"

    def __init__(self, task_id: str) -> None:
        self.inner, self.task_id, self.refused = ProcessBackend(), task_id, 0

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if spec.labels.get(TASK_LABEL) == self.task_id:
            self.refused += 1
            raise SandboxStartError(f"no sandbox for {self.task_id} today")
        return await self.inner.create(spec)

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[Sandbox]:
        return list(await self.inner.fork(snapshot, n, spec))

    async def close(self) -> None:
        await self.inner.close()


def test_sandbox_failure_is_masked_per_policy() -> None:
    broken, fine = load_suite()[:2]
    backend = FailingBackend(broken.id)
    batch = _batch([broken, fine], samples=2)
    generator = AgentGenerator(backend, CHAT, llm=_oracle_or_null, config=_fast())
    output = asyncio.run(generator.generate(batch))
    _check_aligned(output, 4)
    # acquire tries twice per attempt, and the policy re-runs a sandbox_error episode once (two attempts).
    assert backend.refused == 2 * 2 * 2
    for i in (0, 1):
        assert output.env_metrics[i]["outcome"] == "sandbox_error"
        assert output.env_metrics[i]["treatment"] == "mask"
        assert output.env_metrics[i]["attempts"] == 2
        assert output.stop_reasons[i] == "env_error"
        assert output.response_ids[i] == []
        assert output.rewards[i] == []
        assert output.prompt_token_ids[i] == CHAT.prompt_ids(instructions(broken, MAX_TURNS + 1))
    assert output.stop_reasons[2:] == ["stop", "stop"]
    assert sum(output.rewards[2]) == 1.0
    assert output.metrics["agent/treatment/mask/count"] == 2
    experience = to_experience(output, pad_token_id=0)
    groups = experience.group_index.tolist()
    assert groups[0] == groups[1] != groups[2] == groups[3]  # mini-batches keep whole prompts, failed rows too
    assert experience.failed.tolist() == [True, True, False, False]  # ... and the failed ones stay out of statistics


class SlowFirstCall:
    """Delegates to ``inner``; the first call waits ``delay_s`` wall seconds first (a model stuck mid-call)."""

    def __init__(self, inner: LLMClient, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.started = asyncio.Event()

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        if not self.started.is_set():
            self.started.set()
            await asyncio.sleep(self.delay_s)
        return await self.inner.complete(prompt, params)


@pytest.mark.slow
@pytest.mark.parametrize("paused", [True, False])
def test_time_paused_for_a_weight_sync_does_not_count_against_the_deadline(paused: bool) -> None:
    task = load_suite()[0]
    oracle = make_llm("scripted:oracle")
    slow: list[SlowFirstCall] = []

    def llm(episode: Episode) -> LLMClient:
        slow.append(SlowFirstCall(oracle(episode), delay_s=4.0))
        return slow[-1]

    generator = AgentGenerator(ProcessBackend(), CHAT, llm=llm, config=_fast(episode_s=3.0))

    async def main() -> GeneratorOutput:
        run = asyncio.create_task(generator.generate(_batch([task], samples=1)))
        while not slow:
            await asyncio.sleep(0.01)
        await slow[0].started.wait()
        if paused:  # what the trainer's weight sync does through generator.engine
            await generator.engine.pause()
            await asyncio.sleep(4.2)
            await generator.engine.resume()
        return await run

    output = asyncio.run(main())
    if paused:
        assert output.env_metrics[0]["outcome"] == "resolved"
        assert sum(output.rewards[0]) == 1.0
        assert generator.clock.paused_total_s >= 4.0
    else:  # the same stall without a pause passes the 3 s deadline
        assert output.env_metrics[0]["outcome"] == "timed_out"
        assert output.stop_reasons[0] == "timeout"
        assert sum(output.loss_masks[0]) == 0


# -- AgentGenerator on a real engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with room for an SWE prompt (about 800 tokens with its tokenizer)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-2k"), spec=TinyModelSpec(max_position_embeddings=2048))


@pytest.mark.slow
def test_generator_on_a_real_engine_trains_on_exactly_what_was_sampled(long_context_model: Path) -> None:
    engine = LocalEngine.from_pretrained(long_context_model)
    assert engine.tokenizer is not None
    config = dataclasses.replace(_fast(), max_turns=2, max_input_length=2048)
    generator = AgentGenerator(ProcessBackend(), ChatEncoder(engine.tokenizer), engine=engine, config=config)
    batch = _batch(load_suite()[:1], samples=2, max_tokens=16, temperature=1.0, seed=3)

    async def main() -> GeneratorOutput:
        try:
            return await generator.generate(batch)
        finally:
            await engine.close()

    output = asyncio.run(main())
    _check_aligned(output, 2)
    # A random model writes no valid action: two malformed turns, then the turn limit (zero reward, trained).
    assert output.stop_reasons == ["max_turns", "max_turns"]
    assert [m["treatment"] for m in output.env_metrics] == ["zero_reward", "zero_reward"]
    assert output.response_ids[0] != output.response_ids[1]  # the two samples drew different noise
    model = AutoModelForCausalLM.from_pretrained(long_context_model, dtype=torch.float32).eval()
    for prompt, response, mask, logprobs in zip(
        output.prompt_token_ids, output.response_ids, output.loss_masks, output.rollout_logprobs or [], strict=True
    ):
        assert 0 in mask  # the observation between the two turns
        assert 1 in mask
        # Recomputed over the row as the trainer sees it, the generated tokens' logprobs are the engine's: the
        # second turn was sampled after exactly these ids.
        recomputed = forward_logprobs(model, prompt, response)
        trained = torch.tensor(mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(logprobs)[trained], recomputed[trained], atol=1e-4, rtol=0)
