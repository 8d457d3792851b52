"""Colocated roles take turns with one device's memory: the engines generate, then the trainer trains.

With ``trainer.placement=colocate`` a training rank and an engine share a bundle (on GPU, a device). Neither fits
beside the other at full size, so at each phase change one lends its memory to the other::

    generation ─► to_training():   engines sleep (vLLM sleep mode: weights to host memory, KV cache freed),
                                   the optimizer state comes back to the device
    training   ─► to_generation(): the optimizer state goes to host memory, the engines wake up
                                   (then the trainer syncs the new weights into them and the next step generates)

Each call does only what its side supports (``SleepingEngine``, ``OffloadingBackend``); on a CPU both sides keep
their memory where it is and the calls cost a round trip each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from skyrl_train.backends.base import OffloadingBackend, TrainingBackend
from skyrl_train.inference.base import InferenceEngine, SleepingEngine

__all__ = ["ColocatedHandover"]


@dataclass
class ColocatedHandover:
    """The trainer's ``handover``: engines and optimizers lend each other memory (see the module docstring)."""

    engine: InferenceEngine
    trainers: Sequence[TrainingBackend]  # the backends that take optimizer steps (policy, critic)
    phase: str = field(default="generation", init=False)  # who holds the memory now
    turns: int = field(default=0, init=False)  # phase changes so far

    async def to_training(self) -> None:
        """Generation is over: the engines release their memory, the optimizers take theirs back."""
        if self.phase == "training":
            return
        if isinstance(self.engine, SleepingEngine):
            await self.engine.sleep()
        for backend in self.trainers:
            if isinstance(backend, OffloadingBackend):
                backend.reload_optimizer()
        self.phase, self.turns = "training", self.turns + 1

    async def to_generation(self) -> None:
        """Training is over: the optimizers move out, the engines wake up (ready for the weight sync)."""
        if self.phase == "generation":
            return
        for backend in self.trainers:
            if isinstance(backend, OffloadingBackend):
                backend.offload_optimizer()
        if isinstance(self.engine, SleepingEngine):
            await self.engine.wake_up()
        self.phase, self.turns = "generation", self.turns + 1
