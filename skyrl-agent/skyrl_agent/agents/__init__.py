"""Agent loops that turn an LLM client and a text env into a trajectory."""

from skyrl_agent.action_format import BashAction, EditorAction, FormatError, SubmitAction, parse_action
from skyrl_agent.agents.react import AgentConfig, ReActAgent, Trajectory, Turn
from skyrl_agent.agents.swe_env import SWEEnv
from skyrl_agent.agents.tool_env import SandboxToolEnv

__all__ = [
    "AgentConfig",
    "BashAction",
    "EditorAction",
    "FormatError",
    "ReActAgent",
    "SWEEnv",
    "SandboxToolEnv",
    "SubmitAction",
    "Trajectory",
    "Turn",
    "parse_action",
]
