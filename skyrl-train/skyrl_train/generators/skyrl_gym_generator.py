"""The default generator: skyrl-gym text envs driven by an inference engine, token in / token out.

Per trajectory::

    env = skyrl_gym.make(env_class, env_config=config.env_configs.get(env_class),
                         extras={**extras, "max_turns": config.max_turns})
    messages, _ = await ainit(env, prompt)                 # in a thread pool: envs may block
    ids = chat template(messages) + generation prompt
    loop:
        output = await engine.generate([prompt + response], params)      # the ids trained on
        step = await astep(env, decoded output)
        reward of the turn → on the turn's last generated token
        done → stop; turn limit → "max_turns"
        response += [end of turn, if the model did not sample it] + observation ids (loss mask 0)
        does not fit max_input_length → "context"; does not fit max_response_length → "length"
    finally: env.get_metrics(), env.close()

Observation ids come from :class:`~skyrl_train.generators.chat.ChatEncoder` (the fixed-base-conversation trick;
see that module for how the end-of-turn token is handled). A trailing observation is never kept: the response
always ends on a generated token (or on nothing, for a trajectory that failed or did not fit before its first turn).

Stop reasons: ``stop`` (the env said done and the last turn ended naturally), ``length`` (the last turn hit its
token limit, or the response budget ran out), ``max_turns``, ``context``, and the failures below.

Failure policy. Exceptions of one trajectory never escape :meth:`SkyRLGymGenerator.generate` and never disturb the
other trajectories. They are classified::

    TrajectoryError               one trajectory failed; ``stop_reason`` says how
    ├── EnvError                  "env_error": make/init/step/get_metrics/close raised, or a step was malformed
    ├── EngineError               "engine_error": the engine raised, aborted or answered malformed output
    └── TrajectoryTimeoutError    "timeout": the trajectory ran past ``timeout_s`` (or close past ``close_timeout_s``)

With ``on_failure="mask"`` (default) a failed trajectory keeps the tokens it produced before the failure, with
every loss-mask entry and every reward set to 0: it adds nothing to the loss. Its reward of 0 would still bias the
group statistics of its prompt's other samples (GRPO means and stds), so trainers should leave rows whose stop
reason is in :data:`FAILURE_STOP_REASONS` out of those statistics, or drop the group. With ``on_failure="raise"``
the whole batch still runs to the end and every env is closed; then ``generate`` raises an ``ExceptionGroup`` of the
failures. Exceptions that are not a trajectory's failure (bugs, cancellation of ``generate`` itself) propagate.

A timed-out trajectory's env is closed while a blocking ``step`` may still be running in its worker thread: closing
is what releases the resources a stuck step holds (a subprocess, a socket).

Pieces: :mod:`~skyrl_train.generators.trajectory` (a trajectory's state and failure classes),
:mod:`~skyrl_train.generators.rollout_steps` (the steps both modes share), :mod:`~skyrl_train.generators.rollout_output`
(the output and its metrics); settings in :mod:`~skyrl_train.generators.gym_config`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from skyrl_gym.async_env import EnvRunner
from skyrl_train.generators.base import FAILURE_STOP_REASONS, GeneratorInput, GeneratorOutput, TrajectoryStopReason
from skyrl_train.generators.chat import ChatEncoder
from skyrl_train.generators.gym_config import FailurePolicy, GeneratorConfig
from skyrl_train.generators.rollout_output import assemble_output, mask_overlong, zero_rewards_on_non_stop
from skyrl_train.generators.rollout_steps import RolloutSteps, deadline_after
from skyrl_train.generators.trajectory import (
    EngineError,
    EnvError,
    Rollout,
    TrajectoryError,
    TrajectoryTimeoutError,
    classify,
)
from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from skyrl_train.generators.env_workers import EnvWorkers
    from skyrl_train.timeline import Timeline

__all__ = [
    "FAILURE_STOP_REASONS",
    "EngineError",
    "EnvError",
    "FailurePolicy",
    "GeneratorConfig",
    "InlineEnvRunner",
    "SkyRLGymGenerator",
    "TrajectoryError",
    "TrajectoryTimeoutError",
    "mask_overlong",
    "zero_rewards_on_non_stop",
]

T = TypeVar("T")


class SkyRLGymGenerator:
    """Rolls out skyrl-gym envs with an inference engine (see the module docstring for the loop and policies).

    Args:
        engine: The inference engine; the caller owns it (this class never closes it).
        tokenizer: The policy's tokenizer, with the chat template the model was trained with.
        config: Generator settings; default :class:`GeneratorConfig()`.
        env_runner: Thread pool for blocking env calls; default one of ``config.max_env_workers`` threads, or
            skyrl-gym's shared pool.
        env_workers: Make every env in Ray actors instead of this process
            (:class:`~skyrl_train.generators.env_workers.EnvWorkers`; the caller owns and closes them).
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: PreTrainedTokenizerBase,
        config: GeneratorConfig | None = None,
        *,
        env_runner: EnvRunner | None = None,
        env_workers: EnvWorkers | None = None,
    ) -> None:
        self.engine = engine
        self.env_workers = env_workers
        self.config = config or GeneratorConfig()
        self.chat = ChatEncoder(
            tokenizer,
            chat_template_kwargs=self.config.chat_template_kwargs,
            end_of_turn_token_id=self.config.end_of_turn_token_id,
        )
        workers = self.config.max_env_workers
        self._owned_runner = env_runner is None and workers is not None
        if env_runner is None and workers is not None:
            env_runner = EnvRunner(workers) if workers > 0 else InlineEnvRunner()
        self._env_runner = env_runner
        self._steps = RolloutSteps(engine, self.chat, self.config, env_runner, env_workers)
        # One limit for every generate call of this generator (fully_async makes one call per group, many at once).
        self._slots: tuple[asyncio.AbstractEventLoop, AbstractAsyncContextManager[Any]] | None = None

    @property
    def timeline(self) -> Timeline | None:
        """Where engine and env calls are recorded as spans; set by a run (None: nowhere)."""
        return self._steps.timeline

    @timeline.setter
    def timeline(self, timeline: Timeline | None) -> None:
        self._steps.timeline = timeline

    @property
    def env_runner(self) -> EnvRunner:
        """The thread pool env calls run in (skyrl-gym's current default unless one was given or configured)."""
        return self._steps.env_runner

    def close(self) -> None:
        """Stop the env thread pool this generator created, if any. The engine is left alone."""
        if self._owned_runner and self._env_runner is not None:
            self._env_runner.shutdown(wait=False)

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        """Roll out every trajectory of ``batch``; outputs are in input order.

        Raises:
            ValueError: The batch's lists have different lengths.
            ExceptionGroup: Only with ``on_failure="raise"``, after the whole batch ran: the trajectories' failures.
        """
        _check_batch(batch)
        slots = self._trajectory_slots()
        if self.config.batched:
            rollouts = await self._generate_batched(batch, slots)
        else:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._rollout(batch, i, slots)) for i in range(len(batch.prompts))]
            rollouts = [task.result() for task in tasks]
        failures = [r.failure for r in rollouts if r.failure is not None]
        if failures and self.config.on_failure == "raise":
            raise ExceptionGroup(f"{len(failures)} of {len(rollouts)} trajectories failed", failures)
        return assemble_output(
            batch,
            rollouts,
            zero_reward_on_non_stop=self.config.zero_reward_on_non_stop,
            apply_overlong_filtering=self.config.apply_overlong_filtering,
        )

    def _trajectory_slots(self) -> AbstractAsyncContextManager[Any]:
        """The generator's bound on trajectories at once, shared by all its calls on the running loop."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:  # a semaphore belongs to the loop it first ran on
            self._slots = (loop, _slots(self.config.max_concurrent_trajectories))
        return self._slots[1]

    # One trajectory at a time ------------------------------------------------------------------------------------

    async def _rollout(self, batch: GeneratorInput, i: int, slots: AbstractAsyncContextManager[Any]) -> Rollout:
        rollout = Rollout(trajectory_id=batch.trajectory_ids[i], env_class=batch.env_classes[i])
        async with slots:
            start = time.perf_counter()
            deadline = deadline_after(self.config.timeout_s)
            try:
                prompt, extras, params = batch.prompts[i], batch.env_extras[i], batch.sampling_params
                episode = self._run_episode(rollout, prompt, extras, params, (i, len(batch.prompts)))
                await self._steps.contain(rollout, episode, deadline, "the trajectory")
            finally:
                await self._steps.finish(rollout)
                rollout.total_time_s = time.perf_counter() - start
        return rollout

    async def _run_episode(
        self,
        rollout: Rollout,
        prompt: list[dict[str, str]],
        extras: Mapping[str, Any],
        params: SamplingParams,
        position: tuple[int, int],
    ) -> None:
        """The agent loop; sets ``rollout.stop_reason`` unless it raises a :class:`TrajectoryError`.

        ``position`` is ``(index in the batch, batch size)``: it spreads a seeded batch's seeds (see
        :meth:`RolloutSteps.turn_params`).
        """
        index, batch_size = position
        steps = self._steps
        env = await steps.start(rollout, prompt, extras)
        if rollout.input_length > self.config.max_input_length:
            rollout.stop_reason = "context"
            return
        while True:
            turn_params = steps.turn_params(len(rollout.response_ids), params, index + rollout.turns * batch_size)
            if turn_params is None:
                rollout.stop_reason = "length"
                return
            (output,) = await steps.call_engine([rollout], turn_params)
            step = await steps.take_turn(rollout, env, output, turn_params)
            if step.done:
                rollout.stop_reason = "length" if output.stop_reason == "length" else "stop"
                return
            if rollout.turns >= self.config.max_turns:
                rollout.stop_reason = "max_turns"
                return
            next_ids = steps.next_turn_ids(rollout, output, step.observations)
            overflow = steps.overflow(rollout, next_ids)
            if overflow is not None:
                rollout.stop_reason = overflow
                return
            rollout.add_observation(next_ids)

    # The whole batch in one engine call ----------------------------------------------------------------------------

    async def _generate_batched(self, batch: GeneratorInput, slots: AbstractAsyncContextManager[Any]) -> list[Rollout]:
        """Single-turn rollouts: envs start concurrently, one engine call serves every prompt that fits."""
        steps = self._steps
        rollouts = [
            Rollout(trajectory_id=tid, env_class=env_class)
            for tid, env_class in zip(batch.trajectory_ids, batch.env_classes, strict=True)
        ]
        start = time.perf_counter()
        deadline = deadline_after(self.config.timeout_s)

        async def start_env(i: int) -> None:
            async with slots:
                work = steps.start(rollouts[i], batch.prompts[i], batch.env_extras[i])
                await steps.contain(rollouts[i], work, deadline, "starting the env")

        async def finish_turn(rollout: Rollout, output: GenerationOutput, params: SamplingParams) -> None:
            async with slots:
                assert rollout.env is not None
                step = await steps.contain(rollout, steps.take_turn(rollout, rollout.env, output, params), deadline)
                if step is not None:
                    done_reason: TrajectoryStopReason = "length" if output.stop_reason == "length" else "stop"
                    rollout.stop_reason = done_reason if step.done else "max_turns"

        async def finish_env(rollout: Rollout) -> None:
            async with slots:
                await steps.finish(rollout)

        try:
            await asyncio.gather(*(start_env(i) for i in range(len(rollouts))))
            ready = [r for r in rollouts if r.failure is None and not self._mark_if_too_long(r)]
            params = steps.turn_params(0, batch.sampling_params)
            assert params is not None  # an empty response always has budget left
            outputs = await self._call_engine_for_all(ready, params, deadline)
            if outputs is not None:
                await asyncio.gather(*(finish_turn(r, out, params) for r, out in zip(ready, outputs, strict=True)))
        finally:
            await asyncio.gather(*(finish_env(r) for r in rollouts))
            for rollout in rollouts:
                rollout.total_time_s = time.perf_counter() - start
        return rollouts

    def _mark_if_too_long(self, rollout: Rollout) -> bool:
        if rollout.input_length > self.config.max_input_length:
            rollout.stop_reason = "context"
            return True
        return False

    async def _call_engine_for_all(
        self, rollouts: list[Rollout], params: SamplingParams, deadline: float | None
    ) -> list[GenerationOutput] | None:
        """One engine call for ``rollouts``; its failure is every one's failure (then returns None)."""
        if not rollouts:
            return []
        try:
            async with asyncio.timeout_at(deadline):
                return await self._steps.call_engine(rollouts, params)
        except (TrajectoryError, TimeoutError) as exc:
            for rollout in rollouts:
                rollout.fail(classify(exc, "the batched engine call"))
        return None


class InlineEnvRunner(EnvRunner):
    """Runs env calls on the event loop itself (``max_env_workers=0``).

    For debugging only (breakpoints and stack traces in the env stay on one thread): a slow env call stalls every
    trajectory and the engine's batching, and a hung one cannot be timed out.
    """

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        """Call ``func(*args)`` directly."""
        return func(*args)


def _check_batch(batch: GeneratorInput) -> None:
    sizes = {
        len(batch.prompts),
        len(batch.env_classes),
        len(batch.env_extras),
        len(batch.trajectory_ids),
    }
    if len(sizes) != 1:
        raise ValueError(
            "GeneratorInput lists must have one entry per trajectory; got "
            f"{len(batch.prompts)} prompts, {len(batch.env_classes)} env classes, "
            f"{len(batch.env_extras)} env extras and {len(batch.trajectory_ids)} trajectory ids"
        )


def _slots(limit: int | None) -> AbstractAsyncContextManager[Any]:
    """A context manager that bounds how many trajectories run at once (none when ``limit`` is None)."""
    return asyncio.Semaphore(limit) if limit is not None else contextlib.nullcontext()
