"""Harnesses behind skyrl-train's gateway: a ``Generator`` over harness episodes, and a scripted oracle engine.

::

    HarnessGenerator.generate(GeneratorInput)
        for each row, through the dispatcher: a sandbox for the row's task, a gateway session, the harness in its
        own thread with that session as its model server, the workspace diff graded by the hidden tests
        ─► per input row, the session's recorded samples as token rows (prompt ids, the engine's sampled ids and
            log-probs, loss mask 1 on exactly those), the reward on the last sampled token of the last one

The gateway (``skyrl_train.gateway``) renders each request with the policy's chat template and records what the
engine sampled; the harness only ever sees an OpenAI-compatible URL. A harness that only ever appends to its
conversation records one sample: one row. One that rewrote its context (summarised, truncated) records a sample
per rewrite: its episode becomes that many step-wise rows (``GeneratorOutput.is_last_step``), all trained with the
episode's advantage; ``harness/samples_per_episode`` says how often that happened. skyrl-train is imported inside
the calls that need it, so this module imports without torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from skyrl_agent.dispatch import EpisodeResult
from skyrl_agent.harness.base import Harness, SessionTicket
from skyrl_agent.harness.episodes import HarnessPipeline, HarnessTrajectory
from skyrl_agent.integrations.skyrl_train import AgentGenerator, AgentGeneratorConfig, _Row
from skyrl_agent.integrations.tokens import ChatTemplate, TokenRow, treat_steps
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
        """Run one harness episode per row of ``batch``; its rows in input order (step-wise when a session split)."""
        sessions = GatewaySessions(await self._gateway(batch))
        episodes = self._episodes(batch)
        pipeline = self._harness_pipeline(batch, sessions)
        dispatcher = pipeline.dispatcher(
            null_policy(), self.config.dispatcher, clock=self.clock, admission=self.admission
        )
        dispatched = await dispatcher.run(episodes)
        steps = [self._harness_rows(result, pipeline) for result in dispatched.results]
        results = [result for result, rows in zip(dispatched.results, steps, strict=True) for _ in rows]
        rows = [row for episode in steps for row, _ in episode]
        output = self._output(batch, results, rows)
        output.trajectory_ids = [result.episode.id for result in results]
        output.is_last_step = [k == len(episode) - 1 for episode in steps for k in range(len(episode))]
        output.policy_versions = _versions([sample for episode in steps for _, sample in episode], rows)
        output.metrics = {
            **_metrics(rows, output.is_last_step, dispatched.results, dispatched.metrics),
            **pipeline.group_setup_metrics(),
        }
        return output

    async def close(self) -> None:
        """Stop the gateway (the engine and the backend belong to the caller)."""
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            await gateway.stop()

    async def _gateway(self, batch: GeneratorInput) -> Gateway:
        """The gateway, started on the running loop at the first batch (the engine is used from that loop).

        A request that sets no ``max_tokens`` (most harnesses) gets the run's ``generator.max_generate_length``. It
        listens on the host's loopback only: a harness inside its sandbox reaches its session through the sandbox's
        model socket (:mod:`skyrl_agent.harness.routing`).
        """
        if self.gateway is None:
            from skyrl_train.gateway import Gateway, GatewayConfig

            engine = self._inner_engine
            assert engine is not None  # an engine is required by __init__
            config = GatewayConfig(
                host="127.0.0.1",
                model_name=self.model_name,
                max_model_len=self.config.max_input_length,
                default_max_tokens=batch.sampling_params.max_tokens,
            )
            self.gateway = Gateway(engine, self.tokenizer, config, spans=self.timeline)  # engine calls on the timeline
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
            group_fork=base.group_fork,
            group_sizes=base.group_sizes,
            harness=self.harness,
            server=sessions,
            command_timeout_s=self.command_timeout_s,
        )

    def _harness_rows(self, result: EpisodeResult, pipeline: HarnessPipeline) -> list[tuple[_Row, Sample | None]]:
        """The episode's rows, one per recorded sample with replies, with the policy applied, and their samples.

        An episode with no answered model call gets one prompt-only row (collating needs a prompt).
        """
        samples = _trained_samples(result)
        if samples:
            tokens = [sample_row(sample) for sample in samples]
        else:
            tokens = [TokenRow(self.chat.prompt_ids(pipeline.instructions(result.episode.data["task"])))]
        reason = treat_steps(tokens, result)
        rows = [_Row(row, reason, result.treatment.value, result.error) for row in tokens]
        recorded: list[Sample | None] = list(samples) if samples else [None]
        return list(zip(rows, recorded, strict=True))


def _trained_samples(result: EpisodeResult) -> list[Sample]:
    """The samples an episode's rows hold: the session's samples with replies, in order."""
    trajectory = result.trajectory
    samples = list(trajectory.samples) if isinstance(trajectory, HarnessTrajectory) else []
    return [sample for sample in samples if sample.turns]


def _versions(samples: Sequence[Sample | None], rows: Sequence[_Row]) -> list[list[int]] | None:
    """Per row and response token, the policy version that sampled it (-1 on context), as the engine reported it.

    None when the engine reported no versions at all (then the trainer tracks staleness per group only).
    """
    per_row = [None if sample is None else sample.policy_versions for sample in samples]
    if all(versions is None for versions in per_row):
        return None
    return [
        list(versions) if versions is not None else [-1] * len(row.tokens.response_ids)
        for versions, row in zip(per_row, rows, strict=True)
    ]


def _metrics(
    rows: Sequence[_Row], last: Sequence[bool], results: Sequence[EpisodeResult], dispatch: Mapping[str, float]
) -> dict[str, float]:
    """The generator's metrics per episode (its last row), plus the harness's and ``harness/rows``."""
    from skyrl_agent.integrations.skyrl_train import _batch_metrics

    metrics = _batch_metrics([row for row, is_last in zip(rows, last, strict=True) if is_last], dispatch)
    metrics["harness/rows"] = float(len(rows))
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
