"""Colocated roles taking turns with memory: the order of the hand-over in a step, and the optimizer-state move."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from skyrl_train.backends import BackendConfig, TorchBackend
from skyrl_train.backends.torch_backend import move_optimizer_state
from skyrl_train.handover import ColocatedHandover
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.inference.local import LocalEngine

from .test_trainer import _prompts, _trainer


class RecordingEngine:
    """An engine that logs every call; it can sleep."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        self.log.append("generate")
        return [GenerationOutput([1], [0.0], "length") for _ in prompts]

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.log.append("update_weights")

    async def pause(self) -> None:
        self.log.append("pause")

    async def resume(self) -> None:
        self.log.append("resume")

    async def close(self) -> None:
        pass

    async def sleep(self) -> None:
        self.log.append("sleep")

    async def wake_up(self) -> None:
        self.log.append("wake_up")


class RecordingBackend:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def offload_optimizer(self) -> None:
        self.log.append(f"{self.name}.offload")

    def reload_optimizer(self) -> None:
        self.log.append(f"{self.name}.reload")


def test_engines_sleep_before_the_optimizers_return_and_wake_after_they_leave() -> None:
    log: list[str] = []
    handover = ColocatedHandover(
        RecordingEngine(log), [RecordingBackend("policy", log), RecordingBackend("critic", log)]
    )  # type: ignore[list-item]

    async def turns() -> None:
        await handover.to_training()
        await handover.to_training()  # already training: nothing moves twice
        await handover.to_generation()
        await handover.to_generation()

    asyncio.run(turns())
    assert log == ["sleep", "policy.reload", "critic.reload", "policy.offload", "critic.offload", "wake_up"]
    assert handover.turns == 2
    assert handover.phase == "generation"


def test_roles_that_cannot_hand_memory_over_are_left_alone() -> None:
    class PlainEngine:  # no sleep/wake_up
        pass

    handover = ColocatedHandover(PlainEngine(), [object()])  # type: ignore[arg-type, list-item]
    asyncio.run(handover.to_training())
    asyncio.run(handover.to_generation())
    assert handover.turns == 2


def test_a_step_hands_memory_to_training_after_generation_and_back_before_the_sync(tiny_model_dir: Path) -> None:
    log: list[str] = []
    trainer, _ = _trainer(tiny_model_dir, flat=set())
    policy = trainer.policy
    assert isinstance(policy, TorchBackend)
    forward_backward, optim_step = policy.forward_backward, policy.optim_step

    def logged_forward_backward(*args: Any, **kwargs: Any) -> dict[str, float]:
        log.append("forward_backward")
        return forward_backward(*args, **kwargs)

    def logged_optim_step() -> dict[str, float]:
        log.append("optim_step")
        return optim_step()

    policy.forward_backward = logged_forward_backward  # type: ignore[method-assign]
    policy.optim_step = logged_optim_step  # type: ignore[method-assign]
    trainer.engine = RecordingEngine(log)  # the scripted generator does not use it; the sync and the hand-over do
    trainer.handover = ColocatedHandover(trainer.engine, [RecordingBackend("policy", log)])  # type: ignore[list-item]
    metrics = asyncio.run(trainer.train_step(_prompts("p0", "p1")))
    assert log == [
        "sleep",
        "policy.reload",
        "forward_backward",
        "optim_step",
        "policy.offload",
        "wake_up",
        "pause",
        "update_weights",
        "resume",
    ]
    assert metrics["timing/handover_s"] >= 0
    assert metrics["timing/step_s"] >= metrics["timing/handover_s"]


def test_optimizer_moments_move_and_the_step_count_stays_on_the_host(tiny_model_dir: Path) -> None:
    backend = TorchBackend(BackendConfig(str(tiny_model_dir), gradient_checkpointing=False))
    for param in backend.trainable_parameters():
        param.grad = torch.ones_like(param)
    backend.optimizer.step()
    move_optimizer_state(backend.optimizer, torch.device("meta"))  # a device other than the host, on any machine
    states = list(backend.optimizer.state.values())
    assert states
    for state in states:
        assert state["exp_avg"].device.type == "meta"
        assert state["exp_avg_sq"].device.type == "meta"
        assert state["step"].device.type == "cpu"  # AdamW refuses a device step unless capturable


def test_a_cpu_backend_keeps_its_moments_through_an_offload_and_reload(tiny_model_dir: Path) -> None:
    backend = TorchBackend(BackendConfig(str(tiny_model_dir), gradient_checkpointing=False))
    for param in backend.trainable_parameters():
        param.grad = torch.ones_like(param)
    backend.optimizer.step()
    before = {id(p): {k: v.clone() for k, v in s.items()} for p, s in backend.optimizer.state.items()}
    backend.offload_optimizer()
    backend.reload_optimizer()
    for param, state in backend.optimizer.state.items():
        for key, value in state.items():
            assert torch.equal(value, before[id(param)][key]), key


def test_the_local_engine_on_cpu_sleeps_without_moving_anything(tiny_model_dir: Path) -> None:
    async def scenario() -> tuple[list[int], list[int]]:
        engine = LocalEngine.from_pretrained(tiny_model_dir)
        params = SamplingParams(max_tokens=6, seed=3)
        try:
            before = (await engine.generate([[5, 6, 7]], params))[0].token_ids
            await engine.sleep()
            assert not engine.asleep  # a CPU engine has no device memory to lend
            await engine.wake_up()
            return before, (await engine.generate([[5, 6, 7]], params))[0].token_ids
        finally:
            await engine.close()

    before, after = asyncio.run(scenario())
    assert before == after
