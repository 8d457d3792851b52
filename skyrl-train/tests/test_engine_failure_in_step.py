"""An engine actor killed in the middle of a training step: the step completes, and training goes on.

The engine is an :class:`~skyrl_train.inference.ray_engines.EngineGroup` of two local-engine actors; the policy
is the tiny model in this process, the rollouts real (:class:`SkyRLGymGenerator` over a registered env). Step 0
runs plainly; in step 1 one engine actor is killed while every request of the step is in flight; step 2 runs
after the weight sync that follows. The killed engine is restarted by Ray, its requests are retried on it once it
has the latest weights, and from then on it serves what the surviving engine serves.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_train.algorithms import PolicyLossConfig
from skyrl_train.backends import BackendConfig, TorchBackend
from skyrl_train.backends.config import OptimizerConfig
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.generators import FAILURE_STOP_REASONS
from skyrl_train.generators.base import GeneratorInput, GeneratorOutput
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig, SkyRLGymGenerator
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.local import LocalEngine
from skyrl_train.objective import Objective
from skyrl_train.trainer import LoopSettings, Metrics, Trainer

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.inference.ray_engines import EngineGroup  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ENV_ID = "test_engine_failure_chars"
PROMPTS, SAMPLES = 2, 2  # 4 trajectories a step, one mini-batch
PARAMS = SamplingParams(max_tokens=6, logprobs=True)
PROBE = SamplingParams(max_tokens=8, temperature=1.0, logprobs=True, seed=11)  # compares engines after the run
ALL_HELD_TIMEOUT_S = 120.0  # for every request of the step to reach a (paused) engine
STEP_TIMEOUT_S = 300.0  # for the step to finish after the kill: the restart loads the model again


class DistinctCharsEnv(BaseTextEnv):
    """Reward = distinct characters of the answer: varies across samples, so GRPO has a signal on the tiny model."""

    def __init__(self, env_config: object = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(observations=[], reward=min(len(set(action)), 20) / 20, done=True, metadata={})


class RecordingGenerator:
    """The real generator; keeps each step's output for the test to read."""

    def __init__(self, inner: SkyRLGymGenerator) -> None:
        self.inner = inner
        self.outputs: list[GeneratorOutput] = []

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        output = await self.inner.generate(batch)
        self.outputs.append(output)
        return output


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _env_registered() -> Iterator[None]:
    skyrl_gym.register(id=ENV_ID, entry_point=DistinctCharsEnv)
    yield
    skyrl_gym.deregister(ENV_ID)


def _prompts(step: int) -> list[PromptRecord]:
    return [
        PromptRecord([{"role": "user", "content": f"Say {step}-{k}."}], ENV_ID, {}, f"s{step}p{k}")
        for k in range(PROMPTS)
    ]


def _trainer(model_dir: Path, group: EngineGroup) -> tuple[Trainer, RecordingGenerator]:
    policy = TorchBackend(
        BackendConfig(
            str(model_dir),
            gradient_checkpointing=False,
            micro_train_batch_size=PROMPTS * SAMPLES,
            micro_forward_batch_size=PROMPTS * SAMPLES,
            optimizer=OptimizerConfig(lr=1e-3, scheduler="constant"),
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generator = RecordingGenerator(SkyRLGymGenerator(group, tokenizer, GeneratorConfig()))
    trainer = Trainer(
        settings=LoopSettings(n_samples_per_prompt=SAMPLES, policy_mini_batch_size=PROMPTS, seed=3),
        objective=Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig()),
        policy=policy,
        engine=group,
        generator=generator,
        sampling_params=PARAMS,
        eval_sampling_params=PARAMS,
        pad_token_id=int(tokenizer.pad_token_id or 0),
    )
    return trainer, generator


async def _kill_the_busiest_once_all_are_held(group: EngineGroup, requests: int) -> int:
    """Once ``requests`` requests are in flight on the (paused) engines, kill the one holding most; return its count.

    The engines were paused before the step, so none can answer before the kill: the killed engine's requests are
    certainly in flight when it dies, however fast the tiny model samples. The other engines are resumed after.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ALL_HELD_TIMEOUT_S
    while sum(group.router.in_flight) < requests:
        if loop.time() > deadline:
            raise AssertionError(f"only {group.router.in_flight} of {requests} requests reached the engines")
        await asyncio.sleep(0.01)
    victim = max(range(group.num_engines), key=group.router.in_flight.__getitem__)
    held = group.router.in_flight[victim]
    ray.kill(group.engines[victim], no_restart=False)  # the process dies; Ray restarts the actor
    await asyncio.gather(*(group.engines[i].resume.remote() for i in range(group.num_engines) if i != victim))
    return held


async def _step_with_a_killed_engine(
    trainer: Trainer, group: EngineGroup, prompts: list[PromptRecord]
) -> tuple[Metrics, int]:
    """The step's metrics, and how many of its requests the killed engine held."""
    await group.pause()
    killer = asyncio.ensure_future(_kill_the_busiest_once_all_are_held(group, len(prompts) * SAMPLES))
    step = asyncio.ensure_future(trainer.train_step(prompts))
    try:
        held = await killer
    except BaseException:
        step.cancel()  # held on paused engines, the step would never end
        raise
    return await asyncio.wait_for(step, STEP_TIMEOUT_S), held


async def _probe(engine: Any, prompt: list[int]) -> GenerationOutput:
    """One seeded completion from an engine actor directly (not through the group's router)."""
    (output,) = await engine.generate.remote([prompt], PROBE)
    return output  # type: ignore[no-any-return]


async def _reference(
    model_dir: Path, prompt: list[int], weights: list[tuple[str, torch.Tensor]] | None
) -> GenerationOutput:
    """The probe's completion from a local engine in this process, on ``weights`` (None: the initial model)."""
    engine = LocalEngine.from_pretrained(model_dir)
    try:
        if weights is not None:
            await engine.update_weights(weights)
        (output,) = await engine.generate([prompt], PROBE)
        return output
    finally:
        await engine.close()


def _assert_finite(metrics: Metrics) -> None:
    bad = {key: value for key, value in metrics.items() if not math.isfinite(value)}
    assert not bad, bad


def _assert_every_trajectory_answered(output: GeneratorOutput) -> None:
    failed = [
        (t, r) for t, r in zip(output.trajectory_ids, output.stop_reasons, strict=True) if r in FAILURE_STOP_REASONS
    ]
    assert not failed, failed
    assert all(len(response) > 0 for response in output.response_ids), output.response_ids


def _differ(a: GenerationOutput, b: GenerationOutput) -> bool:
    """Whether two seeded completions of one prompt tell their weights apart (other tokens or log-probs)."""
    if a.token_ids != b.token_ids:
        return True
    return max(abs(x - y) for x, y in zip(a.logprobs or [], b.logprobs or [], strict=True)) > 1e-3


def test_a_step_with_a_killed_engine_completes_and_the_restarted_engine_serves_the_new_weights(
    cluster: None, tiny_model_dir: Path
) -> None:
    async def scenario() -> dict[str, Any]:
        group = EngineGroup("local", str(tiny_model_dir), 2, num_cpus_per_engine=0.5)
        trainer, generator = _trainer(tiny_model_dir, group)
        try:
            before = await trainer.train_step(_prompts(0))
            restarts_before = group.restarts
            killed, held = await _step_with_a_killed_engine(trainer, group, _prompts(1))
            restarts_after_kill = group.restarts
            after = await trainer.train_step(_prompts(2))
            prompt = generator.outputs[-1].prompt_token_ids[0]
            probes = [await _probe(engine, prompt) for engine in group.engines]
            in_flight = list(group.router.in_flight)
            trained = trainer.policy.get_weights()
        finally:
            await group.close()
            generator.inner.close()
        return {
            "metrics": [before, killed, after],
            "outputs": generator.outputs,
            "restarts": (restarts_before, restarts_after_kill, group.restarts),
            "held": held,
            "probes": probes,
            "in_flight": in_flight,
            "expected": await _reference(tiny_model_dir, prompt, list(trained)),
            "initial": await _reference(tiny_model_dir, prompt, None),
        }

    got = asyncio.run(scenario())
    restarts_before, restarts_after_kill, restarts_at_end = got["restarts"]
    assert restarts_before == 0
    assert restarts_after_kill == got["held"] >= 1  # each request on the killed engine was sent again, once
    assert restarts_at_end == restarts_after_kill
    assert got["in_flight"] == [0, 0]
    for metrics in got["metrics"]:
        _assert_finite(metrics)
        assert metrics["policy/optimizer_steps"] == 1.0
        # The engines sample with the weights the trainer computes log-probs with: the restarted engine was given
        # step 0's weights before its requests were retried, and step 1's with the other engine.
        assert metrics["policy/rollout_logprob_gap"] < 1e-3
    assert len(got["outputs"]) == 3
    for output in got["outputs"]:
        _assert_every_trajectory_answered(output)
    expected, initial = got["expected"], got["initial"]
    for probe in got["probes"]:  # both engines, the restarted one included, serve the trained weights
        assert probe.token_ids == expected.token_ids
        assert probe.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert _differ(expected, initial)  # the comparison above tells trained weights from the initial ones
