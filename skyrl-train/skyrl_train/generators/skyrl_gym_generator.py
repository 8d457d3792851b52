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
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import logging
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from skyrl_gym.async_env import EnvRunner, default_runner
from skyrl_gym.core import Env
from skyrl_train.generators.base import FAILURE_STOP_REASONS, GeneratorInput, GeneratorOutput, TrajectoryStopReason
from skyrl_train.generators.chat import ChatEncoder
from skyrl_train.generators.envs import make_env
from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams
from skyrl_train.timeline import span_on

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

logger = logging.getLogger(__name__)
T = TypeVar("T")

FailurePolicy = Literal["mask", "raise"]
"""``mask``: a failed trajectory is returned with loss mask and rewards all 0; ``raise``: ``generate`` raises."""

"""Stop reasons of failed trajectories (masked out of the loss under the ``mask`` policy)."""

STOP_REASONS: tuple[TrajectoryStopReason, ...] = (
    "stop",
    "length",
    "max_turns",
    "context",
    "env_error",
    "engine_error",
    "timeout",
)


class TrajectoryError(Exception):
    """One trajectory failed; the generator records ``stop_reason`` for it instead of failing the batch."""

    stop_reason: TrajectoryStopReason = "env_error"


class EnvError(TrajectoryError):
    """The env raised in make/init/step/get_metrics/close, or returned something the generator cannot use."""

    stop_reason: TrajectoryStopReason = "env_error"


class EngineError(TrajectoryError):
    """The inference engine raised, aborted the request, or returned malformed output."""

    stop_reason: TrajectoryStopReason = "engine_error"


class TrajectoryTimeoutError(TrajectoryError):
    """The trajectory ran past its deadline (``timeout_s``), or closing its env ran past ``close_timeout_s``."""

    stop_reason: TrajectoryStopReason = "timeout"


@dataclass(frozen=True)
class GeneratorConfig:
    """Settings of :class:`SkyRLGymGenerator`. Lengths are in tokens, times in seconds."""

    max_turns: int = 1  # turns per trajectory; every env also gets it as extras["max_turns"]
    max_input_length: int = 4096  # most tokens one engine call may take (prompt + response so far)
    max_generate_length: int | None = 1024  # new tokens per turn at most (sampling_params.max_tokens also caps)
    max_response_length: int | None = None  # response tokens per trajectory at most (generated + observations)
    batched: bool = False  # single-turn only: one engine call for the whole batch
    env_configs: Mapping[str, Any] = field(default_factory=dict)  # env class → its env_config for make()
    max_concurrent_trajectories: int | None = None  # trajectories running at once; None: all of them
    timeout_s: float | None = None  # deadline per trajectory, counted from when it starts running; None: none
    close_timeout_s: float = 60.0  # deadline for get_metrics + close of one env
    max_env_workers: int | None = 32  # own env thread pool of this size; None: skyrl_gym's; 0: inline (debugging)
    zero_reward_on_non_stop: bool = False  # training only: zero the rewards of trajectories not ending in "stop"
    apply_overlong_filtering: bool = False  # training only: zero the loss mask of trajectories ending in "length"
    on_failure: FailurePolicy = "mask"  # what a failed trajectory does to the batch (module docstring)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # extra chat template variables
    end_of_turn_token_id: int | None = None  # None: detected from the chat template

    def __post_init__(self) -> None:
        _require(self.max_turns >= 1, f"max_turns must be >= 1, got {self.max_turns}")
        _require(self.max_input_length >= 1, f"max_input_length must be >= 1, got {self.max_input_length}")
        for name in ("max_generate_length", "max_response_length", "max_concurrent_trajectories"):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"{name} must be None or >= 1, got {value}")
        workers = self.max_env_workers
        _require(workers is None or workers >= 0, f"max_env_workers must be None or >= 0, got {workers}")
        for name in ("timeout_s", "close_timeout_s"):
            value = getattr(self, name)
            _require(value is None or value > 0, f"{name} must be positive, got {value}")
        _require(not self.batched or self.max_turns == 1, "batched mode is single-turn: set max_turns=1")
        _require(self.on_failure in ("mask", "raise"), f"on_failure must be 'mask' or 'raise', not {self.on_failure!r}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class _Step:
    """A validated env step."""

    observations: list[dict[str, Any]]
    reward: float
    done: bool


@dataclass
class _Rollout:
    """One trajectory in progress: its token sequences and bookkeeping."""

    trajectory_id: str
    env_class: str
    env: Env[Any, Any] | None = None
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per response token: its policy version; -1: not generated
    versioned: bool = False  # whether the engine reported a policy version for some turn
    stop_reason: TrajectoryStopReason = "stop"
    failure: TrajectoryError | None = None
    env_metrics: dict[str, Any] = field(default_factory=dict)
    turns: int = 0
    generated_tokens: int = 0
    llm_time_s: float = 0.0
    env_time_s: float = 0.0
    total_time_s: float = 0.0
    last_generated: int = -1  # index in response_ids of the latest generated token

    @property
    def input_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def add_generated(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float] | None,
        version: int | None = None,
        token_versions: Sequence[int] | None = None,
    ) -> None:
        """Append one turn's generated ids (loss mask 1) and count the turn.

        They were generated by policy ``version``, or per token by ``token_versions`` when the engine changed
        weights within the turn.
        """
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.rewards.extend([0.0] * len(ids))
        if token_versions is not None and len(token_versions) == len(ids):
            self.versions.extend(token_versions)
        else:
            self.versions.extend([-1 if version is None else version] * len(ids))
        self.versioned = self.versioned or version is not None or token_versions is not None
        self.generated_tokens += len(ids)
        self.turns += 1
        if ids:
            self.last_generated = len(self.response_ids) - 1

    def add_observation(self, ids: Sequence[int]) -> None:
        """Append ids the model did not generate (loss mask 0, log-probability 0.0)."""
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.rewards.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def add_reward(self, reward: float) -> None:
        """Add a turn's reward on the latest generated token (dropped if nothing was ever generated)."""
        if self.last_generated >= 0:
            self.rewards[self.last_generated] += reward

    def fail(self, error: TrajectoryError) -> None:
        """Record the first failure; later ones (e.g. a close after a step error) only add to the log."""
        logger.warning("trajectory %s (%s) failed: %s", self.trajectory_id, self.env_class, error, exc_info=error)
        if self.failure is None:
            self.failure = error
            self.stop_reason = error.stop_reason


def _classify(exc: TrajectoryError | TimeoutError, what: str) -> TrajectoryError:
    if isinstance(exc, TrajectoryError):
        return exc
    error = TrajectoryTimeoutError(f"{what} ran past its deadline")
    error.__cause__ = exc
    return error


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
        self.timeline: Timeline | None = None  # set by a run: engine and env calls are recorded as spans
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
        # One limit for every generate call of this generator (fully_async makes one call per group, many at once).
        self._slots: tuple[asyncio.AbstractEventLoop, AbstractAsyncContextManager[Any]] | None = None

    @property
    def env_runner(self) -> EnvRunner:
        """The thread pool env calls run in (skyrl-gym's current default unless one was given or configured)."""
        return self._env_runner or default_runner()

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
        return self._output(batch, rollouts)

    def _trajectory_slots(self) -> AbstractAsyncContextManager[Any]:
        """The generator's bound on trajectories at once, shared by all its calls on the running loop."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:  # a semaphore belongs to the loop it first ran on
            self._slots = (loop, _slots(self.config.max_concurrent_trajectories))
        return self._slots[1]

    # One trajectory at a time ------------------------------------------------------------------------------------

    async def _rollout(self, batch: GeneratorInput, i: int, slots: AbstractAsyncContextManager[Any]) -> _Rollout:
        rollout = _Rollout(trajectory_id=batch.trajectory_ids[i], env_class=batch.env_classes[i])
        async with slots:
            start = time.perf_counter()
            deadline = _deadline(self.config.timeout_s)
            try:
                prompt, extras, params = batch.prompts[i], batch.env_extras[i], batch.sampling_params
                episode = self._run_episode(rollout, prompt, extras, params, (i, len(batch.prompts)))
                await self._contain(rollout, episode, deadline, "the trajectory")
            finally:
                await self._finish(rollout)
                rollout.total_time_s = time.perf_counter() - start
        return rollout

    async def _run_episode(
        self,
        rollout: _Rollout,
        prompt: list[dict[str, str]],
        extras: Mapping[str, Any],
        params: SamplingParams,
        position: tuple[int, int],
    ) -> None:
        """The agent loop; sets ``rollout.stop_reason`` unless it raises a :class:`TrajectoryError`.

        ``position`` is ``(index in the batch, batch size)``: it spreads a seeded batch's seeds (see
        :meth:`_turn_params`).
        """
        index, batch_size = position
        env = await self._start(rollout, prompt, extras)
        if rollout.input_length > self.config.max_input_length:
            rollout.stop_reason = "context"
            return
        while True:
            turn_params = self._turn_params(len(rollout.response_ids), params, index + rollout.turns * batch_size)
            if turn_params is None:
                rollout.stop_reason = "length"
                return
            (output,) = await self._call_engine([rollout], turn_params)
            step = await self._take_turn(rollout, env, output, turn_params)
            if step.done:
                rollout.stop_reason = "length" if output.stop_reason == "length" else "stop"
                return
            if rollout.turns >= self.config.max_turns:
                rollout.stop_reason = "max_turns"
                return
            next_ids = self._next_turn_ids(rollout, output, step.observations)
            overflow = self._overflow(rollout, next_ids)
            if overflow is not None:
                rollout.stop_reason = overflow
                return
            rollout.add_observation(next_ids)

    # The whole batch in one engine call ----------------------------------------------------------------------------

    async def _generate_batched(self, batch: GeneratorInput, slots: AbstractAsyncContextManager[Any]) -> list[_Rollout]:
        """Single-turn rollouts: envs start concurrently, one engine call serves every prompt that fits."""
        rollouts = [
            _Rollout(trajectory_id=tid, env_class=env_class)
            for tid, env_class in zip(batch.trajectory_ids, batch.env_classes, strict=True)
        ]
        start = time.perf_counter()
        deadline = _deadline(self.config.timeout_s)

        async def start_env(i: int) -> None:
            async with slots:
                work = self._start(rollouts[i], batch.prompts[i], batch.env_extras[i])
                await self._contain(rollouts[i], work, deadline, "starting the env")

        async def finish_turn(rollout: _Rollout, output: GenerationOutput, params: SamplingParams) -> None:
            async with slots:
                assert rollout.env is not None
                step = await self._contain(rollout, self._take_turn(rollout, rollout.env, output, params), deadline)
                if step is not None:
                    done_reason: TrajectoryStopReason = "length" if output.stop_reason == "length" else "stop"
                    rollout.stop_reason = done_reason if step.done else "max_turns"

        async def finish_env(rollout: _Rollout) -> None:
            async with slots:
                await self._finish(rollout)

        try:
            await asyncio.gather(*(start_env(i) for i in range(len(rollouts))))
            ready = [r for r in rollouts if r.failure is None and not self._mark_if_too_long(r)]
            params = self._turn_params(0, batch.sampling_params)
            assert params is not None  # an empty response always has budget left
            outputs = await self._call_engine_for_all(ready, params, deadline)
            if outputs is not None:
                await asyncio.gather(*(finish_turn(r, out, params) for r, out in zip(ready, outputs, strict=True)))
        finally:
            await asyncio.gather(*(finish_env(r) for r in rollouts))
            for rollout in rollouts:
                rollout.total_time_s = time.perf_counter() - start
        return rollouts

    def _mark_if_too_long(self, rollout: _Rollout) -> bool:
        if rollout.input_length > self.config.max_input_length:
            rollout.stop_reason = "context"
            return True
        return False

    async def _call_engine_for_all(
        self, rollouts: list[_Rollout], params: SamplingParams, deadline: float | None
    ) -> list[GenerationOutput] | None:
        """One engine call for ``rollouts``; its failure is every one's failure (then returns None)."""
        if not rollouts:
            return []
        try:
            async with asyncio.timeout_at(deadline):
                return await self._call_engine(rollouts, params)
        except (TrajectoryError, TimeoutError) as exc:
            for rollout in rollouts:
                rollout.fail(_classify(exc, "the batched engine call"))
        return None

    # Pieces shared by both modes ------------------------------------------------------------------------------------

    async def _contain(
        self, rollout: _Rollout, work: Awaitable[T], deadline: float | None, what: str = "the step"
    ) -> T | None:
        """Await ``work`` before ``deadline``; a trajectory failure is recorded on ``rollout`` and gives None."""
        try:
            async with asyncio.timeout_at(deadline):
                return await work
        except (TrajectoryError, TimeoutError) as exc:
            rollout.fail(_classify(exc, what))
        return None

    async def _start(self, rollout: _Rollout, prompt: list[dict[str, str]], extras: Mapping[str, Any]) -> Any:
        """Make the env, ``init`` it with a copy of the prompt, and set the prompt ids."""
        args = (rollout.env_class, self.config.env_configs.get(rollout.env_class), extras, self.config.max_turns)
        workers = self.env_workers
        env: Any  # an Env, or a RemoteEnv standing in for one (the same calls, made in a worker)
        if workers is not None:
            env = await self._env_call(rollout, "make", lambda: workers.make(*args))
        else:
            env = await self._env_call(rollout, "make", lambda: self.env_runner.run(functools.partial(make_env, *args)))
        rollout.env = env
        initial = await self._env_call(rollout, "init", lambda: self.env_runner.ainit(env, copy.deepcopy(prompt)))
        if not (isinstance(initial, tuple) and len(initial) == 2 and isinstance(initial[0], list)):
            raise EnvError(f"{rollout.env_class}.init must return (messages, info), got {initial!r:.200}")
        messages: list[dict[str, Any]] = initial[0]
        rollout.prompt_ids = _render_env_messages(rollout, lambda: self.chat.prompt_ids(messages))
        return env

    async def _call_engine(self, rollouts: Sequence[_Rollout], params: SamplingParams) -> list[GenerationOutput]:
        """One ``engine.generate`` call for the rollouts' current inputs; time is charged to each of them."""
        prompts = [r.prompt_ids + r.response_ids for r in rollouts]
        start = time.perf_counter()
        try:
            with span_on(self.timeline, "engine", "generate"):
                outputs = await self.engine.generate(prompts, params)
        except Exception as exc:
            raise EngineError(f"engine.generate raised {type(exc).__name__}: {exc}") from exc
        finally:
            for rollout in rollouts:
                rollout.llm_time_s += time.perf_counter() - start
        if len(outputs) != len(prompts):
            raise EngineError(f"engine.generate returned {len(outputs)} outputs for {len(prompts)} prompts")
        return outputs

    async def _take_turn(
        self, rollout: _Rollout, env: Env[Any, Any], output: GenerationOutput, params: SamplingParams
    ) -> _Step:
        """Record the turn's generated ids, step the env with their text, and place the step's reward."""
        _check_output(output, params)
        rollout.add_generated(output.token_ids, output.logprobs, output.policy_version, output.token_policy_versions)
        text = output.text if output.text is not None else self._decode(output.token_ids)
        raw = await self._env_call(rollout, "step", lambda: self.env_runner.astep(env, text))
        step = _parse_step(raw, rollout.env_class)
        rollout.add_reward(step.reward)
        return step

    def _decode(self, ids: Sequence[int]) -> str:
        try:
            return self.chat.decode(ids)
        except Exception as exc:  # ids the tokenizer does not know are the engine's fault
            raise EngineError(f"the engine's output ids cannot be decoded: {exc}") from exc

    def _next_turn_ids(
        self, rollout: _Rollout, output: GenerationOutput, observations: list[dict[str, Any]]
    ) -> list[int]:
        """The non-generated ids that open the next turn.

        They are the end-of-turn token when the model did not sample it, then the observation messages and the
        generation prompt.
        """
        closing = [self.chat.end_of_turn_token_id] if self.chat.needs_end_of_turn(output.token_ids) else []
        observation = _render_env_messages(rollout, lambda: self.chat.observation_ids(observations))
        return closing + observation

    def _overflow(self, rollout: _Rollout, next_ids: Sequence[int]) -> TrajectoryStopReason | None:
        """Why ``next_ids`` cannot be appended for another turn, if they cannot."""
        if rollout.input_length + len(next_ids) > self.config.max_input_length:
            return "context"
        budget = self.config.max_response_length
        if budget is not None and len(rollout.response_ids) + len(next_ids) >= budget:
            return "length"  # no room left to generate even one token
        return None

    def _turn_params(self, response_length: int, params: SamplingParams, seed_offset: int = 0) -> SamplingParams | None:
        """Sampling params for the next turn after ``response_length`` response tokens; None when no budget is left.

        With ``params.seed = s`` the turn samples with seed ``s + seed_offset``; the agent loop passes
        ``index + turn * batch_size``, so every turn of every trajectory gets its own seed (identical seeds would
        make all samples of a prompt, and every turn of a trajectory, draw the same noise) and a rerun of the
        batch reproduces them. Batched mode passes ``s`` and the engine offsets it by prompt position.
        """
        caps = [params.max_tokens]
        if self.config.max_generate_length is not None:
            caps.append(self.config.max_generate_length)
        if self.config.max_response_length is not None:
            caps.append(self.config.max_response_length - response_length)
        max_tokens = min(caps)
        if max_tokens < 1:
            return None
        stop_ids = params.stop_token_ids
        if self.chat.end_of_turn_token_id not in stop_ids:
            # The model must stop at the end of its turn even when the template's end-of-turn is not the EOS.
            stop_ids = (*stop_ids, self.chat.end_of_turn_token_id)
        seed = None if params.seed is None else params.seed + seed_offset
        return dataclasses.replace(params, max_tokens=max_tokens, stop_token_ids=stop_ids, seed=seed)

    async def _env_call(self, rollout: _Rollout, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Await one env call, charging its time to the rollout and turning its exceptions into :class:`EnvError`."""
        start = time.perf_counter()
        try:
            with span_on(self.timeline, "env", what):
                return await call()
        except Exception as exc:
            raise EnvError(f"{rollout.env_class} {what} raised {type(exc).__name__}: {exc}") from exc
        finally:
            rollout.env_time_s += time.perf_counter() - start

    async def _finish(self, rollout: _Rollout) -> None:
        """Read the env's metrics and close it, each bounded by ``close_timeout_s``; failures are recorded."""
        env = rollout.env
        if env is None:
            return
        get_metrics = getattr(env, "get_metrics", None)
        if callable(get_metrics):
            metrics = await self._contain(
                rollout,
                self._env_call(rollout, "get_metrics", lambda: self.env_runner.run(get_metrics)),
                _deadline(self.config.close_timeout_s),
                "env.get_metrics",
            )
            if isinstance(metrics, Mapping):
                rollout.env_metrics = dict(metrics)
        await self._contain(
            rollout,
            self._env_call(rollout, "close", lambda: self.env_runner.aclose(env)),
            _deadline(self.config.close_timeout_s),
            "env.close",
        )

    # Output ----------------------------------------------------------------------------------------------------

    def _output(self, batch: GeneratorInput, rollouts: list[_Rollout]) -> GeneratorOutput:
        """Assemble the output: failures masked, then (training only) the configured post-processing."""
        loss_masks = [[0] * len(r.loss_mask) if r.failure else list(r.loss_mask) for r in rollouts]
        rewards = [[0.0] * len(r.rewards) if r.failure else list(r.rewards) for r in rollouts]
        stop_reasons = [r.stop_reason for r in rollouts]
        if batch.training and self.config.zero_reward_on_non_stop:
            rewards = zero_rewards_on_non_stop(rewards, stop_reasons)
        if batch.training and self.config.apply_overlong_filtering:
            loss_masks = mask_overlong(loss_masks, stop_reasons)
        return GeneratorOutput(
            prompt_token_ids=[r.prompt_ids for r in rollouts],
            response_ids=[r.response_ids for r in rollouts],
            loss_masks=loss_masks,
            rewards=rewards,
            rollout_logprobs=[r.logprobs for r in rollouts] if batch.sampling_params.logprobs else None,
            stop_reasons=stop_reasons,
            trajectory_ids=list(batch.trajectory_ids),
            policy_versions=[r.versions for r in rollouts] if any(r.versioned for r in rollouts) else None,
            env_metrics=[r.env_metrics for r in rollouts],
            metrics=_rollout_metrics(rollouts, rewards),
        )


def zero_rewards_on_non_stop(
    rewards: list[list[float]], stop_reasons: Sequence[TrajectoryStopReason]
) -> list[list[float]]:
    """Token-level rewards with every trajectory whose stop reason is not ``stop`` set to 0."""
    return [row if reason == "stop" else [0.0] * len(row) for row, reason in zip(rewards, stop_reasons, strict=True)]


def mask_overlong(loss_masks: list[list[int]], stop_reasons: Sequence[TrajectoryStopReason]) -> list[list[int]]:
    """Loss masks with every trajectory that stopped for ``length`` masked out (DAPO overlong filtering)."""
    return [[0] * len(row) if reason == "length" else row for row, reason in zip(loss_masks, stop_reasons, strict=True)]


def _rollout_metrics(rollouts: Sequence[_Rollout], rewards: Sequence[Sequence[float]]) -> dict[str, float]:
    """Batch statistics: response/generated token counts, turns, LLM vs env time, stop reasons, env rewards."""
    if not rollouts:
        return {}
    lengths = [len(r.response_ids) for r in rollouts]
    totals = [sum(row) for row in rewards]
    metrics: dict[str, float] = {
        "generate/num_trajectories": float(len(rollouts)),
        **_stats("generate/num_tokens", lengths),
        **_stats("generate/num_prompt_tokens", [len(r.prompt_ids) for r in rollouts]),
        **_stats("generate/num_generated_tokens", [r.generated_tokens for r in rollouts]),
        **_stats("generate/num_turns", [r.turns for r in rollouts]),
        **_stats("generate/llm_time_s", [r.llm_time_s for r in rollouts]),
        **_stats("generate/env_time_s", [r.env_time_s for r in rollouts]),
        **_stats("generate/trajectory_time_s", [r.total_time_s for r in rollouts]),
    }
    zero = [n for n, total in zip(lengths, totals, strict=True) if total == 0]
    nonzero = [n for n, total in zip(lengths, totals, strict=True) if total != 0]
    if zero:
        metrics["generate/avg_tokens_zero_reward"] = _mean(zero)
    if nonzero:
        metrics["generate/avg_tokens_nonzero_reward"] = _mean(nonzero)
    for reason in STOP_REASONS:
        metrics[f"generate/stop_reason/{reason}"] = float(sum(r.stop_reason == reason for r in rollouts))
    metrics.update(_env_metrics(rollouts, totals))
    return metrics


def _env_metrics(rollouts: Sequence[_Rollout], totals: Sequence[float]) -> dict[str, float]:
    """Per env class: the mean trajectory reward and the env's own aggregated numeric metrics."""
    by_class: dict[str, list[int]] = {}
    for i, rollout in enumerate(rollouts):
        by_class.setdefault(rollout.env_class, []).append(i)
    metrics: dict[str, float] = {}
    for env_class, rows in by_class.items():
        metrics[f"environment/{env_class}/avg_reward"] = _mean([totals[i] for i in rows])
        envs = [rollouts[i].env for i in rows if rollouts[i].env is not None]
        aggregate = getattr(type(envs[0]), "aggregate_metrics", None) if envs else None
        if aggregate is None:
            continue
        try:
            combined = aggregate([rollouts[i].env_metrics for i in rows if rollouts[i].env_metrics])
        except Exception:  # an env's metric helper must not fail the batch; the rewards are still reported
            logger.warning("aggregate_metrics of %s raised", env_class, exc_info=True)
            continue
        for key, value in dict(combined).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[f"environment/{env_class}/{key}"] = float(value)
    return metrics


def _stats(name: str, values: Sequence[float]) -> dict[str, float]:
    return {
        f"{name}/min": float(min(values)),
        f"{name}/max": float(max(values)),
        f"{name}/mean": _mean(values),
        f"{name}/std": float(statistics.pstdev(values)) if len(values) > 1 else 0.0,
    }


def _mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values))


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


def _deadline(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s


def _check_output(output: GenerationOutput, params: SamplingParams) -> None:
    """Raise :class:`EngineError` for an output the trajectory cannot use."""
    if output.stop_reason not in ("stop", "length"):
        raise EngineError(f"the engine ended the request with stop reason {output.stop_reason!r}")
    if len(output.token_ids) > params.max_tokens:
        raise EngineError(f"the engine returned {len(output.token_ids)} tokens for max_tokens={params.max_tokens}")
    if params.logprobs and (output.logprobs is None or len(output.logprobs) != len(output.token_ids)):
        got = "none" if output.logprobs is None else len(output.logprobs)
        raise EngineError(f"the engine returned {got} logprobs for {len(output.token_ids)} tokens")


def _parse_step(raw: Any, env_class: str) -> _Step:
    """Validate an env step's output; a malformed one is the env's failure."""
    try:
        observations = raw["observations"]
        done = raw["done"]
        reward = float(raw["reward"])
    except (TypeError, KeyError, ValueError) as exc:
        raise EnvError(f"{env_class}.step returned a malformed output ({exc!r}): {raw!r:.200}") from exc
    if not isinstance(observations, list) or not all(isinstance(m, Mapping) for m in observations):
        raise EnvError(f"{env_class}.step observations must be a list of messages, got {observations!r:.200}")
    if not math.isfinite(reward):
        raise EnvError(f"{env_class}.step returned a non-finite reward {reward}")
    return _Step(observations=[dict(m) for m in observations], reward=reward, done=bool(done))


def _render_env_messages(rollout: _Rollout, render: Callable[[], list[int]]) -> list[int]:
    """Run a chat-template render of env messages; a template error there is the env's failure."""
    try:
        return render()
    except Exception as exc:
        raise EnvError(f"{rollout.env_class} messages cannot be rendered with the chat template: {exc}") from exc
