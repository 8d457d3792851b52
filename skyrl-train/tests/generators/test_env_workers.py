"""Envs in Ray actors (``EnvWorkers``): the same trajectories as in-process, in other processes, failures contained."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_train.generators import GeneratorInput, GeneratorOutput
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig, SkyRLGymGenerator
from skyrl_train.generators.testing import ScriptedEngine, by_marker
from skyrl_train.inference.base import SamplingParams

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.generators.env_workers import EnvWorkers  # noqa: E402

pytestmark = pytest.mark.ray
ENV_ID = "test_worker_env"


class WorkerEnv(BaseTextEnv):
    """Reward = length of the answer / 10; ``extras["fail"]`` raises in step, ``extras["sleep_s"]`` blocks first."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.extras = dict(extras or {})

    def step(self, action: str) -> BaseTextEnvStepOutput:
        time.sleep(float(self.extras.get("sleep_s", 0)))
        if self.extras.get("fail"):
            raise RuntimeError("the env broke")
        return BaseTextEnvStepOutput(observations=[], reward=len(action) / 10, done=True, metadata={})

    def get_metrics(self) -> dict[str, Any]:
        return {"pid": os.getpid()}


def register_worker_env() -> None:
    """Runs in each worker (and here): the test's env in that process's registry."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(ENV_ID, entry_point=WorkerEnv)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    register_worker_env()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    skyrl_gym.deregister(ENV_ID)


def _batch(extras: list[dict[str, Any]]) -> GeneratorInput:
    return GeneratorInput(
        prompts=[[{"role": "user", "content": f"Task {i}."}] for i in range(len(extras))],
        env_classes=[ENV_ID] * len(extras),
        env_extras=extras,
        trajectory_ids=[f"t{i}:0" for i in range(len(extras))],
        sampling_params=SamplingParams(max_tokens=16),
    )


def _generate(tokenizer: PreTrainedTokenizerBase, batch: GeneratorInput, **kwargs: Any) -> GeneratorOutput:
    engine = ScriptedEngine(tokenizer, by_marker({"Task 1.": ["a longer answer"]}, default="short"))
    generator = SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(timeout_s=20), **kwargs)
    return asyncio.run(generator.generate(batch))


def test_envs_in_workers_give_the_in_process_trajectories(cluster: None, tokenizer: PreTrainedTokenizerBase) -> None:
    batch = _batch([{} for _ in range(6)])
    workers = EnvWorkers(2, num_cpus_per_worker=0.5, setup=register_worker_env)
    try:
        remote = _generate(tokenizer, batch, env_workers=workers)
        worker_pids = set(ray.get([w.pid.remote() for w in workers.workers]))
        assert workers.live == [0, 0]  # every env was closed
    finally:
        workers.close()
    local = _generate(tokenizer, batch)
    assert remote.stop_reasons == ["stop"] * 6
    assert remote.rewards == local.rewards
    assert remote.response_ids == local.response_ids
    pids = {metrics["pid"] for metrics in remote.env_metrics}
    assert pids == worker_pids  # both workers took envs, none ran here
    assert os.getpid() not in pids


def test_a_failing_env_and_a_dead_worker_fail_only_their_trajectories(
    cluster: None, tokenizer: PreTrainedTokenizerBase
) -> None:
    workers = EnvWorkers(2, num_cpus_per_worker=0.5, setup=register_worker_env)
    try:
        # Envs alternate between the two workers: 0, 2, 4 on worker 0 (killed while they sleep), 1, 3 on worker 1.
        extras: list[dict[str, Any]] = [{"sleep_s": 3}, {}, {"sleep_s": 3}, {"fail": True}, {"sleep_s": 3}]

        async def scenario() -> GeneratorOutput:
            engine = ScriptedEngine(tokenizer, by_marker({}, default="answer"))
            generator = SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(timeout_s=30), env_workers=workers)
            running = asyncio.ensure_future(generator.generate(_batch(extras)))
            await asyncio.sleep(1.5)
            ray.kill(workers.workers[0])
            return await running

        out = asyncio.run(scenario())
    finally:
        workers.close()
    assert out.stop_reasons == ["env_error", "stop", "env_error", "env_error", "env_error"]
    assert out.rewards[1][-1] == pytest.approx(0.6)  # the survivor on worker 1: "answer" earns 6 / 10
