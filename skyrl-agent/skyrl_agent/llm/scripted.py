"""Scripted policies for tests and demos: ``scripted``, ``null``, ``oracle`` and ``latency``.

Scripted clients are stateless: the reply is chosen by how many assistant messages the prompt already holds,
so one client can serve many episodes at once. Tokens are fake but consistent: one token per UTF-8 byte,
logprob ``-0.1`` each.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from skyrl_agent.agents.actions import SUBMIT, bash_block, editor_block
from skyrl_agent.llm.base import Completion, LLMClient, Prompt, SamplingParams, Usage

__all__ = ["LatencyClient", "ScriptedClient", "null_policy", "oracle_policy", "oracle_replies"]


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


class LatencyClient:
    """Wraps a client and waits like a busy GPU: ``slots`` calls run at once, the rest queue.

    Each call holds a slot for ``(base_s + per_prompt_token_s * prompt + per_token_s * completion) * noise``
    seconds, ``noise`` log-normal with sigma ``jitter``, drawn from a seeded generator.
    """

    def __init__(
        self,
        inner: LLMClient,
        *,
        slots: int = 1,
        base_s: float = 0.01,
        per_token_s: float = 0.001,
        per_prompt_token_s: float = 0.0,
        jitter: float = 0.2,
        seed: int = 0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.inner, self.slots = inner, slots
        self.base_s, self.per_token_s, self.per_prompt_token_s, self.jitter = (
            base_s,
            per_token_s,
            per_prompt_token_s,
            jitter,
        )
        self._rng = random.Random(seed)
        self._sleep = sleep
        self._gpu: asyncio.Semaphore | None = None
        self.active = 0
        self.peak_active = 0

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        """The inner client's completion, after the modelled wait."""
        if self._gpu is None:
            self._gpu = asyncio.Semaphore(self.slots)  # created in the running loop
        async with self._gpu:
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
            try:
                completion = await self.inner.complete(prompt, params, timeout_s=timeout_s)
                await self._sleep(self.duration_s(completion.usage))
                return completion
            finally:
                self.active -= 1

    def duration_s(self, usage: Usage) -> float:
        """A modelled duration for a call of this size."""
        mean = self.base_s + self.per_prompt_token_s * usage.prompt_tokens + self.per_token_s * usage.completion_tokens
        return mean * self._rng.lognormvariate(0.0, self.jitter)
