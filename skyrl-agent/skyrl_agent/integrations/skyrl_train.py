"""The bridge to skyrl-train: agent episodes as a ``Generator``, and an LLM client over its inference engines.

``skyrl_train`` (and with it torch) is imported only inside the calls that need it, so this module imports
without it. The pieces::

    AgentGenerator.generate(GeneratorInput) ─► one SWE episode per row, through the dispatcher
        (acquire sandbox → ReAct agent with a TrainEngineClient per episode → grade → release)
        ─► GeneratorOutput: token rows (``tokens.trajectory_tokens``) with the failure policy applied (``tokens.treat``)
    AgentGenerator.engine: the inference engine whose pause/resume also stop the episodes' clock

Give ``generator.engine`` (not the bare engine) to the trainer: its weight syncs then pause the episode deadlines
(time paused counts against none of them) and hold new LLM calls until generation resumes.

Rows of a :class:`GeneratorInput` name their task in ``env_extras`` (``task``: an ``SWETask`` or its JSON row, or
``task_id`` with an optional ``tasks_path``); ``env_classes`` must be ``swe``. Samples of one prompt (trajectory ids
``"<uid>:<k>"``) form one dispatcher group, so the policy's ``drop_group`` acts on them together. The output keeps
one row per input row: a dropped group's rows are masked, not removed (the protocol fixes the length).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from skyrl_agent.agents.react import AgentConfig, Trajectory
from skyrl_agent.agents.swe_env import task_from_options
from skyrl_agent.dispatch import DispatcherConfig, Episode, EpisodeResult, PausableClock
from skyrl_agent.dispatch.admission import AdmissionConfig, AdmissionController, LoadSource
from skyrl_agent.dispatch.dispatcher import LLMFactory
from skyrl_agent.dispatch.outcomes import Treatment
from skyrl_agent.integrations.tokens import (
    ChatTemplate,
    TokenError,
    TokenRow,
    between_turns,
    first_prompt_ids,
    trajectory_tokens,
    treat,
)
from skyrl_agent.llm.base import (
    Completion,
    LLMClient,
    LLMError,
    LLMResponseError,
    Message,
    Prompt,
    SamplingParams,
    Usage,
)
from skyrl_agent.pipeline import SWEPipeline
from skyrl_agent.sandbox.base import SandboxBackend
from skyrl_agent.sandbox.group_fork import group_of
from skyrl_agent.spans import SpanRecorder, span_on

if TYPE_CHECKING:
    import torch

    from skyrl_train.generators.base import GeneratorInput, GeneratorOutput, TrajectoryStopReason
    from skyrl_train.inference.base import InferenceEngine
    from skyrl_train.inference.base import SamplingParams as EngineParams

__all__ = ["AgentGenerator", "AgentGeneratorConfig", "PausingEngine", "TrainEngineClient", "engine_admission"]


class TrainEngineClient:
    """An :class:`~skyrl_agent.llm.base.LLMClient` over a skyrl-train ``InferenceEngine``, token in / token out.

    One client serves one conversation (make one per episode). The first call renders the chat messages with
    ``chat``. A later call whose messages extend the previous call's messages plus its reply sends the ids the
    engine already saw and sampled, followed by only the new messages' ids (:func:`~.tokens.between_turns`), so
    earlier turns are never re-tokenised and every completion's ``prompt_token_ids`` extends the previous one.
    Any other prompt is rendered whole; token-id prompts are sent as they are.

    Args:
        engine: The engine; the caller owns it.
        chat: The chat template as token ids (``skyrl_train.generators.chat.ChatEncoder(tokenizer)``).
        base_params: Engine sampling fields the agent's :class:`SamplingParams` do not carry (``top_k``, ``min_p``,
            ``stop_token_ids``); default the engine's defaults.
        max_input_length: Prompts this long or longer are not sent: the call returns no tokens, finish reason
            ``length`` and the prompt's size as usage, which ends the agent's episode for lack of context.
        seed_offset: Added to a seeded call's seed, with ``seed_stride`` per earlier call, so that the samples of
            one prompt and the turns of one episode draw different noise (and a rerun draws the same).
        seed_stride: See ``seed_offset`` (use the batch size).
        spans: Where to record each engine call as a ``generate`` span on the ``engine`` lane.

    Raises (from :meth:`complete`):
        LLMError: The engine raised or aborted the request. LLMResponseError: Its output was malformed.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        chat: ChatTemplate,
        *,
        base_params: EngineParams | None = None,
        max_input_length: int | None = None,
        seed_offset: int = 0,
        seed_stride: int = 1,
        spans: SpanRecorder | None = None,
    ) -> None:
        self.engine, self.chat, self.base_params = engine, chat, base_params
        self.spans = spans
        self.max_input_length = max_input_length
        self.seed_offset, self.seed_stride = seed_offset, seed_stride
        self.calls = 0
        self._messages: list[Message] = []  # the last call's messages plus its reply
        self._ids: list[int] = []  # the last call's prompt ids plus its generated ids
        self._generated: list[int] = []  # the last call's generated ids

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        """One completion; ``timeout_s`` is ignored (the dispatcher's deadlines cancel the call)."""
        messages = _messages(prompt)
        ids = self.prompt_ids(prompt)
        if self.max_input_length is not None and len(ids) >= self.max_input_length:
            return Completion("", [], [], "length", Usage(len(ids), 0), prompt_token_ids=ids)
        engine_params = self._engine_params(params)
        self.calls += 1
        try:
            with span_on(self.spans, "engine", "generate"):
                outputs = await self.engine.generate([ids], engine_params)
        except Exception as exc:  # any engine failure is the model's side failing, not the agent's
            raise LLMError(f"engine.generate raised {type(exc).__name__}: {exc}") from exc
        completion = self._completion(outputs, ids, engine_params)
        self._remember(messages, ids, completion)
        return completion

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The ids this client sends for ``prompt`` (see the class docstring)."""
        messages = _messages(prompt)
        if messages is None:
            return [int(token) for token in cast("Sequence[int]", prompt)]
        known = len(self._messages)
        if known and len(messages) > known and messages[:known] == self._messages:
            return self._ids + between_turns(self.chat, self._generated, messages[known:])
        return self.chat.prompt_ids(messages)

    def _engine_params(self, params: SamplingParams) -> EngineParams:
        from skyrl_train.inference.base import SamplingParams as EngineParams

        base = self.base_params or EngineParams()
        stop_ids = base.stop_token_ids
        if self.chat.end_of_turn_token_id not in stop_ids:
            # The model must stop at the end of its turn even when the template's end of turn is not the EOS.
            stop_ids = (*stop_ids, self.chat.end_of_turn_token_id)
        seed = None if params.seed is None else params.seed + self.seed_offset + self.calls * self.seed_stride
        return dataclasses.replace(
            base,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=tuple(params.stop),
            stop_token_ids=stop_ids,
            logprobs=params.logprobs,
            seed=seed,
        )

    def _completion(self, outputs: Sequence[Any], ids: list[int], params: EngineParams) -> Completion:
        if len(outputs) != 1:
            raise LLMResponseError(f"engine.generate returned {len(outputs)} outputs for one prompt")
        out = outputs[0]
        if out.stop_reason not in ("stop", "length"):
            raise LLMError(f"the engine ended the request with stop reason {out.stop_reason!r}")
        tokens = [int(t) for t in out.token_ids]
        logprobs = None if out.logprobs is None else [float(x) for x in out.logprobs]
        if params.logprobs and (logprobs is None or len(logprobs) != len(tokens)):
            got = "no" if logprobs is None else len(logprobs)
            raise LLMResponseError(f"the engine returned {got} logprobs for {len(tokens)} tokens")
        text = out.text if out.text is not None else self.chat.decode(tokens)
        usage = Usage(len(ids), len(tokens))
        return Completion(text, tokens, logprobs, out.stop_reason, usage, prompt_token_ids=ids)

    def _remember(self, messages: list[Message] | None, ids: list[int], completion: Completion) -> None:
        """Keep what the next call needs to extend this conversation (nothing after a token-id prompt)."""
        if messages is None:
            self._messages, self._ids, self._generated = [], [], []
            return
        self._messages = [*messages, {"role": "assistant", "content": completion.text}]
        self._generated = list(completion.token_ids or [])
        self._ids = ids + self._generated


def _messages(prompt: Prompt) -> list[Message] | None:
    """The prompt's chat messages, or None for a token-id prompt."""
    if prompt and isinstance(prompt[0], dict):
        return list(cast("Sequence[Message]", prompt))
    return None


class PausingEngine:
    """An ``InferenceEngine`` whose :meth:`pause`/:meth:`resume` also stop and restart the episodes' clock.

    Everything else goes to the wrapped engine (``inner``, which may be None for scripted policies: then only the
    clock pauses and :meth:`generate` raises).
    """

    def __init__(self, inner: InferenceEngine | None, clock: PausableClock) -> None:
        self.inner, self.clock = inner, clock

    async def generate(self, prompts: Sequence[Sequence[int]], params: EngineParams) -> list[Any]:
        """The wrapped engine's ``generate``."""
        return list(await self._engine().generate(prompts, params))

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The wrapped engine's ``update_weights``."""
        await self._engine().update_weights(weights)

    async def pause(self) -> None:
        """Stop the episode clock first (waiting for in-flight requests is paused time too), then the engine."""
        self.clock.pause()
        if self.inner is not None:
            await self.inner.pause()

    async def resume(self) -> None:
        """Resume the engine, then the clock (held LLM calls go on once both run)."""
        if self.inner is not None:
            await self.inner.resume()
        self.clock.resume()

    async def close(self) -> None:
        """Close the wrapped engine."""
        if self.inner is not None:
            await self.inner.close()

    def _engine(self) -> InferenceEngine:
        if self.inner is None:
            raise RuntimeError("this generator has no inference engine (it runs a scripted policy)")
        return self.inner


@dataclasses.dataclass(frozen=True)
class AgentGeneratorConfig:
    """Settings of :class:`AgentGenerator`. Lengths are in tokens."""

    max_turns: int = 30  # LLM calls per episode at most (then the episode is truncated: zero reward by default)
    max_input_length: int = 32768  # prompt + response of one LLM call at most (the agent's context budget)
    dispatcher: DispatcherConfig = dataclasses.field(default_factory=DispatcherConfig)  # limits, deadlines, policy
    env_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # e.g. command_timeout_s for SWEEnv
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # on every sandbox (e.g. skyrl.run)
    # The run limit follows the engine's load() when it reports one (at most dispatcher.limits.run); the start rate.
    admission: AdmissionConfig = dataclasses.field(default_factory=AdmissionConfig)


class AgentGenerator:
    """skyrl-train's ``Generator`` over SWE agent episodes (see the module docstring).

    Args:
        backend: Where sandboxes come from; the caller owns it.
        chat: The chat template as token ids (``ChatEncoder(tokenizer)``), for prompts and observations.
        engine: The inference engine the policy samples from: each episode gets a :class:`TrainEngineClient`.
        llm: Instead of the engine's clients: one client, or a function of the :class:`Episode` (scripted
            policies). Its completions must carry token ids (and logprobs when the batch asks for them).
        config: Turn and context limits, the dispatcher's settings (including the failure policy).
    """

    def __init__(
        self,
        backend: SandboxBackend,
        chat: ChatTemplate,
        *,
        engine: InferenceEngine | None = None,
        llm: LLMClient | LLMFactory | None = None,
        config: AgentGeneratorConfig | None = None,
    ) -> None:
        if engine is None and llm is None:
            raise ValueError("AgentGenerator needs an inference engine or an LLM client")
        self.backend, self.chat, self.llm = backend, chat, llm
        self.config = config or AgentGeneratorConfig()
        self.clock = PausableClock()  # shared by every batch's dispatcher, so one pause holds them all
        self.engine = PausingEngine(engine, self.clock)
        self._inner_engine = engine
        # One for every batch: the limit it reached carries over, and the start rate holds across batches at once.
        self.admission = engine_admission(engine, self.config.admission)
        # Set by a skyrl-train run to its timeline: sandbox starts, env calls, LLM calls and grading become spans.
        self.timeline: SpanRecorder | None = None

    async def pause(self) -> None:
        """Stop the episode clock and pause the engine (e.g. around a weight sync)."""
        await self.engine.pause()

    async def resume(self) -> None:
        """Resume the engine and the episode clock."""
        await self.engine.resume()

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        """Run one episode per row of ``batch``; one output row per input row, in order.

        Raises:
            ValueError: The batch's lists differ in length, a row's env class is not ``swe``, or a row names no task.
        """
        episodes = self._episodes(batch)
        pipeline = self._pipeline(batch)
        llm = self.llm if self.llm is not None else self._engine_clients(batch)
        dispatcher = pipeline.dispatcher(llm, self.config.dispatcher, clock=self.clock, admission=self.admission)
        dispatched = await dispatcher.run(episodes)
        rows = [self._row(result, pipeline, batch) for result in dispatched.results]
        output = self._output(batch, dispatched.results, rows)
        output.metrics = {**_batch_metrics(rows, dispatched.metrics), **pipeline.group_setup_metrics()}
        return output

    def _episodes(self, batch: GeneratorInput) -> list[Episode]:
        sizes = {len(batch.prompts), len(batch.env_classes), len(batch.env_extras), len(batch.trajectory_ids)}
        if len(sizes) != 1:
            raise ValueError("GeneratorInput lists must have one entry per trajectory")
        episodes = []
        for index, (env_class, extras, tid) in enumerate(
            zip(batch.env_classes, batch.env_extras, batch.trajectory_ids, strict=True)
        ):
            if env_class != "swe":
                raise ValueError(f"AgentGenerator runs SWE episodes; row {index} ({tid}) has env class {env_class!r}")
            task = task_from_options({**self.config.env_options, **extras})
            data = {"task": task, "task_id": task.id, "index": index}
            episodes.append(Episode(tid, data, group_id=group_of(tid)))
        return episodes

    def _pipeline(self, batch: GeneratorInput) -> SWEPipeline:
        p = batch.sampling_params
        params = SamplingParams(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            stop=tuple(p.stop),
            seed=p.seed,
            logprobs=p.logprobs,
        )
        budget = self.config.max_input_length  # the agent stops for lack of context before the engine would
        agent = AgentConfig(max_turns=self.config.max_turns, context_budget_tokens=budget, params=params)
        return SWEPipeline(
            self.backend, agent, labels=self.config.labels, env_options=self.config.env_options, spans=self.timeline
        )

    def _engine_clients(self, batch: GeneratorInput) -> LLMFactory:
        """A fresh client per episode attempt: a client holds one conversation's ids."""
        engine, size = self._inner_engine, len(batch.trajectory_ids)
        assert engine is not None  # checked in __init__: without an llm there is an engine

        def client(episode: Episode) -> LLMClient:
            return TrainEngineClient(
                engine,
                self.chat,
                base_params=batch.sampling_params,
                max_input_length=self.config.max_input_length,
                seed_offset=int(episode.data["index"]),
                seed_stride=size,
                spans=self.timeline,
            )

        return client

    def _row(self, result: EpisodeResult, pipeline: SWEPipeline, batch: GeneratorInput) -> _Row:
        """The episode's token row with the policy applied."""
        trajectory = result.trajectory
        if not (isinstance(trajectory, Trajectory) and trajectory.turns):
            # No turn ran (e.g. the sandbox never started): a prompt-only row (collating needs a non-empty prompt).
            tokens = TokenRow(self.chat.prompt_ids(pipeline.instructions(result.episode.data["task"])))
            return _Row(tokens, treat(tokens, result), result.treatment.value, result.error)
        try:
            tokens = trajectory_tokens(trajectory, self.chat, logprobs=batch.sampling_params.logprobs)
        except TokenError as exc:
            tokens = TokenRow(first_prompt_ids(trajectory, self.chat))
            if result.treatment in (Treatment.MASK, Treatment.DROP_GROUP):
                return _Row(tokens, treat(tokens, result), result.treatment.value, result.error)
            # Training on ids the engine did not sample (or without their logprobs) would be silently wrong.
            return _Row(tokens, "engine_error", Treatment.MASK.value, f"tokens: {exc}")
        return _Row(tokens, treat(tokens, result), result.treatment.value, result.error)

    def _output(self, batch: GeneratorInput, results: Sequence[EpisodeResult], rows: Sequence[_Row]) -> GeneratorOutput:
        from skyrl_train.generators.base import GeneratorOutput

        return GeneratorOutput(
            prompt_token_ids=[row.tokens.prompt_ids for row in rows],
            response_ids=[row.tokens.response_ids for row in rows],
            loss_masks=[row.tokens.loss_mask for row in rows],
            rewards=[row.tokens.rewards for row in rows],
            rollout_logprobs=[row.tokens.logprobs for row in rows] if batch.sampling_params.logprobs else None,
            stop_reasons=[cast("TrajectoryStopReason", row.stop_reason) for row in rows],
            trajectory_ids=list(batch.trajectory_ids),
            env_metrics=[row.metrics(result) for result, row in zip(results, rows, strict=True)],
        )


@dataclasses.dataclass
class _Row:
    """One output row: its tokens, stop reason, the treatment applied and why it failed (if it did)."""

    tokens: TokenRow
    stop_reason: str
    treatment: str
    error: str | None

    def metrics(self, result: EpisodeResult) -> dict[str, Any]:
        """How the episode ended and what training does with it (a stop reason cannot say it all)."""
        return {
            "outcome": result.outcome.value,
            "treatment": self.treatment,
            "resolved": float(bool(result.grade and result.grade.resolved)),
            "attempts": result.attempts,
            "turns": self.tokens.turns,
            "error": self.error,
        }


def engine_admission(engine: object, config: AdmissionConfig) -> AdmissionController | None:
    """The admission controller of ``engine``, or None when the dispatcher's fixed limits apply.

    It follows ``engine.load()`` when the engine has one (an optional method of skyrl-train engines, found by duck
    typing) and ``config.enabled``; otherwise, with ``config.starts_per_s`` set, it only spaces sandbox starts.
    """
    load = getattr(engine, "load", None)
    source = cast("LoadSource", load) if callable(load) and config.enabled else None
    if source is None and config.starts_per_s is None:
        return None
    return AdmissionController(config, source)


def _batch_metrics(rows: Sequence[_Row], dispatch: Mapping[str, float]) -> dict[str, float]:
    """The dispatcher's metrics under ``agent/``; token counts and stop reasons under ``generate/``."""
    metrics = {f"agent/{name}": float(value) for name, value in dispatch.items()}
    if not rows:
        return metrics
    tokens = [row.tokens for row in rows]
    metrics["generate/num_trajectories"] = float(len(rows))
    metrics["generate/num_tokens/mean"] = statistics.fmean(len(t.response_ids) for t in tokens)
    metrics["generate/num_generated_tokens/mean"] = statistics.fmean(t.loss_mask.count(1) for t in tokens)
    metrics["generate/num_turns/mean"] = statistics.fmean(t.turns for t in tokens)
    for reason in sorted({row.stop_reason for row in rows}):
        metrics[f"generate/stop_reason/{reason}"] = float(sum(row.stop_reason == reason for row in rows))
    return metrics
