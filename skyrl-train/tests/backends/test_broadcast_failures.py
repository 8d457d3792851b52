"""Weight broadcast under failures: an engine that dies during the trainer's update, and one that dies inside the
broadcast itself.

- In the async modes the engines generate (and may die) while the trainer updates the policy's ranks. The reload
  that a restarted engine asks for must not read the ranks' weights then: it waits for the update
  (``BroadcastSync.updating``, held as the trainer holds it) and sends the updated weights, with their version.
- A receiver killed while the bytes of a bucket flow leaves the sender's collective waiting for it (gloo notices
  only on its timeout, 600 s by default). The driver sees the actor die and aborts the group; the sync forms it
  again and every engine ends with the new weights, in far less time.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_train.algorithms import PolicyLossConfig
from skyrl_train.backends.config import BackendConfig, OptimizerConfig
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.local import LocalEngine
from skyrl_train.models.tiny import TinyModelSpec, build_tiny_model
from skyrl_train.objective import Objective, make_loss_fn
from skyrl_train.tensor_broadcast import BroadcastGroup, BucketPlan, GroupAddress, TensorSpec, join, specs_of

from .conftest import build_rl_batch

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig  # noqa: E402
from skyrl_train.inference.broadcast_sync import BroadcastSync  # noqa: E402
from skyrl_train.inference.ray_engines import EngineGroup  # noqa: E402
from skyrl_train.inference.versioned import VersionedEngine  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROMPTS = [[5, 17, 30 + k, 44, 9] for k in range(4)]
PARAMS = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
OBJECTIVE = Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig(loss_reduction="sequence_mean"))
BUCKET_BYTES = 64 * 1024
WAIT_S = 120.0  # for anything the test waits on (a restart loads a model)
# ≈38 M parameters (≈150 MB in float32): one bucket whose bytes take a good fraction of a second to flow.
LARGE = TinyModelSpec(
    hidden_size=1024,
    intermediate_size=2048,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    corpus_lines=500,
)
RECOVERY_S = 120.0  # far below the group's 600 s timeout, which the sync used to wait out


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


@pytest.fixture(scope="module")
def large_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("large-model"), seed=0, spec=LARGE)


def _train(policy: FSDPBackend, seed: int) -> None:
    """One PPO step with a large learning rate: the weights move far enough to change what is sampled."""
    policy.forward_backward(build_rl_batch(4, seed, OBJECTIVE), make_loss_fn(OBJECTIVE))
    policy.optim_step()


def _tokens(outputs: list[GenerationOutput]) -> list[list[int]]:
    return [output.token_ids for output in outputs]


async def _sampled_with(model_dir: Path, weights: list[tuple[str, torch.Tensor]]) -> list[list[int]]:
    """What an engine given ``weights`` directly samples."""
    engine = LocalEngine.from_pretrained(model_dir)
    try:
        await engine.update_weights(weights)
        return _tokens(await engine.generate(PROMPTS, PARAMS))
    finally:
        await engine.close()


async def _until(condition: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    """Return once ``condition()`` (a value, or something to await) is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not await _value(condition()):
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting until {what}")
        await asyncio.sleep(0.01)


async def _value(value: bool | Awaitable[bool]) -> bool:
    return bool(await value) if inspect.isawaitable(value) else bool(value)


async def _loaded_versions(engines: EngineGroup) -> list[int]:
    return list(await asyncio.gather(*(handle.loaded_version.remote() for handle in engines.engines)))


# -- an engine dies during the update -------------------------------------------------------------------------


def test_a_reload_asked_for_during_an_update_waits_for_it_and_sends_the_updated_weights(
    policy: FSDPBackend, small_model_dir: Path
) -> None:
    async def scenario() -> tuple[list[GenerationOutput], list[list[int]], BroadcastSync, EngineGroup]:
        engines = EngineGroup("local", str(small_model_dir), 2, num_cpus_per_engine=0.25, options={"pause_at": "token"})
        engine = VersionedEngine(engines)  # as a fully_async run serves the group: tokens carry their version
        sync = BroadcastSync(policy, engines, bucket_bytes=BUCKET_BYTES)
        try:
            _train(policy, seed=0)
            await engine.pause()  # the trainer's sync of step 0
            await sync.push()
            engine.version = 1
            await engine.resume()

            await engine.pause()  # requests held on the engines, so that they are surely there when the engines die
            running = asyncio.ensure_future(engines.generate(PROMPTS, PARAMS))
            await _until(lambda: sum(engines.router.in_flight) == len(PROMPTS), "the requests are held")
            async with sync.updating(2):  # the trainer's update of step 1 (the call site holds it)
                for handle in engines.engines:
                    ray.kill(handle, no_restart=False)
                await engine.resume()
                await _until(lambda: sync.reforms == 1, "a failed request asks for a reload")
                await asyncio.sleep(1.0)  # time enough for a reload of the small model, were it not held
                assert not running.done()
                assert await _loaded_versions(engines) == [0, 0]  # both restarted, neither reloaded yet
                await asyncio.to_thread(_train, policy, 1)  # off the event loop, as the trainer runs it
            outputs = await asyncio.wait_for(running, timeout=WAIT_S)
            expected = await _sampled_with(small_model_dir, list(policy.get_weights()))
            return outputs, expected, sync, engines
        finally:
            await engines.close()

    outputs, expected, sync, engines = asyncio.run(scenario())
    assert _tokens(outputs) == expected  # the weights after the update, not before (nor half-way)
    assert all(out.token_policy_versions == [2] * len(out.token_ids) for out in outputs)
    assert engines.policy_version == 2
    assert sync.reforms == 1  # one reload for both engines
    assert engines.restarts == len(PROMPTS)


# -- a receiver dies inside the broadcast ---------------------------------------------------------------------


class _Rank0:
    """A trainer's sending rank, cut down to the broadcast: weights held in memory, sent as the FSDP rank 0 sends.

    Calls on the group run one at a time, as on the single-threaded worker actor; :meth:`is_sending` answers
    meanwhile (the actor gets a second thread for it).
    """

    def __init__(self, model_dir: str) -> None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        generator = torch.Generator().manual_seed(2)
        self.weights = [
            (name, tensor + 0.02 * torch.randn(tensor.shape, generator=generator))
            for name, tensor in model.state_dict().items()
        ]
        self.group: BroadcastGroup | None = None
        self.address: GroupAddress | None = None  # where self.group was formed
        self.sending = False  # the last tensor is being packed: the bucket's bytes flow next
        self._one_at_a_time = threading.Lock()

    def specs(self) -> list[TensorSpec]:
        return specs_of(self.weights)

    def sent_weights(self) -> list[tuple[str, torch.Tensor]]:
        return self.weights

    def free_address(self) -> tuple[str, int]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return "127.0.0.1", int(probe.getsockname()[1])

    def join(self, address: GroupAddress) -> None:
        with self._one_at_a_time:
            if self.group is not None:
                self.group.close()
            self.group, self.address = None, None
            self.group, self.address = join(address, 0), address

    def in_group(self, address: GroupAddress) -> bool:
        return self.group is not None and self.address == address

    def send(self, plan: BucketPlan, address: GroupAddress) -> int:
        with self._one_at_a_time:
            if self.group is None or self.address != address:
                raise RuntimeError(f"not in the group at {address}: join it first")
            return self.group.send(plan, self._marked())

    def is_sending(self) -> bool:
        return self.sending

    def _marked(self) -> Iterator[tuple[str, torch.Tensor]]:
        for index, pair in enumerate(self.weights):
            self.sending = self.sending or index == len(self.weights) - 1
            yield pair


class _Sender:
    """The driver's side of :class:`_Rank0`, as ``FSDPBackend`` is of its workers (a ``BroadcastSender``)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def weight_specs(self) -> list[TensorSpec]:
        return list(ray.get(self.actor.specs.remote()))

    def broadcast_address(self, world_size: int, backend: Literal["gloo", "nccl"] = "gloo") -> GroupAddress:
        host, port = ray.get(self.actor.free_address.remote())
        return GroupAddress(host, port, world_size, backend)

    async def join_broadcast(self, address: GroupAddress) -> None:
        await self.actor.join.remote(address)

    async def in_broadcast_group(self, address: GroupAddress) -> bool:
        return bool(await self.actor.in_group.remote(address))

    async def broadcast_weights(self, plan: BucketPlan, address: GroupAddress) -> int:
        return int(await self.actor.send.remote(plan, address))


def test_a_receiver_killed_inside_the_broadcast_is_given_up_on_and_the_sync_recovers(
    cluster: None, large_model_dir: Path
) -> None:
    async def scenario() -> tuple[list[list[int]], list[list[int]], list[int], BroadcastSync, EngineGroup]:
        engines = EngineGroup("local", str(large_model_dir), 2, num_cpus_per_engine=0.25)
        rank0 = ray.remote(num_cpus=0.25, max_concurrency=2)(_Rank0).remote(str(large_model_dir))
        sync = BroadcastSync(_Sender(rank0), engines)  # the default bucket size: all weights in one collective
        try:
            await engines.wait_alive()
            push = asyncio.ensure_future(sync.push())
            await _until(lambda: rank0.is_sending.remote(), "the sender packs its last tensor")
            await asyncio.sleep(0.1)
            ray.kill(engines.engines[1], no_restart=False)  # while the bytes flow
            await asyncio.wait_for(push, timeout=RECOVERY_S)
            versions = await _loaded_versions(engines)
            got = _tokens(await engines.generate(PROMPTS, PARAMS))
            expected = await _sampled_with(large_model_dir, ray.get(rank0.sent_weights.remote()))
            return got, expected, versions, sync, engines
        finally:
            await engines.close()
            ray.kill(rank0)

    got, expected, versions, sync, engines = asyncio.run(scenario())
    assert sync.reforms == 1  # the group was formed again once
    assert versions == [engines.version] * 2  # every engine holds the second send
    assert got == expected
