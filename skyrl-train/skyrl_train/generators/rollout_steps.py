"""The steps of a trajectory that both modes of the default generator share.

Start the env (make, ``init``, render the prompt), call the engine, take a turn (record the generated ids, step the
env, place the reward), plan the next turn, and finish (read the env's metrics, close it). Every env call is timed
and charged to its trajectory, and its exceptions become :class:`~skyrl_train.generators.trajectory.EnvError`; an
engine failure becomes :class:`~skyrl_train.generators.trajectory.EngineError`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from skyrl_gym.async_env import EnvRunner, default_runner
from skyrl_gym.core import Env
from skyrl_train.generators.base import TrajectoryStopReason
from skyrl_train.generators.chat import ChatEncoder
from skyrl_train.generators.envs import make_env
from skyrl_train.generators.gym_config import GeneratorConfig
from skyrl_train.generators.trajectory import (
    EngineError,
    EnvError,
    Rollout,
    Step,
    TrajectoryError,
    check_output,
    classify,
    parse_step,
    render_env_messages,
)
from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams
from skyrl_train.timeline import span_on

if TYPE_CHECKING:
    from skyrl_train.generators.env_workers import EnvWorkers
    from skyrl_train.timeline import Timeline

__all__ = ["RolloutSteps", "deadline_after"]

T = TypeVar("T")


class RolloutSteps:
    """What a trajectory does, one step at a time, with ``engine`` and its env.

    ``env_runner``: the thread pool for blocking env calls (None: skyrl-gym's current default); ``env_workers``:
    make every env in Ray actors instead. ``timeline``, when set, records engine and env calls as spans.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        chat: ChatEncoder,
        config: GeneratorConfig,
        env_runner: EnvRunner | None,
        env_workers: EnvWorkers | None,
    ) -> None:
        self.engine = engine
        self.chat = chat
        self.config = config
        self.env_workers = env_workers
        self.timeline: Timeline | None = None
        self._env_runner = env_runner

    @property
    def env_runner(self) -> EnvRunner:
        """The thread pool env calls run in (skyrl-gym's current default unless one was given)."""
        return self._env_runner or default_runner()

    async def contain(
        self, rollout: Rollout, work: Awaitable[T], deadline: float | None, what: str = "the step"
    ) -> T | None:
        """Await ``work`` before ``deadline``; a trajectory failure is recorded on ``rollout`` and gives None."""
        try:
            async with asyncio.timeout_at(deadline):
                return await work
        except (TrajectoryError, TimeoutError) as exc:
            rollout.fail(classify(exc, what))
        return None

    async def start(self, rollout: Rollout, prompt: list[dict[str, str]], extras: Mapping[str, Any]) -> Any:
        """Make the env, ``init`` it with a copy of the prompt, and set the prompt ids."""
        args = (rollout.env_class, self.config.env_configs.get(rollout.env_class), extras, self.config.max_turns)
        workers = self.env_workers
        env: Any  # an Env, or a RemoteEnv standing in for one (the same calls, made in a worker)
        if workers is not None:
            env = await self.env_call(rollout, "make", lambda: workers.make(*args))
        else:
            env = await self.env_call(rollout, "make", lambda: self.env_runner.run(functools.partial(make_env, *args)))
        rollout.env = env
        initial = await self.env_call(rollout, "init", lambda: self.env_runner.ainit(env, copy.deepcopy(prompt)))
        if not (isinstance(initial, tuple) and len(initial) == 2 and isinstance(initial[0], list)):
            raise EnvError(f"{rollout.env_class}.init must return (messages, info), got {initial!r:.200}")
        messages: list[dict[str, Any]] = initial[0]
        rollout.prompt_ids = render_env_messages(rollout, lambda: self.chat.prompt_ids(messages))
        return env

    async def call_engine(self, rollouts: Sequence[Rollout], params: SamplingParams) -> list[GenerationOutput]:
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

    async def take_turn(
        self, rollout: Rollout, env: Env[Any, Any], output: GenerationOutput, params: SamplingParams
    ) -> Step:
        """Record the turn's generated ids, step the env with their text, and place the step's reward."""
        check_output(output, params)
        rollout.add_generated(output.token_ids, output.logprobs, output.policy_version, output.token_policy_versions)
        text = output.text if output.text is not None else self._decode(output.token_ids)
        raw = await self.env_call(rollout, "step", lambda: self.env_runner.astep(env, text))
        step = parse_step(raw, rollout.env_class)
        rollout.add_reward(step.reward)
        return step

    def next_turn_ids(
        self, rollout: Rollout, output: GenerationOutput, observations: list[dict[str, Any]]
    ) -> list[int]:
        """The non-generated ids that open the next turn.

        They are the end-of-turn token when the model did not sample it, then the observation messages and the
        generation prompt.
        """
        closing = [self.chat.end_of_turn_token_id] if self.chat.needs_end_of_turn(output.token_ids) else []
        observation = render_env_messages(rollout, lambda: self.chat.observation_ids(observations))
        return closing + observation

    def overflow(self, rollout: Rollout, next_ids: Sequence[int]) -> TrajectoryStopReason | None:
        """Why ``next_ids`` cannot be appended for another turn, if they cannot."""
        if rollout.input_length + len(next_ids) > self.config.max_input_length:
            return "context"
        budget = self.config.max_response_length
        if budget is not None and len(rollout.response_ids) + len(next_ids) >= budget:
            return "length"  # no room left to generate even one token
        return None

    def turn_params(self, response_length: int, params: SamplingParams, seed_offset: int = 0) -> SamplingParams | None:
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

    async def env_call(self, rollout: Rollout, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Await one env call, charging its time to the rollout and turning its exceptions into :class:`EnvError`."""
        start = time.perf_counter()
        try:
            with span_on(self.timeline, "env", what):
                return await call()
        except Exception as exc:
            raise EnvError(f"{rollout.env_class} {what} raised {type(exc).__name__}: {exc}") from exc
        finally:
            rollout.env_time_s += time.perf_counter() - start

    async def finish(self, rollout: Rollout) -> None:
        """Read the env's metrics and close it, each bounded by ``close_timeout_s``; failures are recorded."""
        env = rollout.env
        if env is None:
            return
        get_metrics = getattr(env, "get_metrics", None)
        if callable(get_metrics):
            metrics = await self.contain(
                rollout,
                self.env_call(rollout, "get_metrics", lambda: self.env_runner.run(get_metrics)),
                deadline_after(self.config.close_timeout_s),
                "env.get_metrics",
            )
            if isinstance(metrics, Mapping):
                rollout.env_metrics = dict(metrics)
        await self.contain(
            rollout,
            self.env_call(rollout, "close", lambda: self.env_runner.aclose(env)),
            deadline_after(self.config.close_timeout_s),
            "env.close",
        )

    def _decode(self, ids: Sequence[int]) -> str:
        try:
            return self.chat.decode(ids)
        except Exception as exc:  # ids the tokenizer does not know are the engine's fault
            raise EngineError(f"the engine's output ids cannot be decoded: {exc}") from exc


def deadline_after(timeout_s: float | None) -> float | None:
    """The running loop's time ``timeout_s`` from now (None: no deadline)."""
    return None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
