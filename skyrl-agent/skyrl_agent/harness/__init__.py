"""Unmodified agent programs (harnesses) as SWE episodes: their model calls go to an OpenAI-compatible endpoint.

:mod:`.base` says what a harness gets and returns; :mod:`.pipeline` runs one per episode through the dispatcher;
:mod:`.mini_swe_agent` is mini-swe-agent from PyPI (the ``mini-swe-agent`` extra); :mod:`.command` runs any
program as one. See ``docs/agent/harnesses.md``.
"""

from skyrl_agent.harness.base import (
    Endpoint,
    Harness,
    HarnessCancelled,
    HarnessJob,
    HarnessResult,
    SandboxShell,
    SessionServer,
    SessionTicket,
)
from skyrl_agent.harness.command import CommandHarness
from skyrl_agent.harness.episodes import HarnessError, HarnessPipeline, HarnessTrajectory

__all__ = [
    "CommandHarness",
    "Endpoint",
    "Harness",
    "HarnessCancelled",
    "HarnessError",
    "HarnessJob",
    "HarnessPipeline",
    "HarnessResult",
    "HarnessTrajectory",
    "SandboxShell",
    "SessionServer",
    "SessionTicket",
]
