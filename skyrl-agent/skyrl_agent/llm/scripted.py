"""Scripted policies for tests and demos (``scripted``, ``null``, ``oracle``) and a modelled GPU (``latency``).

Scripted clients are stateless: the reply is chosen by how many assistant messages the prompt already holds,
so one client can serve many episodes at once. Tokens are fake but consistent: one token per UTF-8 byte,
logprob ``-0.1`` each.

:class:`LatencyClient` wraps any client and makes each call take time on a :class:`ModelledGPU`: one inference
server with a fixed number of batch slots. Give every episode's client the same ``ModelledGPU`` and concurrent
episodes queue for it like agents sharing a busy server; its :meth:`ModelledGPU.stats` say how busy it was.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from skyrl_agent.action_format import SUBMIT, bash_block, editor_block
from skyrl_agent.llm.base import Completion, LLMClient, Prompt, SamplingParams, Usage

__all__ = [
    "GPUStats",
    "LatencyClient",
    "ModelledGPU",
    "ScriptedClient",
    "null_policy",
    "oracle_policy",
    "oracle_replies",
]


def _prompt_tokens(prompt: Prompt) -> int:
    return sum(len(str(m["content"]).encode()) if isinstance(m, dict) else 1 for m in prompt)


def _turn(prompt: Prompt) -> int:
    return sum(1 for m in prompt if isinstance(m, dict) and m.get("role") == "assistant")


class ScriptedClient:
    """Replies ``replies[k]`` to a prompt with ``k`` assistant messages (the last reply repeats).

    Args:
        replies: The replies in order, or a function of the prompt.
    """

    def __init__(self, replies: Sequence[str] | Callable[[Prompt], str]) -> None:
        self.replies = replies
        self.calls = 0

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        """The scripted reply, cut to ``params.max_tokens`` bytes (then ``finish_reason="length"``)."""
        self.calls += 1
        if callable(self.replies):
            text = self.replies(prompt)
        else:
            text = self.replies[min(_turn(prompt), len(self.replies) - 1)]
        ids = list(text.encode())
        finish: Any = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
            text = bytes(ids).decode(errors="ignore")
        usage = Usage(_prompt_tokens(prompt), len(ids))
        return Completion(text, ids, [-0.1] * len(ids), finish, usage)


def null_policy() -> ScriptedClient:
    """Submits at once, without changing anything."""
    return ScriptedClient([bash_block(SUBMIT)])


def oracle_replies(gold_patch: str, workdir: str = "/workspace", patch_path: str = "/tmp/gold.patch") -> list[str]:
    """Replies that write the gold patch with the editor, apply it with ``git apply``, then submit."""
    return [
        "I will write the fix to a file.\n" + editor_block("create", patch_path, file_text=gold_patch),
        "Now apply it.\n" + bash_block(f"cd {workdir} && git apply {patch_path}"),
        "Done.\n" + bash_block(SUBMIT),
    ]


def oracle_policy(metadata: Mapping[str, Any], workdir: str = "/workspace") -> ScriptedClient:
    """The oracle for one task: its gold patch is ``metadata["gold_patch"]``.

    Raises:
        KeyError: The metadata has no gold patch.
    """
    if "gold_patch" not in metadata:
        raise KeyError("oracle_policy needs the task's gold patch as metadata['gold_patch']")
    return ScriptedClient(oracle_replies(str(metadata["gold_patch"]), workdir))


@dataclass
class GPUStats:
    """What a :class:`ModelledGPU` did, in seconds of its clock.

    Attributes:
        calls: Calls that finished generating.
        work_s: Modelled generation time of those calls, summed (sequence-seconds): the GPU's share of the work.
        slot_s: Time slots were held, summed over calls (``work_s`` plus sleep overshoot and cancelled calls).
        busy_s: Time at least one sequence was generating.
        wait_s: Time calls spent queued for a free slot, summed.
        peak_active: Most sequences generating at once.
    """

    calls: int = 0
    work_s: float = 0.0
    slot_s: float = 0.0
    busy_s: float = 0.0
    wait_s: float = 0.0
    peak_active: int = 0


class ModelledGPU:
    """One modelled inference server, shared by every :class:`LatencyClient` that holds it.

    It decodes up to ``capacity`` sequences at once (continuous batching): a call waits FIFO for a free slot,
    then holds it for ``(overhead_s + prefill_s_per_token * prompt + decode_s_per_token * completion) * noise``
    seconds, ``noise`` log-normal with sigma ``jitter``. A decode step is taken to cost the same whatever the
    batch size up to ``capacity`` (memory-bound decoding), so ``capacity`` is where throughput stops growing.

    Args:
        capacity: Sequences generated at once (batch slots).
        decode_s_per_token: Seconds per generated token of one sequence.
        prefill_s_per_token: Seconds per prompt token.
        overhead_s: Seconds per call (scheduling, detokenisation, HTTP).
        jitter: Sigma of the log-normal noise on each duration (0: exact).
        seed: Seeds the noise of callers that bring no generator of their own.
        sleep: Waits a modelled duration (tests pass a virtual clock's sleep).
        clock: Seconds, for the busy-time accounting (the same clock as ``sleep``).
    """

    def __init__(
        self,
        *,
        capacity: int = 8,
        decode_s_per_token: float = 0.001,
        prefill_s_per_token: float = 0.0,
        overhead_s: float = 0.01,
        jitter: float = 0.2,
        seed: int = 0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"a ModelledGPU needs capacity >= 1, got {capacity}")
        self.capacity = capacity
        self.decode_s_per_token, self.prefill_s_per_token = decode_s_per_token, prefill_s_per_token
        self.overhead_s, self.jitter = overhead_s, jitter
        self._rng = random.Random(seed)
        self._sleep, self._clock = sleep, clock
        self._slots: asyncio.Semaphore | None = None
        self.active = 0
        self._busy_since = 0.0
        self._stats = GPUStats()

    def duration_s(self, usage: Usage, rng: random.Random | None = None) -> float:
        """A modelled generation time for a call of this size; the noise comes from ``rng`` (default: the GPU's)."""
        mean = (
            self.overhead_s
            + self.prefill_s_per_token * usage.prompt_tokens
            + self.decode_s_per_token * usage.completion_tokens
        )
        return mean * (rng or self._rng).lognormvariate(0.0, self.jitter)

    async def generate(self, usage: Usage, rng: random.Random | None = None) -> float:
        """Queue for a slot, then hold it for the modelled duration of ``usage``; returns that duration."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.capacity)  # created in the running loop
        queued = self._clock()
        async with self._slots:
            started = self._enter(queued)
            try:
                duration = self.duration_s(usage, rng)
                await self._sleep(duration)
                self._stats.calls += 1
                self._stats.work_s += duration
                return duration
            finally:
                self._leave(started)

    def stats(self) -> GPUStats:
        """A copy of the totals so far; a busy period still running counts up to now."""
        ongoing = self._clock() - self._busy_since if self.active else 0.0
        return replace(self._stats, busy_s=self._stats.busy_s + ongoing)

    def utilisation(self, window_s: float) -> float:
        """Modelled work over what ``capacity`` slots could do in ``window_s`` seconds (1.0: never a free slot)."""
        return self.stats().work_s / (self.capacity * window_s) if window_s > 0 else 0.0

    def _enter(self, queued: float) -> float:
        now = self._clock()
        if self.active == 0:
            self._busy_since = now
        self.active += 1
        self._stats.wait_s += now - queued
        self._stats.peak_active = max(self._stats.peak_active, self.active)
        return now

    def _leave(self, started: float) -> None:
        now = self._clock()
        self.active -= 1
        self._stats.slot_s += now - started
        if self.active == 0:
            self._stats.busy_s += now - self._busy_since


class LatencyClient:
    """Wraps a client and makes each call take modelled time on a GPU: ``gpu`` when given (shared), else its own.

    Without ``gpu`` every client models a server of its own, so episodes never wait for one another (the
    arguments below configure that private server). Pass one :class:`ModelledGPU` to the client of every episode
    to make them compete for the same slots; the private-server arguments are then ignored. Either way the noise
    on each duration comes from this client's generator (seeded by ``seed``), so an episode's modelled durations
    do not depend on how its calls interleave with other episodes'.

    Args:
        inner: Produces the completions (e.g. a :class:`ScriptedClient`).
        gpu: The shared server, or None for a private one.
        slots: The private server's capacity.
        base_s: The private server's seconds per call.
        per_token_s: The private server's seconds per completion token.
        per_prompt_token_s: The private server's seconds per prompt token.
        jitter: The private server's noise sigma.
        seed: Seeds this client's noise.
        sleep: The private server's wait.
    """

    def __init__(
        self,
        inner: LLMClient,
        *,
        gpu: ModelledGPU | None = None,
        slots: int = 1,
        base_s: float = 0.01,
        per_token_s: float = 0.001,
        per_prompt_token_s: float = 0.0,
        jitter: float = 0.2,
        seed: int = 0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.inner = inner
        if gpu is None:
            gpu = ModelledGPU(
                capacity=slots,
                decode_s_per_token=per_token_s,
                prefill_s_per_token=per_prompt_token_s,
                overhead_s=base_s,
                jitter=jitter,
                sleep=sleep,
            )
        self.gpu = gpu
        self._rng = random.Random(seed)

    @property
    def active(self) -> int:
        """Sequences the GPU generates now (all clients', when it is shared)."""
        return self.gpu.active

    @property
    def peak_active(self) -> int:
        """Most sequences the GPU generated at once."""
        return self.gpu.stats().peak_active

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        """The inner client's completion, after the modelled wait."""
        completion = await self.inner.complete(prompt, params, timeout_s=timeout_s)
        await self.gpu.generate(completion.usage, self._rng)
        return completion

    def duration_s(self, usage: Usage) -> float:
        """A modelled duration for a call of this size (draws from this client's generator)."""
        return self.gpu.duration_s(usage, self._rng)
