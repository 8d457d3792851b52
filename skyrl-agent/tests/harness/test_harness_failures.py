"""How a harness's failures become outcomes, and how mini-swe-agent's environment reports a command's failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.dispatch import DispatcherConfig, Episode
from skyrl_agent.dispatch.outcomes import FailurePolicy, Outcome
from skyrl_agent.harness import Endpoint, HarnessJob, HarnessPipeline, HarnessResult
from skyrl_agent.llm.base import LLMError
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.sandbox.base import CommandResult, SandboxError
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.sandbox.shell import CommandBrokeSandboxError
from skyrl_agent.tasks import load_suite


class Raising:
    """A harness that runs one command, then raises ``error``."""

    name = "raising"

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __call__(self, job: HarnessJob) -> HarnessResult:
        job.shell.run("true")
        raise self.error


def _outcome(harness: Any) -> Any:
    task = load_suite()[0]
    pipeline = HarnessPipeline(
        ProcessBackend(),
        AgentConfig(max_turns=3),
        harness=harness,
        endpoint=Endpoint("http://127.0.0.1:9/v1", "k", "m"),
    )
    config = DispatcherConfig(policy=FailurePolicy(max_episode_attempts=1))
    (result,) = asyncio.run(pipeline.dispatcher(null_policy(), config).run([Episode(task.id, {"task": task})])).results
    return result


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (LLMError("the server is gone"), Outcome.MODEL_ERROR),
        (CommandBrokeSandboxError("ended from the inside"), Outcome.AGENT_BROKE_SANDBOX),
        (SandboxError("the container died"), Outcome.SANDBOX_ERROR),
        (KeyError("a bug"), Outcome.AGENT_ERROR),
    ],
)
def test_what_a_harness_raises_decides_the_outcome(error: BaseException, outcome: Outcome) -> None:
    result = _outcome(Raising(error))
    assert result.outcome is outcome, result.error
    if outcome is Outcome.AGENT_ERROR:
        assert "harness raising raised KeyError" in str(result.error)


class FakeShell:
    """A shell whose ``run`` returns or raises what it is given."""

    workdir = "/workspace"

    def __init__(self, answer: CommandResult | BaseException) -> None:
        self.answer = answer

    def run(self, command: str, **_: Any) -> CommandResult:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def test_the_environment_reports_failures_as_mini_swe_agent_does() -> None:
    pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (skyrl-agent[mini-swe-agent])")
    from minisweagent.exceptions import Submitted

    from skyrl_agent.harness.mini_swe_agent import SUBMIT_MARKER, SandboxEnvironment

    def execute(answer: Any) -> dict[str, Any]:
        return SandboxEnvironment(FakeShell(answer), timeout=5).execute({"command": "x"})  # type: ignore[arg-type]

    assert execute(CommandResult("hi\n", 0)) == {"output": "hi\n", "returncode": 0, "exception_info": ""}
    timed_out = execute(CommandResult("partial", -1, timed_out=True))
    assert (timed_out["returncode"], timed_out["output"]) == (-1, "partial")
    assert "timed out after 5 seconds" in timed_out["exception_info"]
    failed = execute(RuntimeError("no such file"))
    assert failed["returncode"] == -1
    assert "no such file" in failed["exception_info"]
    with pytest.raises(SandboxError):  # the sandbox is gone: the agent must stop, not read an error message
        execute(SandboxError("gone"))
    with pytest.raises(Submitted) as submitted:
        execute(CommandResult(f"{SUBMIT_MARKER}\nthe patch\n", 0))
    assert submitted.value.messages[0]["extra"] == {"exit_status": "Submitted", "submission": "the patch\n"}
    assert execute(CommandResult(f"{SUBMIT_MARKER}\n", 1))["returncode"] == 1  # a failed submit command is not one
