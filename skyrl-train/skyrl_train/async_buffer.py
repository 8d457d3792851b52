"""``trainer.async_mode=fully_async``: prompt groups generate without pause into a buffer; each step takes a batch.

One :class:`RolloutStream` per run sits between the generator and the trainer::

    stream = RolloutStream(settings, group_rollout(trainer), loader.items(), version=trainer.global_step)
        admits a prompt group while   running < max_inflight_groups
                                and   started < (min(version + max_staleness + 1, horizon) − first) · batch_size
                                                + evicted
        rollout(prompt, index, version) → Group           one generate call per group (modes.fully_async.group_rollout)
        a finished group that failed (every trajectory failed, or nothing left in the loss) → evicted
        a finished group older than version − max_staleness → evicted (stale); any other → the buffer
    step:  take() → the next batch_size buffered groups (waiting for them) and what was evicted since the last take
           … update, weight sync …
           advance(version + 1): buffered groups that became too old are evicted; admission widens

Why the budget. A group admitted at version ``u`` has an index below ``(u + s + 1)·B``, and a step at version ``v``
trains the groups after the first ``v·B``: when groups finish in the order they started, every group trained is
at most ``s = max_staleness`` versions old, so nothing is generated only to be dropped. Groups that finish out of
order (long multi-turn episodes) may still arrive too late: they are dropped, counted and refilled.

Evict and refill. Every evicted group raises the budget by one, so a new prompt is drawn in its place and a step
always trains on ``batch_size`` groups. A step that evicts more than ``max_failed_groups`` failed groups raises
:class:`RolloutStreamError`: the envs or the engines are broken, and refilling would go on forever.

Horizon. ``generate_until(step)`` admits only what the steps up to ``step`` need (refills included). Once step
``step`` has taken its batch nothing is in flight and the buffer is empty, so a checkpoint written then holds the
whole state, and the prompt loader has handed out exactly the prompts started.

Versions. A :class:`Group` records per trajectory the oldest and newest policy version of its generated tokens
(``GeneratorOutput.policy_versions``, stamped by :class:`~skyrl_train.inference.versioned.VersionedEngine`); a
generator that reports none gives every token the group's admission version, a lower bound (generation starts no
earlier). The oldest version decides staleness. The per-token versions stay in the batch as
``tensors["policy_versions"]``, for a loss that wants them.

The stream is plain asyncio: use it from one event loop, and :meth:`RolloutStream.close` it when done.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import torch

from skyrl_train.data.dataset import PromptRecord
from skyrl_train.experience import POLICY_VERSIONS, Experience, to_experience
from skyrl_train.generators.base import GeneratorOutput

__all__ = [
    "Group",
    "GroupRollout",
    "RolloutStream",
    "RolloutStreamError",
    "StreamSettings",
    "Taken",
    "make_group",
    "stream_metrics",
]


class RolloutStreamError(RuntimeError):
    """The stream cannot fill a batch: too many failed groups, no prompts left, or nothing allowed to start."""


@dataclass(frozen=True)
class StreamSettings:
    """How a :class:`RolloutStream` schedules groups (``skyrl_train.wiring.stream_settings`` fills it)."""

    batch_size: int  # groups (prompts) per training step
    max_staleness: int = 1  # policy versions a trained group may lag behind the trainer
    max_inflight_groups: int | None = None  # groups generating at once; None: batch_size
    max_failed_groups: int | None = None  # failed groups one step may evict before it raises; None: 4 · batch_size

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_staleness < 0:
            raise ValueError(f"batch_size must be >= 1 and max_staleness >= 0, got {self}")
        for name in ("max_inflight_groups", "max_failed_groups"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be None or >= 1, got {value}")

    @property
    def inflight_limit(self) -> int:
        """Groups generating at once."""
        return self.batch_size if self.max_inflight_groups is None else self.max_inflight_groups

    @property
    def failed_limit(self) -> int:
        """Failed groups one step may evict."""
        return 4 * self.batch_size if self.max_failed_groups is None else self.max_failed_groups


@dataclass
class Group:
    """One prompt's trajectories (a GRPO group) and the policy versions that generated them."""

    index: int  # the index-th group of the run (seeds its sampling)
    admitted: int  # the policy version when it started
    output: GeneratorOutput
    experience: Experience  # its rows, group id 0; tensors["policy_versions"] always present
    oldest: list[int]  # per trajectory: the oldest policy version among its generated tokens (admitted: none)
    newest: list[int]  # per trajectory: the newest one
    generated: list[bool] = field(default_factory=list)  # per trajectory: whether it generated any token

    @property
    def version(self) -> int:
        """The oldest policy version that generated any of its tokens: what staleness is measured from.

        A trajectory that generated nothing (it failed at once) has no tokens to be stale: it does not count.
        """
        made = self.generated or [True] * len(self.oldest)
        return min((lo for lo, made_any in zip(self.oldest, made, strict=True) if made_any), default=self.admitted)

    @property
    def trainable(self) -> bool:
        """Whether some trajectory survived and some token is left in the loss."""
        return not bool(self.experience.failed.all()) and bool(self.experience.batch.response_mask.sum() > 0)


GroupRollout = Callable[[PromptRecord, int, int], Awaitable[Group]]
"""``rollout(prompt, index, version)``: generate one prompt's group, the ``index``-th of the run, at ``version``."""


def make_group(output: GeneratorOutput, pad_token_id: int, *, index: int, admitted: int) -> Group:
    """Collate one group's generator output, with its versions (the admission version where none were reported)."""
    experience = to_experience(output, pad_token_id)
    tensors = experience.batch.tensors
    if POLICY_VERSIONS not in tensors:
        tensors[POLICY_VERSIONS] = torch.full_like(experience.batch.response_mask, float(admitted))
    if output.policy_versions is not None:
        rows = output.policy_versions
        generated = [any(version >= 0 for version in row) for row in rows]
    else:  # no versions reported: every token counts as generated at admission
        rows, generated = [[] for _ in range(len(output))], [len(ids) > 0 for ids in output.response_ids]
    ranges = [_version_range(row, admitted) for row in rows]
    oldest, newest = [lo for lo, _ in ranges], [hi for _, hi in ranges]
    return Group(index, admitted, output, experience, oldest, newest, generated)


def _version_range(row: list[int], admitted: int) -> tuple[int, int]:
    generated = [version for version in row if version >= 0]
    return (min(generated), max(generated)) if generated else (admitted, admitted)


@dataclass
class Taken:
    """What :meth:`RolloutStream.take` hands a step."""

    groups: list[Group]  # batch_size groups, in the order they finished
    evicted: list[Group] = field(default_factory=list)  # groups evicted since the last take (failed or stale)
    stale: int = 0  # how many of them were evicted for their age
    refilled: int = 0  # groups started since the last take in place of evicted ones
    in_flight: int = 0  # groups generating when the batch was taken
    buffered: int = 0  # finished groups left in the buffer


class RolloutStream:
    """Generates groups continuously and hands out batches of them (see the module docstring).

    Args:
        settings: Batch size, staleness bound, concurrency and failure limit.
        rollout: Generates one group (``skyrl_train.modes.fully_async.group_rollout``).
        prompts: The prompts to draw, one per group (``PromptLoader.items()``).
        version: The policy version the engines generate with now.
        started: Groups the run started before this stream (a resumed run's count): the next group's index.
    """

    def __init__(
        self,
        settings: StreamSettings,
        rollout: GroupRollout,
        prompts: Iterator[PromptRecord],
        *,
        version: int = 0,
        started: int = 0,
    ) -> None:
        self.settings = settings
        self.version = version
        self.started = started
        self._rollout = rollout
        self._prompts = prompts
        self._first = version  # the version the budget counts from
        self._admitted = 0  # groups this stream started
        self._evicted_total = 0
        self._horizon: int | None = None  # the last step to generate for; None: no limit
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready: deque[Group] = deque()
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._exhausted = False
        self._closed = False
        self._owed = 0  # evicted groups whose replacement has not started yet (carried over between steps)
        self._reset_counters()

    def _reset_counters(self) -> None:
        """Start a step's counts: evicted groups, stale and failed ones, refills started."""
        self._evicted: list[Group] = []
        self._stale = 0
        self._failed = 0
        self._refilled = 0

    # ------------------------------------------------------------------------------------------ the trainer's side

    @property
    def in_flight(self) -> int:
        """Groups generating now."""
        return self._running

    @property
    def buffered(self) -> int:
        """Finished groups waiting to be taken."""
        return len(self._ready)

    def generate_until(self, step: int) -> None:
        """Admit only what the steps up to ``step`` need (refills included); nothing is in flight after its take."""
        self._horizon = step
        self._fill()

    def advance(self, version: int) -> None:
        """The engines now generate with ``version``: evict buffered groups that became too old, admit more."""
        self.version = version
        ready, self._ready = self._ready, deque()
        for group in ready:
            self._arrive(group)
        self._fill()

    async def take(self) -> Taken:
        """Wait for ``batch_size`` buffered groups and hand them out with what was evicted since the last take.

        Raises:
            RolloutStreamError: too many failed groups, the prompts ran out, or no group is allowed to start.
            Exception: what a group's rollout raised (e.g. a generator with ``on_failure="raise"``).
        """
        size = self.settings.batch_size
        self._fill()
        while len(self._ready) < size:
            self._raise_if_stuck()
            self._changed.clear()
            await self._changed.wait()
        if self._error is not None:
            raise self._error
        groups = [self._ready.popleft() for _ in range(size)]
        taken = Taken(groups, self._evicted, self._stale, self._refilled, self._running, len(self._ready))
        self._reset_counters()
        return taken

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the number of groups started (the next group's index, which seeds it)."""
        return {"groups_started": self.started}

    async def close(self) -> None:
        """Cancel the groups still generating and wait for them; idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # each one's only exception is its cancellation

    # ------------------------------------------------------------------------------------------ admission

    def _budget(self) -> int:
        """How many groups this stream may have started by now (see "Why the budget" in the module docstring)."""
        steps = self.version + self.settings.max_staleness + 1
        if self._horizon is not None:
            steps = min(steps, self._horizon)
        return (steps - self._first) * self.settings.batch_size + self._evicted_total

    def _can_start(self) -> bool:
        if self._closed or self._error is not None or self._exhausted:
            return False
        return self._running < self.settings.inflight_limit and self._admitted < self._budget()

    def _fill(self) -> None:
        while self._can_start():
            try:
                prompt = next(self._prompts)
            except StopIteration:
                self._exhausted = True
                break
            self._start(prompt)
        self._changed.set()

    def _start(self, prompt: PromptRecord) -> None:
        index = self.started
        self.started += 1
        self._admitted += 1
        self._running += 1
        if self._owed:
            self._owed -= 1
            self._refilled += 1
        task = asyncio.get_running_loop().create_task(self._run(prompt, index, self.version))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, prompt: PromptRecord, index: int, version: int) -> None:
        try:
            group = await self._rollout(prompt, index, version)
        except Exception as exc:  # handed to the trainer by take()
            if self._error is None:
                self._error = exc
        else:
            self._arrive(group)
        finally:
            self._running -= 1
            self._fill()

    def _arrive(self, group: Group) -> None:
        """Buffer a finished group, or evict it (failed, or older than the staleness bound allows)."""
        if not group.trainable:
            self._evict(group, stale=False)
        elif group.version < self.version - self.settings.max_staleness:
            self._evict(group, stale=True)
        else:
            self._ready.append(group)

    def _evict(self, group: Group, *, stale: bool) -> None:
        self._evicted.append(group)
        self._evicted_total += 1
        self._owed += 1
        if stale:
            self._stale += 1
            return
        self._failed += 1
        if self._failed > self.settings.failed_limit and self._error is None:
            self._error = RolloutStreamError(
                f"{self._failed} groups failed in one step (every trajectory failed, or none kept a token in the "
                f"loss), more than the limit of {self.settings.failed_limit}: check the envs and the engines "
                "(the warnings above name each failed trajectory)"
            )

    def _raise_if_stuck(self) -> None:
        if self._error is not None:
            raise self._error
        if self._running:
            return
        if self._exhausted:
            raise RolloutStreamError(
                f"the prompts ran out with {len(self._ready)} of {self.settings.batch_size} groups ready"
            )
        raise RolloutStreamError(
            f"nothing is generating and no group may start (version {self.version}, horizon {self._horizon}, "
            f"{self._admitted} started): call advance() after each weight sync and generate_until() for later steps"
        )


def stream_metrics(taken: Taken, version: int, max_staleness: int) -> dict[str, float]:
    """``async/*`` metrics of one step at ``version``: staleness of the trained trajectories, evictions, refills."""
    oldest = [v for group in taken.groups for v in group.oldest]
    newest = [v for group in taken.groups for v in group.newest]
    staleness = [version - v for v in oldest]
    count = max(len(staleness), 1)
    metrics = {
        "async/staleness": sum(staleness) / count,
        "async/staleness_max": float(max(staleness, default=0)),
        "async/mixed_versions": sum(lo != hi for lo, hi in zip(oldest, newest, strict=True)) / count,
        "async/evicted": float(len(taken.evicted)),
        "async/stale_dropped": float(taken.stale),
        "async/refilled": float(taken.refilled),
        "async/groups_in_flight": float(taken.in_flight),
        "async/groups_buffered": float(taken.buffered),
    }
    for lag in range(max_staleness + 1):
        metrics[f"async/staleness_hist/{lag}"] = sum(s == lag for s in staleness) / count
    return metrics
