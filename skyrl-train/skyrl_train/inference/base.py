"""The inference-engine protocol: generate from token ids, update weights, pause and resume.

Token in, token out: prompts are token ids and outputs are the token ids the engine sampled, with their
log-probabilities, so the ids trained on are exactly the ids generated (no re-tokenisation drift).

Log-probabilities are those of the distribution the token was sampled from, ``log_softmax(logits / temperature)``
(vLLM's ``processed_logprobs``). With top-k/top-p disabled that is exactly what the trainer recomputes, so the
mean ``|rollout − trainer|`` log-probability gap of an on-policy step is small.

An engine may also report how busy it is (:class:`LoadReporting`: ``load() -> EngineLoad``), for callers that admit
work by the engine's load. It is optional, found by duck typing; the protocol itself does not ask for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

StopReason = Literal["stop", "length", "abort"]
"""Why generation ended: ``stop`` (an EOS/stop token or stop string), ``length`` (``max_tokens``), ``abort``."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. Field names follow vLLM's where they overlap."""

    max_tokens: int = 1024  # new tokens at most
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 disables top-k
    min_p: float = 0.0
    stop: tuple[str, ...] = ()  # stop strings; the stop string is kept in the output
    stop_token_ids: tuple[int, ...] = ()  # extra stop tokens besides the tokenizer's EOS
    logprobs: bool = True  # return the sampled tokens' log-probabilities
    seed: int | None = None  # per-request seed for reproducible sampling


@dataclass
class GenerationOutput:
    """One completion: the sampled ids (the stop token included when it was sampled)."""

    token_ids: list[int]
    logprobs: list[float] | None  # one per token in ``token_ids`` when requested
    stop_reason: StopReason
    text: str | None = None  # the decoded text, when the engine decodes
    metadata: dict[str, object] = field(default_factory=dict)
    policy_version: int | None = None  # the policy version that generated it, when the engine tracks versions
    # Per token, when the engine can change weights between tokens of one completion (LocalEngine, pause_at="token").
    token_policy_versions: list[int] | None = None


@dataclass(frozen=True)
class EngineLoad:
    """How busy an engine is at the moment it reports (its latest scheduling step)."""

    running: int  # requests being generated; every unfinished one when ``waiting`` is None
    waiting: int | None  # accepted requests not yet in the running batch; None: the engine cannot tell them apart
    kv_cache_usage: float | None = None  # fraction (0..1) of the KV cache in use; None: not known


@runtime_checkable
class LoadReporting(Protocol):
    """An engine that reports its load. Optional: callers test for it (``isinstance``) and do without."""

    def load(self) -> EngineLoad:
        """The engine's load now; returns at once (no I/O, no waiting on the engine's thread)."""
        ...


def load_of(engine: object) -> EngineLoad | None:
    """``engine.load()`` when the engine reports its load (:class:`LoadReporting`), else None.

    What a wrapping engine reports for the engine it wraps, so admission control sees through ``VersionedEngine`` and
    the generator's pause link.
    """
    return engine.load() if isinstance(engine, LoadReporting) else None


def combined_load(loads: Iterable[EngineLoad | None]) -> EngineLoad | None:
    """The load of several engines serving as one; engines that report none (None) are left out.

    Running and waiting requests add up (``waiting`` over the engines that tell it; None when none does). KV-cache
    use is the fullest engine's, not the mean: a trajectory's later turns go to the engine holding its earlier ones,
    so one full engine preempts or queues its requests however empty the others are (at 1.0 and 0.2 the mean, 0.6,
    would hide it). None when no engine reports.
    """
    known = [load for load in loads if load is not None]
    if not known:
        return None
    waiting = [load.waiting for load in known if load.waiting is not None]
    kv = [load.kv_cache_usage for load in known if load.kv_cache_usage is not None]
    return EngineLoad(sum(load.running for load in known), sum(waiting) if waiting else None, max(kv, default=None))


@runtime_checkable
class InferenceEngine(Protocol):
    """An engine serving one policy. All methods are coroutines; engines must be safe to call concurrently.

    ``generate`` may be called from many trajectories at once; engines batch concurrent requests themselves.
    ``update_weights`` receives ``(name, tensor)`` pairs in the Hugging Face parameter naming of the policy
    and returns once the engine generates with them. While paused, ``generate`` calls wait; in-flight ones
    finish first.
    """

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Sample one completion per prompt (token ids), in order."""
        ...

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights; later ``generate`` calls use them."""
        ...

    async def pause(self) -> None:
        """Hold new generation until ``resume`` (e.g. during a weight sync)."""
        ...

    async def resume(self) -> None:
        """Let generation continue after ``pause``."""
        ...

    async def close(self) -> None:
        """Release the engine's processes and memory; idempotent."""
        ...


@runtime_checkable
class SleepingEngine(Protocol):
    """An engine that can hand its accelerator memory to a colocated trainer between generations.

    ``sleep`` releases what generation holds (weights and KV cache on a GPU) and ``wake_up`` takes it back; on a CPU
    both may do nothing. ``generate`` must not be called in between.
    """

    async def sleep(self) -> None:
        """Release the engine's accelerator memory until :meth:`wake_up`."""
        ...

    async def wake_up(self) -> None:
        """Take the memory back; generation and weight loads work again."""
        ...
