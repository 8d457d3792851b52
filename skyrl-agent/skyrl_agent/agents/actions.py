"""The action format a ReAct model writes, as the agents read it: defined in :mod:`skyrl_agent.action_format`.

The format sits below both the agents that parse it and the scripted models (:mod:`skyrl_agent.llm.scripted`)
that write it; this module keeps its names importable from the agents package.
"""

from skyrl_agent.action_format import (
    EDITOR_COMMANDS,
    SUBMIT,
    Action,
    BashAction,
    EditorAction,
    FormatError,
    SubmitAction,
    bash_block,
    editor_block,
    parse_action,
)

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
