"""``trainer.async_mode=fully_async``: a stream of prompt groups generates without pause; steps take from it.

::

    stream = RolloutStream(one prompt → one group, seeded by the group's index)
    for each step:
        stream.generate_until(the next checkpoint's step, or the last)
        batch = stream.take()       batch_size finished groups; groups too stale are evicted and refilled
        learn(batch)                prepare, update: the stream keeps generating (on the old weights)
        weight sync                 the engine pauses between tokens, loads, and stamps the new version on every
                                    token generated from then on (tensors["policy_versions"])
        stream.advance(version)

Each group is one generate call (:func:`group_rollout`). The engine is a
:class:`~skyrl_train.inference.versioned.VersionedEngine`, so every token carries the policy version that sampled
it; ``trainer.max_staleness`` bounds how old a group may get. Nothing is in flight when a checkpoint is written
(the stream generates only up to the checkpoint's step), and the checkpoint records how many groups were started
(their index seeds each group's sampling), so a resumed run continues exactly.
"""

from __future__ import annotations

import functools

from skyrl_train.async_buffer import Group, GroupRollout, RolloutStream, StreamSettings, make_group, stream_metrics
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.experience import concat_experiences
from skyrl_train.loop_settings import Metrics
from skyrl_train.modes.base import LoopHost
from skyrl_train.timeline import WAITING, timed
from skyrl_train.trainer import Trainer, mean_metrics, reward_metrics

__all__ = ["group_rollout", "train", "train_step_from"]


async def train(host: LoopHost, settings: StreamSettings) -> None:
    """Train until ``host.schedule.total_steps`` from one stream (``settings``: batch, staleness, concurrency)."""
    trainer, schedule = host.trainer, host.schedule
    stream = RolloutStream(
        settings,
        group_rollout(trainer),
        host.loader.items(),
        version=trainer.global_step,
        started=host.groups_started,
    )
    host.checkpoint_state = stream.state_dict
    try:
        while trainer.global_step < schedule.total_steps:
            stream.generate_until(schedule.horizon(trainer.global_step))
            metrics = await train_step_from(trainer, stream)
            await host.after_step(metrics)
    finally:
        await stream.close()


async def train_step_from(trainer: Trainer, stream: RolloutStream) -> Metrics:
    """Train on the next batch of groups ``stream`` has ready; return metrics.

    The stream keeps generating meanwhile; after the update the weights are synced into the running engines (later
    tokens of running rollouts use them) and the stream learns the new policy version. ``async/*`` metrics count
    the groups evicted and refilled and the trained samples' staleness.
    """
    if trainer.settings.async_mode != "fully_async":
        raise ValueError("train_step_from(stream) needs async_mode='fully_async'")
    if stream.version != trainer.global_step:
        raise ValueError(f"the stream generates for version {stream.version}, the trainer is at {trainer.global_step}")
    clock = trainer.start_step()
    with timed(clock.timings, "timing/wait_batch_s", trainer.timeline, WAITING, "batch"):
        taken = await stream.take()
    experience = concat_experiences([group.experience for group in taken.groups], trainer.pad_token_id)
    generated = [group.output for group in (*taken.groups, *taken.evicted)]
    metrics = {**mean_metrics([o.metrics for o in generated]), **reward_metrics(generated)}
    metrics.update(stream_metrics(taken, trainer.global_step, stream.settings.max_staleness))
    metrics = await trainer.learn(experience, metrics, clock, concurrent=True)
    stream.advance(trainer.global_step)
    return metrics


def group_rollout(trainer: Trainer) -> GroupRollout:
    """What a :class:`RolloutStream` calls to generate one prompt's group with ``trainer``'s generator."""
    return functools.partial(_rollout_group, trainer)


async def _rollout_group(trainer: Trainer, prompt: PromptRecord, index: int, version: int) -> Group:
    """One prompt's group, the ``index``-th of the run, started at ``version``.

    Its sampling is seeded by ``index`` (as a step's by its number), so it does not depend on when it runs.
    """
    request = trainer.generator_input([prompt], training=True, step=version, seed_key=2 * index + 1)
    output = await trainer.generator.generate(request)
    return make_group(output, trainer.pad_token_id, index=index, admitted=version)
