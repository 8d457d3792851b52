"""Test doubles for CPU-only tests: a fake sandbox, a fake env, scripted LLMs and a byte-level chat template."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_agent.llm.scripted import LatencyClient, ScriptedClient, null_policy, oracle_policy
from skyrl_agent.sandbox.base import CommandResult, SandboxClosedError, Snapshot
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

__all__ = [
    "ByteChatTemplate",
    "CountingEnv",
    "FakeSandbox",
    "LatencyClient",
    "ScriptedClient",
    "null_policy",
    "oracle_policy",
]

_ids = itertools.count()


class FakeSandbox:
    """An in-memory sandbox: files in a dict; ``run`` answers from ``responses`` (command → output) or echoes.

    ``closed`` records :meth:`close`; using it afterwards raises ``SandboxClosedError`` like a real one.
    """

    def __init__(self, files: dict[str, bytes] | None = None, responses: dict[str, str] | None = None) -> None:
        self.id = f"fake-{next(_ids)}"
        self.files = dict(files or {})
        self.responses = dict(responses or {})
        self.commands: list[str] = []
        self.closed = False

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        """Record the command and answer it."""
        self._check()
        self.commands.append(command)
        return CommandResult(output=self.responses.get(command, f"ran: {command}"), exit_code=0)

    async def read_file(self, path: str) -> bytes:
        """The file's bytes."""
        self._check()
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        """Store the file."""
        self._check()
        self.files[path] = data.encode() if isinstance(data, str) else data

    async def snapshot(self) -> Snapshot:
        """A handle naming this sandbox."""
        return Snapshot(backend="fake", ref=self.id)

    async def close(self) -> None:
        """Mark closed; idempotent."""
        self.closed = True

    def _check(self) -> None:
        if self.closed:
            raise SandboxClosedError(f"{self.id} was used after close()")


class CountingEnv(BaseTextEnv):
    """A text env that answers ``observation k`` to each step and is done when a reply contains ``done_word``."""

    def __init__(self, done_word: str = "submit", reward: float = 1.0) -> None:
        super().__init__()
        self.done_word, self.reward = done_word, reward
        self.actions: list[str] = []

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """The prompt unchanged."""
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Count the step; done (with ``reward``) when the reply contains ``done_word``."""
        self.turns += 1
        self.actions.append(action)
        if self.done_word in action:
            return BaseTextEnvStepOutput(observations=[], reward=self.reward, done=True, metadata={"submission": ""})
        obs = [{"role": "user", "content": f"observation {self.turns}"}]
        return BaseTextEnvStepOutput(observations=obs, reward=0.0, done=False, metadata={})


class ByteChatTemplate:
    """A chat template whose tokens are UTF-8 bytes, like the scripted clients' (one token per byte).

    A message renders as ``role``, a newline, the content and the end-of-turn token ``0`` (never a byte of text);
    the generation prompt is ``assistant`` and a newline. It satisfies the
    :class:`~skyrl_agent.integrations.tokens.ChatTemplate` protocol, so token rows of scripted episodes can be
    built and checked without a tokenizer.
    """

    end_of_turn_token_id = 0

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The messages, then the generation prompt."""
        return self._render(messages) + list(b"assistant\n")

    def observation_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The same as :meth:`prompt_ids`: nothing precedes new messages in this template."""
        return self.prompt_ids(messages)

    def needs_end_of_turn(self, generated_ids: Sequence[int]) -> bool:
        """True unless the ids end with ``0``."""
        return not generated_ids or generated_ids[-1] != self.end_of_turn_token_id

    def decode(self, ids: Sequence[int]) -> str:
        """The bytes as text, end-of-turn tokens left out."""
        return bytes(i for i in ids if i != self.end_of_turn_token_id).decode(errors="replace")

    def _render(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return [b for m in messages for b in [*f"{m['role']}\n{m['content']}".encode(), self.end_of_turn_token_id]]
