"""Weight sync by broadcast from an FSDP2 group's rank 0 to engine actors (and to an engine in this process).

An engine that received the weights this way must sample exactly what an engine given ``policy.get_weights()``
samples; a killed engine actor must get the latest weights again, whether it died between syncs or before one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyrl_train.algorithms import PolicyLossConfig
from skyrl_train.backends.config import BackendConfig, OptimizerConfig
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.local import LocalEngine
from skyrl_train.objective import Objective, make_loss_fn

from .conftest import build_rl_batch

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig  # noqa: E402
from skyrl_train.inference.broadcast_sync import BroadcastSync, LocalReceiver  # noqa: E402
from skyrl_train.inference.ray_engines import EngineGroup  # noqa: E402

pytestmark = pytest.mark.ray

PROMPTS = [[5, 17, 30 + k, 44, 9] for k in range(4)]
PARAMS = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
OBJECTIVE = Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig(loss_reduction="sequence_mean"))
BUCKET_BYTES = 64 * 1024  # the small model is ~0.5 MB: several buckets


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def policy(cluster: None, small_model_dir: Path) -> Iterator[FSDPBackend]:
    config = BackendConfig(
        str(small_model_dir),
        gradient_checkpointing=False,
        micro_train_batch_size=2,
        optimizer=OptimizerConfig(lr=5e-2, scheduler="constant"),
    )
    group = FSDPBackend(config, WorkerGroupConfig(num_workers=2, num_cpus_per_worker=0.25))
    yield group
    group.close()


def _train(policy: FSDPBackend, seed: int) -> None:
    """One PPO step with a large learning rate: the weights move far enough to change what is sampled."""
    policy.forward_backward(build_rl_batch(4, seed, OBJECTIVE), make_loss_fn(OBJECTIVE))
    policy.optim_step()


def _tokens(outputs: list[GenerationOutput]) -> list[list[int]]:
    return [output.token_ids for output in outputs]


async def _reference(policy: FSDPBackend, model_dir: Path, params: SamplingParams = PARAMS) -> list[list[int]]:
    """What an engine given the policy's weights the default way samples."""
    engine = LocalEngine.from_pretrained(model_dir)
    try:
        await engine.update_weights(policy.get_weights())
        return _tokens(await engine.generate(PROMPTS, params))
    finally:
        await engine.close()


async def _push(sync: BroadcastSync, engines: EngineGroup) -> int:
    await engines.pause()
    try:
        return await sync.push()
    finally:
        await engines.resume()


def test_engine_actors_receive_what_get_weights_gives(policy: FSDPBackend, small_model_dir: Path) -> None:
    async def scenario() -> None:
        engines = EngineGroup("local", str(small_model_dir), 2, num_cpus_per_engine=0.25)
        try:
            untrained = _tokens(await engines.generate(PROMPTS, PARAMS))
            sync = BroadcastSync(policy, engines, bucket_bytes=BUCKET_BYTES)
            for step in range(2):
                _train(policy, seed=step)
                sent = await _push(sync, engines)
                assert sync.plan is not None
                assert len(sync.plan.buckets) > 2
                assert sent >= sync.nbytes > 0
                got = _tokens(await engines.generate(PROMPTS, PARAMS))
                assert got == await _reference(policy, small_model_dir)
            assert got != untrained  # the training moved the weights, and the engines have the moved ones
            assert engines.version == 2
            assert sync.reforms == 0

            # An engine killed between syncs: the next sync finds the group broken, forms it again and sends.
            ray.kill(engines.engines[0], no_restart=False)
            _train(policy, seed=5)
            await _push(sync, engines)
            assert sync.reforms == 1
            assert _tokens(await engines.generate(PROMPTS, PARAMS)) == await _reference(policy, small_model_dir)

            # An engine killed while it generates: its requests wait until it is back with the latest weights.
            long = SamplingParams(max_tokens=40, temperature=1.0, seed=3)
            await engines.pause()  # the requests are held on the engines: the kill surely finds some there
            running = asyncio.ensure_future(engines.generate(PROMPTS, long))
            while sum(engines.router.in_flight) < len(PROMPTS):
                await asyncio.sleep(0.01)
            busiest = max(range(2), key=lambda i: engines.router.in_flight[i])
            ray.kill(engines.engines[busiest], no_restart=False)
            await engines.resume()
            outputs = await asyncio.wait_for(running, timeout=120)
            assert engines.restarts >= 1
            assert sync.reforms == 2
            assert _tokens(outputs) == await _reference(policy, small_model_dir, long)
        finally:
            await engines.close()

    asyncio.run(scenario())


def test_an_engine_in_this_process_receives_as_one_rank(policy: FSDPBackend, small_model_dir: Path) -> None:
    """Two syncs take turns with one sender: each forms its group again when the other took rank 0 over."""

    async def scenario() -> None:
        first, second = LocalEngine.from_pretrained(small_model_dir), LocalEngine.from_pretrained(small_model_dir)
        try:
            syncs = [
                BroadcastSync(policy, LocalReceiver(engine), bucket_bytes=BUCKET_BYTES) for engine in (first, second)
            ]
            for step, sync in enumerate([syncs[0], syncs[1], syncs[0]]):
                _train(policy, seed=9 + step)
                await asyncio.wait_for(sync.push(), timeout=120)  # a sync sending into the wrong group would hang
                engine = sync.receiver.engine  # type: ignore[attr-defined]
                assert _tokens(await engine.generate(PROMPTS, PARAMS)) == await _reference(policy, small_model_dir)
            assert [sync.reforms for sync in syncs] == [0, 0]  # taking turns is not a failure
        finally:
            await first.close()
            await second.close()

    asyncio.run(scenario())
