"""The SWE path of ``async_bench.py``: the three ``trainer.async_mode`` values on agent episodes in sandboxes.

Each trajectory is a real SWE episode of skyrl-agent on a shipped task, run by its ``AgentGenerator`` through the
dispatcher: a sandbox of the process backend starts, the agent's tool calls run in it, the submission is graded
by the task's hidden tests in a fresh sandbox. The policy is skyrl-agent's latency oracle
(``skyrl-agent run --model scripted:latency-oracle``): sample 0 of each prompt replays the task's gold patch, the
others submit nothing (so groups have a reward spread), and every LLM call waits its modelled time on one shared
:class:`~skyrl_agent.llm.scripted.ModelledGPU` (``--swe-gpu-slots`` sequences at once). Each call is an ``engine``
span on the run's timeline, as an engine request would be; the generator adds its sandbox, env and reward spans.
The trainer and its modelled update and weight sync are part 1's (``_async_model.ModelledPolicy``,
``ModelledEngine``), with ``--swe-update-ms`` per trajectory.
"""

from __future__ import annotations

import asyncio
import zlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from _async_model import ModelledEngine, ModelledRun, mode_config, modelled_gpu, serving, summarise

from skyrl_agent.agents.swe_env import instructions
from skyrl_agent.dispatch import Backoff, DispatcherConfig, Episode
from skyrl_agent.integrations.skyrl_train import AgentGenerator, AgentGeneratorConfig
from skyrl_agent.llm.base import Completion, LLMClient, Prompt, SamplingParams
from skyrl_agent.llm.scripted import LatencyClient, ModelledGPU, null_policy
from skyrl_agent.run import make_llm
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import SWETask, load_suite
from skyrl_agent.testing import ByteChatTemplate
from skyrl_train.config import Config
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.timeline import Timeline

MAX_TURNS = 8  # agent turns at most (the oracle needs 2, the null policy 1)


@dataclass(frozen=True)
class SWEWorkload:
    """The SWE part's sizes and modelled times (milliseconds)."""

    prompts_per_step: int = 4  # tasks per step (prompt groups)
    samples: int = 2  # episodes per task: one oracle, the rest submit nothing
    gpu_slots: int = 8  # sequences the modelled GPU decodes at once
    call_ms: float = 150.0  # modelled GPU time per LLM call
    decode_ms: float = 2.0  # per generated token (the oracle's replies are a few hundred bytes)
    jitter: float = 0.3
    update_ms: float = 250.0  # modelled policy update per trained trajectory
    sync_ms: float = 30.0
    seed: int = 0

    @property
    def trajectories_per_step(self) -> int:
        return self.prompts_per_step * self.samples


SWE_TINY = SWEWorkload(prompts_per_step=2, samples=2, gpu_slots=4, call_ms=20.0, update_ms=20.0)


class _Spans(Protocol):
    def span(self, lane: str, name: str) -> AbstractContextManager[None]: ...


class SpannedClient:
    """An LLM client whose every call is a ``generate`` span on the ``engine`` lane (an engine request's span)."""

    def __init__(self, inner: LLMClient, spans: _Spans) -> None:
        self.inner, self.spans = inner, spans

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        with self.spans.span("engine", "generate"):
            return await self.inner.complete(prompt, params, timeout_s=timeout_s)


def latency_oracle(gpu: ModelledGPU, spans: _Spans) -> Any:
    """Sample 0 of each prompt: the gold patch; others: submit nothing; every call on ``gpu`` and a span."""
    oracle = make_llm("scripted:oracle")

    def client(episode: Episode) -> LLMClient:
        inner = oracle(episode) if episode.id.endswith(":0") else null_policy()
        # crc32, not hash(): the same episode gets the same modelled delays in every mode and process.
        return SpannedClient(LatencyClient(inner, gpu=gpu, seed=zlib.crc32(episode.id.encode())), spans)

    return client


def swe_config(mode: str, w: SWEWorkload) -> Config:
    overrides = [
        f"generator.max_turns={MAX_TURNS}",
        "generator.max_generate_length=1024",
        "generator.max_input_length=16384",
        "environment.env_class=swe",
    ]
    return mode_config(mode, w.prompts_per_step, w.samples, w.seed, overrides)


def swe_prompts(tasks: list[SWETask], count: int) -> list[PromptRecord]:
    """``count`` prompts cycling through ``tasks``, each a distinct uid (so groups stay apart)."""
    rows = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        rows.append(PromptRecord(instructions(task, MAX_TURNS + 1), "swe", {"task": task}, f"{task.id}#{i}"))
    return rows


class SWESession:
    """One mode's trainer over SWE episodes (see the module docstring), a :class:`ModelledRun`."""

    def __init__(self, mode: str, w: SWEWorkload, tasks: list[SWETask]) -> None:
        config = swe_config(mode, w)
        gpu = modelled_gpu(w.gpu_slots, w.call_ms, w.decode_ms, w.jitter, w.seed)
        timeline = Timeline()
        backoff = Backoff(base_s=0.05, max_s=0.2, max_attempts=2)
        agent = AgentGeneratorConfig(max_turns=MAX_TURNS, dispatcher=DispatcherConfig(backoff=backoff))
        self.backend = ProcessBackend()
        generator = AgentGenerator(self.backend, ByteChatTemplate(), llm=latency_oracle(gpu, timeline), config=agent)
        generator.timeline = timeline
        self.modelled = ModelledRun(
            config,
            gpu=gpu,
            engine=serving(ModelledEngine(gpu, [0], w.sync_ms / 1000), mode),  # it serves the weight syncs only
            generator=generator,
            update_s_per_row=w.update_ms / 1000,
            pad_token_id=0,
            prompts=swe_prompts(tasks, 4096),
            timeline=timeline,
        )

    async def run(self, steps: int) -> None:
        """Train ``steps`` steps, then close the sandbox backend."""
        await self.modelled.run(steps, self.backend.close)


def swe_part(w: SWEWorkload, warmup: int, timed: int, modes: tuple[str, ...]) -> dict[str, Any]:
    """Every mode on SWE episodes: ``warmup`` + ``timed`` + 1 steps each; the summaries of the timed steps."""
    tasks = load_suite()
    results = {}
    for mode in modes:
        print(f"swe {mode}: {warmup} + {timed} + 1 steps of {w.trajectories_per_step} episodes", flush=True)
        session = SWESession(mode, w, tasks)
        asyncio.run(session.run(warmup + timed + 1))
        summary = summarise(mode, w, session.modelled.records, warmup, timed)
        results[mode] = summary
        print(f"  {summary['trajectories_per_s']:.2f} episodes/s", flush=True)
    return results


__all__ = ["SWE_TINY", "SWESession", "SWEWorkload", "swe_part"]
