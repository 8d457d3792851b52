"""``trainer.async_mode=one_step_off``: the next step's rollouts generate while this step learns.

::

    step k:
        experience_k = the rollouts started during step k-1 (or, at the first step, generated now)
        start the rollouts of step k+1's prompts, on the weights of step k-1's update
        learn(experience_k): prepare, update         (the rollouts of step k+1 keep generating)
        wait for the rollouts of step k+1            (they finish on the old weights)
        weight sync

Each step trains on samples one policy version old (``async/staleness`` 1, 0 at the first step and after a
checkpoint). No rollout is in flight when a checkpoint is written: the step before a checkpoint starts none, so a
resumed run draws and generates the next batch exactly as the uninterrupted one did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from skyrl_train.data.dataset import PromptRecord
from skyrl_train.experience import Experience
from skyrl_train.loop_settings import Metrics, PromptSource
from skyrl_train.modes.base import LoopHost, Schedule
from skyrl_train.timeline import WAITING, timed
from skyrl_train.trainer import Trainer

__all__ = ["OneStepOff", "train"]


async def train(host: LoopHost) -> None:
    """Train until ``host.schedule.total_steps``, each step also starting the next one's rollouts."""
    steps, batches = OneStepOff(host.trainer), host.loader.stream()
    ahead: Sequence[PromptRecord] | None = None  # the next step's prompts, generating already
    while host.trainer.global_step < host.schedule.total_steps:
        batch = ahead if ahead is not None else next(batches)
        ahead = next(batches) if _generates_ahead(host.trainer.global_step + 1, host.schedule) else None
        # Dynamic sampling draws its refills from the same stream, so they advance the saved loader state.
        metrics = await steps.train_step(batch, lambda: next(batches), upcoming=ahead)
        await host.after_step(metrics)


def _generates_ahead(step: int, schedule: Schedule) -> bool:
    """Whether training step ``step`` (counted from 1) also starts the next one's rollouts.

    Not when a checkpoint follows it (nothing may be in flight when one is written), nor at the last step.
    """
    return step < schedule.total_steps and not schedule.checkpoint_after(step)


@dataclass
class _Ahead:
    """Rollouts of the next step's prompts, running while this step learns."""

    prompts: Sequence[PromptRecord]
    rollout: asyncio.Future[tuple[Experience, Metrics]]
    version: int  # the policy version (optimizer steps) whose weights generate them


class OneStepOff:
    """One-step-off steps over a :class:`~skyrl_train.trainer.Trainer`; holds the rollouts generated ahead."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._ahead: _Ahead | None = None

    async def train_step(
        self,
        prompts: Sequence[PromptRecord],
        next_prompts: PromptSource | None = None,
        upcoming: Sequence[PromptRecord] | None = None,
    ) -> Metrics:
        """Learn from ``prompts``' rollouts (started by the last step when it was given them as ``upcoming``).

        ``upcoming``: the next step's prompts. Their rollouts start once this step's experience is ready, on the
        weights before this step's update, and run while it learns; the sync waits for them, and the next call,
        given the same prompts, trains on them (one policy version old).
        """
        trainer = self.trainer
        if upcoming is not None and trainer.settings.async_mode != "one_step_off":
            raise ValueError("upcoming prompts are generated ahead only with async_mode='one_step_off'")
        clock = trainer.start_step()
        with timed(clock.timings, "timing/generate_s", trainer.timeline, WAITING, "rollouts"):
            experience, metrics, version = await self._experience(prompts, next_prompts)
        if upcoming is not None:
            rollout = trainer.collect(upcoming, None, step=trainer.global_step + 1)
            self._ahead = _Ahead(upcoming, asyncio.ensure_future(rollout), trainer.global_step)
            await asyncio.sleep(0)  # let it send its first requests before the update takes the thread
        metrics["async/staleness"] = float(trainer.global_step - version)
        return await trainer.learn(
            experience, metrics, clock, before_sync=self._wait_for_ahead, concurrent=self._ahead is not None
        )

    async def _experience(
        self, prompts: Sequence[PromptRecord], next_prompts: PromptSource | None
    ) -> tuple[Experience, Metrics, int]:
        """The experience of ``prompts`` (generated ahead during the last step, or now) and its policy version."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return (*await self.trainer.collect(prompts, next_prompts), self.trainer.global_step)
        if ahead.prompts is not prompts:
            ahead.rollout.cancel()
            raise ValueError("train_step got other prompts than the upcoming ones of the last step: pass those")
        experience, metrics = await ahead.rollout
        return experience, metrics, ahead.version

    async def _wait_for_ahead(self, timings: Metrics) -> None:
        """Before the sync: the rollouts generated ahead use the old weights to their end."""
        if self._ahead is not None:
            with timed(timings, "timing/wait_ahead_s", self.trainer.timeline, WAITING, "rollouts ahead"):
                await asyncio.wait({self._ahead.rollout})
