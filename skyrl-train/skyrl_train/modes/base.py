"""What every mode's loop is given by the run: the trainer, the prompts and the step schedule (a leaf)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from skyrl_train.data.dataset import PromptRecord
from skyrl_train.data.loader import PromptLoader
from skyrl_train.loop_settings import Metrics
from skyrl_train.trainer import Trainer

__all__ = ["LoopHost", "Schedule"]


@dataclass(frozen=True)
class Schedule:
    """When the run stops and when it writes checkpoints (``skyrl_train.wiring.schedule`` fills it)."""

    total_steps: int  # training steps of the whole run
    ckpt_interval: int = 0  # a checkpoint after every this many steps; 0: only at the end

    def checkpoint_after(self, step: int) -> bool:
        """Whether a checkpoint is written right after training step ``step`` (counted from 1)."""
        return self.ckpt_interval > 0 and step % self.ckpt_interval == 0

    def horizon(self, step: int) -> int:
        """The last step to run before the next checkpoint (nothing may be in flight then), or the run's end."""
        if self.ckpt_interval <= 0:
            return self.total_steps
        return min((step // self.ckpt_interval + 1) * self.ckpt_interval, self.total_steps)


class LoopHost(Protocol):
    """The run as a mode's loop sees it (``skyrl_train.run`` provides it)."""

    trainer: Trainer
    loader: PromptLoader[PromptRecord]
    schedule: Schedule
    groups_started: int  # fully_async: groups started before this run (a resumed run's count)
    # fully_async: the stream's state (groups started), stored with each checkpoint; None in the other modes
    checkpoint_state: Callable[[], dict[str, Any]] | None

    async def after_step(self, metrics: Metrics) -> None:
        """Log ``metrics``; evaluate, checkpoint and export when their intervals say so."""
        ...
