"""A harness that is a command line: the agent program runs inside the episode's sandbox, as a process.

The command starts in the task's working directory with the OpenAI variables of its endpoint
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``), the task as ``SKYRL_TASK`` (the problem statement)
and the step limit as ``SKYRL_MAX_TURNS``; whatever it changes in the repository is the submission. It ends the
episode by exiting: exit status 0 is a submission; any other status is graded all the same (a harness's opinion of
its work does not decide the reward) and reported as its exit status. Running past ``timeout_s`` ends it
truncated (``TimeExceeded``, not graded), like mini-swe-agent's own time limit. Only the episode deadline bounds
it, not the per-command one: the command is the whole harness.

The sandbox must reach the endpoint: the process backend runs on the host and does; a Docker sandbox has no network
and reaches its session through a socket mounted into it (:mod:`skyrl_agent.harness.routing`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from skyrl_agent.harness.base import HarnessJob, HarnessResult

__all__ = ["CommandHarness"]


@dataclass(frozen=True)
class CommandHarness:
    """Run ``argv`` in the sandbox once per episode.

    Attributes:
        argv: The command and its arguments (not a shell string: each is quoted).
        timeout_s: What the whole program may take inside the sandbox (the episode deadline also applies).
        env: More environment variables for it.
        name: The harness's name in results and messages.
    """

    runs_in_sandbox: ClassVar[bool] = True  # its process is in the sandbox: it needs a route to the host

    argv: Sequence[str]
    timeout_s: float = 3600.0
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = "command"

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("CommandHarness needs a command (argv is empty)")

    def __call__(self, job: HarnessJob) -> HarnessResult:
        """Run the program to its exit; its output is kept as the conversation's only message."""
        variables = {
            **job.endpoint.environment(),
            "SKYRL_TASK": job.problem_statement,
            "SKYRL_MAX_TURNS": str(job.max_turns),
            **self.env,
        }
        exports = "".join(f"export {key}={shlex.quote(value)}; " for key, value in variables.items())
        result = job.shell.run(exports + shlex.join(self.argv), timeout_s=self.timeout_s, whole=True)
        if result.timed_out:
            status = "TimeExceeded"
        else:
            status = "Submitted" if result.exit_code == 0 else f"exit {result.exit_code}"
        messages: list[Mapping[str, Any]] = [{"role": "tool", "content": result.output}]
        return HarnessResult(status, messages, submitted=status == "Submitted")
