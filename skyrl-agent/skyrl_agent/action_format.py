"""The action format a ReAct model writes, its parser and its writer (see docs/agent/tools.md).

The agents parse it (:mod:`skyrl_agent.agents`, which re-exports it as ``skyrl_agent.agents.actions``) and the
scripted models write it (:mod:`skyrl_agent.llm.scripted`); it imports nothing from the package, so both can.

A reply holds free-form reasoning and exactly one action block:

- a shell command: a fenced ``bash`` block; a block whose whole content is ``submit`` ends the episode;
- a file edit: a fenced ``json`` block ``{"tool": "str_replace_editor", "command": ..., "path": ..., ...}``
  with ``command`` one of ``view``, ``create``, ``str_replace``, ``insert``, ``undo_edit``.

Zero blocks or several blocks raise :class:`FormatError`, whose message is shown to the model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EDITOR_COMMANDS",
    "SUBMIT",
    "Action",
    "BashAction",
    "EditorAction",
    "FormatError",
    "SubmitAction",
    "bash_block",
    "editor_block",
    "parse_action",
]

SUBMIT = "submit"
EDITOR_COMMANDS = frozenset({"view", "create", "str_replace", "insert", "undo_edit"})
_BLOCK = re.compile(r"```(bash|json)[ \t]*\n(.*?)\n?```", re.DOTALL)


class FormatError(ValueError):
    """The reply holds no valid action; the message tells the model how to fix it."""


@dataclass(frozen=True)
class BashAction:
    """Run ``command`` with ``bash -lc`` in the working directory."""

    command: str


@dataclass(frozen=True)
class EditorAction:
    """A ``str_replace_editor`` call (argument shapes as in SWE-agent/OpenHands)."""

    command: str
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    view_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class SubmitAction:
    """End the episode and submit the work (the repository diff)."""


Action = BashAction | EditorAction | SubmitAction

_HELP = (
    "Reply with your reasoning and then exactly one action: a ```bash block with one command, "
    'a ```json block {"tool": "str_replace_editor", "command": "view|create|str_replace|insert|undo_edit", '
    '"path": "..."}, or ```bash\nsubmit\n``` when you are done.'
)


def parse_action(text: str) -> Action:
    """The one action in a model reply.

    Raises:
        FormatError: No action block, several, or a malformed editor call.
    """
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1:
        raise FormatError(f"Found {len(blocks)} action blocks; expected exactly one. {_HELP}")
    lang, body = blocks[0]
    if lang == "bash":
        command = body.strip()
        if not command:
            raise FormatError(f"The bash block is empty. {_HELP}")
        return SubmitAction() if command == SUBMIT else BashAction(command)
    return _parse_editor(body)


def _parse_editor(body: str) -> EditorAction:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        raise FormatError(f"The json block is not valid JSON ({exc}). {_HELP}") from None
    if not isinstance(call, dict) or call.get("tool") != "str_replace_editor":
        raise FormatError(f'The json block must be an object with "tool": "str_replace_editor". {_HELP}')
    command, path = call.get("command"), call.get("path")
    if command not in EDITOR_COMMANDS or not isinstance(path, str) or not path:
        raise FormatError(f"The editor call needs a command in {sorted(EDITOR_COMMANDS)} and a path. {_HELP}")
    view_range = call.get("view_range")
    try:
        return EditorAction(
            command=command,
            path=path,
            file_text=_opt_str(call, "file_text"),
            old_str=_opt_str(call, "old_str"),
            new_str=_opt_str(call, "new_str"),
            insert_line=None if call.get("insert_line") is None else int(call["insert_line"]),
            view_range=None if view_range is None else (int(view_range[0]), int(view_range[1])),
        )
    except (TypeError, ValueError, IndexError) as exc:
        raise FormatError(f"Bad editor arguments ({exc}). {_HELP}") from None


def _opt_str(call: dict[str, Any], key: str) -> str | None:
    value = call.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{key} must be a string")
    return value


def bash_block(command: str) -> str:
    """A reply that runs ``command``."""
    return f"```bash\n{command}\n```"


def editor_block(command: str, path: str, **args: Any) -> str:
    """A reply that makes one editor call."""
    call = {"tool": "str_replace_editor", "command": command, "path": path, **args}
    return f"```json\n{json.dumps(call)}\n```"
