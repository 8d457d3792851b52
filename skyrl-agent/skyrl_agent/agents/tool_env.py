"""A text env whose tools run in a :class:`~skyrl_agent.sandbox.base.Sandbox`: bash, the file editor, submit.

It parses replies with :func:`~skyrl_agent.action_format.parse_action` and is async-native (``ainit``/``astep``,
which :mod:`skyrl_gym.async_env` awaits). It borrows the sandbox: the caller owns and releases it. ``submit``
ends the episode with the repository diff as ``metadata["submission"]``.

An action that destroys the sandbox (the sandbox reports
:class:`~skyrl_agent.sandbox.shell.CommandBrokeSandboxError` while running it: the sandbox ended from the inside,
or the action wrote into the runner's channel) ends the episode too: reward 0, ``metadata["finish_reason"]``
``"agent_broke_sandbox"``. It is the agent's failure, trained on, not the infrastructure's; every other
:class:`~skyrl_agent.sandbox.base.SandboxError` propagates as one. An editor call that the file system refuses
(a directory, a file over the size limit, no permission) is an error message the agent sees.
"""

from __future__ import annotations

from typing import Any

from skyrl_agent.action_format import BashAction, EditorAction, FormatError, SubmitAction, parse_action
from skyrl_agent.dispatch.outcomes import Outcome
from skyrl_agent.sandbox.base import Sandbox
from skyrl_agent.sandbox.shell import CommandBrokeSandboxError
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

__all__ = ["SANDBOX_BROKEN", "SandboxToolEnv"]

SANDBOX_BROKEN = Outcome.AGENT_BROKE_SANDBOX.value  # the finish reason of an episode whose action broke the sandbox


class SandboxToolEnv(BaseTextEnv):
    """Tools over a sandbox.

    Args:
        sandbox: Where commands run and files live (borrowed, not closed).
        workdir: The repository; ``submit`` diffs it.
        command_timeout_s: Per-command timeout, enforced inside the sandbox.
        max_output_chars: Observations are cut to this many characters.
        max_turns: Steps at most (the agent usually stops first).
        base_commit: The commit ``submit`` diffs against (default: the repository's ``HEAD`` at the first diff).
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        workdir: str = "/workspace",
        command_timeout_s: float = 60.0,
        max_output_chars: int = 10_000,
        max_turns: int = 100,
        base_commit: str | None = None,
    ) -> None:
        super().__init__()
        self.sandbox, self.workdir = sandbox, workdir
        self.command_timeout_s, self.max_output_chars, self.max_turns = command_timeout_s, max_output_chars, max_turns
        self.base_commit = base_commit
        self._history: dict[str, list[bytes]] = {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Not available: use ``skyrl_gym.async_env.astep`` (the sandbox is async)."""
        raise TypeError("SandboxToolEnv is async; drive it with skyrl_gym.async_env.ainit/astep")

    async def ainit(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the episode: the prompt unchanged."""
        return prompt, {}

    async def astep(self, action: str) -> BaseTextEnvStepOutput:
        """Run the reply's action; malformed replies get the parser's message back."""
        self.turns += 1
        try:
            parsed = parse_action(action)
        except FormatError as exc:
            return self._out(str(exc))
        if isinstance(parsed, SubmitAction):
            patch = await self.diff()
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata={"submission": patch})
        try:
            if isinstance(parsed, BashAction):
                return self._out(await self._bash(parsed.command))
            return self._out(await self._edit(parsed))
        except CommandBrokeSandboxError as exc:
            return self._broken(exc)

    async def diff(self) -> str:
        """The repository's changes against the base commit, new files included, whole (see :mod:`.workspace`).

        Git runs with the grader's own environment and configuration, not the agent's shell state. A repository
        the agent broke so badly that no diff can be taken submits nothing (an empty diff).
        """
        from skyrl_agent.tasks.workspace import WorkspaceError, submission_diff

        try:
            return await submission_diff(self.sandbox, self.workdir, self.base_commit)
        except (WorkspaceError, OSError):
            return ""

    @staticmethod
    def _broken(error: CommandBrokeSandboxError) -> BaseTextEnvStepOutput:
        """The episode's end when the action destroyed the sandbox: reward 0, the agent told why."""
        text = f"The sandbox is gone: your action destroyed it ({error}). The episode is over."
        metadata = {"finish_reason": SANDBOX_BROKEN, "error": str(error)}
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": text}], reward=0.0, done=True, metadata=metadata
        )

    def _out(self, text: str) -> BaseTextEnvStepOutput:
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n[output cut at {self.max_output_chars} characters]"
        done = self.turns >= self.max_turns
        return BaseTextEnvStepOutput(
            observations=[{"role": "user", "content": text}], reward=0.0, done=done, metadata={}
        )

    async def _bash(self, command: str) -> str:
        result = await self.sandbox.run(command, timeout_s=self.command_timeout_s, workdir=self.workdir)
        note = " (timed out)" if result.timed_out else ""
        return f"exit code {result.exit_code}{note}\n{result.output}"

    async def _edit(self, call: EditorAction) -> str:
        handler = getattr(self, f"_edit_{call.command}")
        try:
            message: str = await handler(call)
        except FileNotFoundError:
            return f"Error: {call.path} does not exist."
        except OSError as exc:  # a directory, a file over the size limit, no permission, …
            return f"Error: {call.path}: {exc.strerror or exc}."
        return message

    async def _read(self, path: str) -> str:
        return (await self.sandbox.read_file(path)).decode(errors="replace")

    async def _write(self, path: str, text: str) -> None:
        try:
            self._history.setdefault(path, []).append(await self.sandbox.read_file(path))
        except FileNotFoundError:
            self._history.setdefault(path, []).append(b"")
        await self.sandbox.write_file(path, text)

    async def _edit_view(self, call: EditorAction) -> str:
        lines = (await self._read(call.path)).splitlines()
        start, end = call.view_range or (1, len(lines))
        end = len(lines) if end == -1 else end
        return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines[start - 1 : end], start=start))

    async def _edit_create(self, call: EditorAction) -> str:
        if call.file_text is None:
            return "Error: create needs file_text."
        await self._write(call.path, call.file_text)
        return f"Created {call.path}."

    async def _edit_str_replace(self, call: EditorAction) -> str:
        text = await self._read(call.path)
        count = text.count(call.old_str or "") if call.old_str else 0
        if count != 1:
            return f"Error: old_str must occur exactly once in {call.path}; it occurs {count} times."
        assert call.old_str is not None  # count == 1 implies it
        await self._write(call.path, text.replace(call.old_str, call.new_str or "", 1))
        return f"Edited {call.path}."

    async def _edit_insert(self, call: EditorAction) -> str:
        if call.insert_line is None or call.new_str is None:
            return "Error: insert needs insert_line and new_str."
        lines = (await self._read(call.path)).splitlines(keepends=True)
        if not 0 <= call.insert_line <= len(lines):
            return f"Error: insert_line must be between 0 and {len(lines)}."
        new = call.new_str if call.new_str.endswith("\n") else call.new_str + "\n"
        lines.insert(call.insert_line, new)
        await self._write(call.path, "".join(lines))
        return f"Inserted into {call.path} after line {call.insert_line}."

    async def _edit_undo_edit(self, call: EditorAction) -> str:
        history = self._history.get(call.path)
        if not history:
            return f"Error: no edit of {call.path} to undo."
        await self.sandbox.write_file(call.path, history.pop())
        return f"Undid the last edit of {call.path}."
