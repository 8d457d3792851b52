"""Harnesses behind skyrl-train's gateway: a ``Generator`` over harness episodes, and a scripted oracle engine.

::

    HarnessGenerator.generate(GeneratorInput)
        for each row, through the dispatcher: a sandbox for the row's task, a gateway session, the harness in its
        own thread with that session as its model server, the workspace diff graded by the hidden tests
        ─► one token row per input row: the session's recorded sample (prompt ids, the engine's sampled ids and
            log-probs, loss mask 1 on exactly those), the reward on its last sampled token

The gateway (``skyrl_train.gateway``) renders each request with the policy's chat template and records what the
engine sampled; the harness only ever sees an OpenAI-compatible URL. A session whose harness rewrote its context
records several samples; the row is the last one (the one that ended the episode) and
``harness/samples_per_episode`` says how often that happened. skyrl-train is imported inside the calls that need
it, so this module imports without torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from skyrl_agent.dispatch import EpisodeResult
from skyrl_agent.harness.base import Harness, SessionTicket
from skyrl_agent.harness.pipeline import HarnessPipeline, HarnessTrajectory
from skyrl_agent.integrations.skyrl_train import AgentGenerator, AgentGeneratorConfig, _Row
from skyrl_agent.integrations.tokens import ChatTemplate, TokenRow, treat
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.sandbox.base import SandboxBackend
from skyrl_agent.tasks.format import SWETask

if TYPE_CHECKING:
    import torch

    from skyrl_train.gateway import Gateway, Sample
    from skyrl_train.generators.base import GeneratorInput, GeneratorOutput
    from skyrl_train.inference.base import GenerationOutput, InferenceEngine
    from skyrl_train.inference.base import SamplingParams as EngineParams

__all__ = ["GatewaySessions", "HarnessGenerator", "OracleEngine", "sample_row"]


class GatewaySessions:
    """skyrl-agent's :class:`~skyrl_agent.harness.base.SessionServer` over a running skyrl-train ``Gateway``."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.model = gateway.config.model_name

    def open_session(self, session_id: str) -> SessionTicket:
        """A gateway session: its base URL ``<gateway>/s/<id>/v1`` and its API key."""
        handle = self.gateway.open_session(session_id)
        return SessionTicket(handle.session_id, handle.base_url, handle.api_key)

    def close_session(self, session_id: str) -> list[Sample]:
        """Close the session; its recorded samples."""
        return self.gateway.close_session(session_id)


def sample_row(sample: Sample) -> TokenRow:
    """A recorded sample as a token row (rewards 0 until :func:`~skyrl_agent.integrations.tokens.treat`)."""
    return TokenRow(
        list(sample.prompt_ids),
        list(sample.response_ids),
        list(sample.loss_mask),
        list(sample.logprobs),
        [0.0] * len(sample.response_ids),
        turns=len(sample.turns),
    )


class HarnessGenerator(AgentGenerator):
    """skyrl-train's ``Generator`` over harness episodes (see the module docstring).

    Args:
        backend: Where sandboxes come from; the caller owns it.
        chat: The chat template as token ids, for the prompt-only rows of episodes that made no model call.
        engine: The policy's inference engine; the gateway serves it (the trainer pauses it for weight syncs).
        tokenizer: The policy's tokenizer (its chat template renders the harness's requests).
        harness: The agent program run for each episode.
        config: Turn and context limits, the dispatcher's settings (``max_input_length`` caps the gateway's context).
        model_name: The model name the gateway serves (what harnesses send).
    """

    def __init__(
        self,
        backend: SandboxBackend,
        chat: ChatTemplate,
        *,
        engine: InferenceEngine,
        tokenizer: Any,
        harness: Harness,
        config: AgentGeneratorConfig | None = None,
        model_name: str = "policy",
        command_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(backend, chat, engine=engine, config=config)
        self.tokenizer, self.harness, self.model_name = tokenizer, harness, model_name
        self.command_timeout_s = command_timeout_s
        self.gateway: Gateway | None = None

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        """Run one harness episode per row of ``batch``; one output row per input row, in order."""
        sessions = GatewaySessions(await self._gateway(batch))
        episodes = self._episodes(batch)
        pipeline = self._harness_pipeline(batch, sessions)
        dispatcher = pipeline.dispatcher(null_policy(), self.config.dispatcher, clock=self.clock)
        dispatched = await dispatcher.run(episodes)
        rows = [self._harness_row(result, pipeline) for result in dispatched.results]
        output = self._output(batch, dispatched.results, rows)
        output.policy_versions = _versions(dispatched.results, rows)
        output.metrics = _metrics(rows, dispatched.results, dispatched.metrics)
        return output

    async def close(self) -> None:
        """Stop the gateway (the engine and the backend belong to the caller)."""
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            await gateway.stop()

    async def _gateway(self, batch: GeneratorInput) -> Gateway:
        """The gateway, started on the running loop at the first batch (the engine is used from that loop).

        A request that sets no ``max_tokens`` (most harnesses) gets the run's ``generator.max_generate_length``.
        """
        if self.gateway is None:
            from skyrl_train.gateway import Gateway, GatewayConfig

            engine = self._inner_engine
            assert engine is not None  # an engine is required by __init__
            config = GatewayConfig(
                model_name=self.model_name,
                max_model_len=self.config.max_input_length,
                default_max_tokens=batch.sampling_params.max_tokens,
            )
            self.gateway = Gateway(engine, self.tokenizer, config)
            await self.gateway.start()
        return self.gateway

    def _harness_pipeline(self, batch: GeneratorInput, sessions: GatewaySessions) -> HarnessPipeline:
        base = self._pipeline(batch)
        return HarnessPipeline(
            self.backend,
            base.agent,
            labels=base.labels,
            env_options=base.env_options,
            spans=self.timeline,
            harness=self.harness,
            server=sessions,
            command_timeout_s=self.command_timeout_s,
        )

    def _harness_row(self, result: EpisodeResult, pipeline: HarnessPipeline) -> _Row:
        sample = _trained_sample(result)
        if sample is None:  # no model call was answered: a prompt-only row (collating needs a prompt)
            tokens = TokenRow(self.chat.prompt_ids(pipeline.instructions(result.episode.data["task"])))
        else:
            tokens = sample_row(sample)
        return _Row(tokens, treat(tokens, result), result.treatment.value, result.error)


def _trained_sample(result: EpisodeResult) -> Sample | None:
    """The sample an episode's row holds: the session's last one with replies (None when it has none)."""
    trajectory = result.trajectory
    samples = list(trajectory.samples) if isinstance(trajectory, HarnessTrajectory) else []
    with_replies = [sample for sample in samples if sample.turns]
    return with_replies[-1] if with_replies else None


def _versions(results: Sequence[EpisodeResult], rows: Sequence[_Row]) -> list[list[int]] | None:
    """Per row and response token, the policy version that sampled it (-1 on context), as the engine reported it.

    None when the engine reported no versions at all (then the trainer tracks staleness per group only).
    """
    samples = [_trained_sample(result) for result in results]
    per_row = [None if sample is None else sample.policy_versions for sample in samples]
    if all(versions is None for versions in per_row):
        return None
    return [
        versions if versions is not None else [-1] * len(row.tokens.response_ids)
        for versions, row in zip(per_row, rows, strict=True)
    ]


def _metrics(rows: Sequence[_Row], results: Sequence[EpisodeResult], dispatch: Mapping[str, float]) -> dict[str, float]:
    from skyrl_agent.integrations.skyrl_train import _batch_metrics

    metrics = _batch_metrics(rows, dispatch)
    trajectories = [r.trajectory for r in results if isinstance(r.trajectory, HarnessTrajectory)]
    if trajectories:
        metrics["harness/samples_per_episode/mean"] = statistics.fmean(len(t.samples) for t in trajectories)
        metrics["harness/commands/mean"] = statistics.fmean(t.commands for t in trajectories)
        metrics["harness/submitted/fraction"] = statistics.fmean(float(t.result.submitted) for t in trajectories)
    return metrics


class OracleEngine:
    """A scripted ``InferenceEngine`` that plays each task's gold fix in mini-swe-agent's action format.

    It reads the decoded prompt: the task is the one whose problem statement the prompt holds; the reply is the
    oracle's first (apply the gold patch) until the prompt holds that reply, then its second (submit). Replies are
    the tokenizer's ids of the text and the end-of-turn token, log-probability ``-0.1`` each, so the gateway
    records them like any engine's. An unknown task gets a reply with no action.
    """

    def __init__(self, tokenizer: Any, tasks: Iterable[SWETask]) -> None:
        from skyrl_agent.harness.mini_swe_agent import APPLY_THOUGHT, oracle_replies

        self.tokenizer = tokenizer
        self.apply_marker = APPLY_THOUGHT
        # Longest statements first: a statement that contains another must win.
        ordered = sorted(tasks, key=lambda task: len(task.problem_statement), reverse=True)
        self.replies = [(task.problem_statement, oracle_replies(task.gold_patch)) for task in ordered]
        self.calls = 0

    def reply(self, prompt_text: str) -> str:
        """The scripted reply to a prompt."""
        for statement, (apply, submit) in self.replies:
            if statement and statement in prompt_text:
                return submit if self.apply_marker in prompt_text else apply
        return "THOUGHT: I do not know this task."

    async def generate(self, prompts: Sequence[Sequence[int]], params: EngineParams) -> list[GenerationOutput]:
        """One scripted reply per prompt (cut at ``max_tokens``, then stop reason ``length``)."""
        from skyrl_train.inference.base import GenerationOutput

        outputs = []
        for prompt in prompts:
            self.calls += 1
            text = self.reply(self.tokenizer.decode(list(prompt)))
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
            reason = "stop"
            if len(ids) > params.max_tokens:
                ids, reason = ids[: params.max_tokens], "length"
            outputs.append(GenerationOutput(ids, [-0.1] * len(ids), cast("Any", reason)))
        return outputs

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Nothing to load: the oracle has no weights."""

    async def pause(self) -> None:
        """Nothing runs between calls."""

    async def resume(self) -> None:
        """Nothing runs between calls."""

    async def close(self) -> None:
        """Nothing to release."""
