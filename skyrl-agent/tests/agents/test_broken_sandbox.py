"""An agent whose own action destroys its sandbox fails its episode (reward 0, trained on, not retried);
a sandbox that dies without the agent's doing stays an infrastructure failure (masked, retried)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from skyrl_agent.agents.actions import SUBMIT, BashAction, bash_block, editor_block
from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.agents.tool_env import SandboxToolEnv
from skyrl_agent.dispatch import DispatcherConfig, Episode
from skyrl_agent.llm.base import Prompt
from skyrl_agent.llm.scripted import ScriptedClient
from skyrl_agent.pipeline import SWEPipeline
from skyrl_agent.sandbox import shell
from skyrl_agent.sandbox.base import CommandResult, SandboxError, SandboxSpec
from skyrl_agent.tasks import load_suite
from skyrl_agent.testing import FakeSandbox
from skyrl_gym.async_env import astep

KILL_ALL = "kill -9 -1"


class BreakableSandbox(FakeSandbox):
    """A fake sandbox that a command ends, as a real one ends when a command kills every process in it."""

    async def run(self, command: str, *, timeout_s: float = 60.0, workdir: str | None = None) -> CommandResult:
        if command == KILL_ALL:
            self.closed = True
            raise shell.CommandBrokeSandboxError("the sandbox ended while the command ran: exited with status 137")
        return await super().run(command, timeout_s=timeout_s, workdir=workdir)


class BreakableBackend:
    name = "breakable"

    def __init__(self) -> None:
        self.created: list[BreakableSandbox] = []

    async def create(self, spec: SandboxSpec) -> BreakableSandbox:
        sandbox = BreakableSandbox()
        self.created.append(sandbox)
        return sandbox

    async def close(self) -> None:
        pass


def test_an_action_that_destroys_the_sandbox_ends_the_episode_with_reward_0() -> None:
    env = SandboxToolEnv(BreakableSandbox())
    out = asyncio.run(astep(env, bash_block(KILL_ALL)))
    assert (out["done"], out["reward"]) == (True, 0.0)
    assert out["metadata"]["finish_reason"] == "agent_broke_sandbox"
    assert "status 137" in out["observations"][0]["content"]


def test_a_sandbox_error_of_an_action_is_still_the_infrastructures() -> None:
    class Dying(FakeSandbox):
        async def run(self, command: str, **_: Any) -> CommandResult:
            raise SandboxError("the daemon went away")

    with pytest.raises(SandboxError, match="daemon"):
        asyncio.run(astep(SandboxToolEnv(Dying()), bash_block("ls")))


def test_an_editor_error_is_shown_to_the_agent() -> None:
    class Unreadable(FakeSandbox):
        async def read_file(self, path: str) -> bytes:
            raise IsADirectoryError(21, "Is a directory", path)

    out = asyncio.run(astep(SandboxToolEnv(Unreadable()), editor_block("view", "/etc")))
    assert not out["done"]
    assert "Is a directory" in out["observations"][0]["content"]


def _task_episode(n: int = 0) -> Episode:
    return Episode(f"e{n}", {"task": load_suite()[0]})


def test_the_dispatcher_trains_on_it_with_reward_0_and_does_not_retry() -> None:
    backend = BreakableBackend()
    pipeline = SWEPipeline(backend, agent=AgentConfig(max_turns=4))  # type: ignore[arg-type]
    llm = ScriptedClient([bash_block("ls"), bash_block(KILL_ALL), bash_block(SUBMIT)])
    (result,) = asyncio.run(pipeline.dispatcher(llm).run([_task_episode()])).results
    assert (result.outcome.value, result.treatment.value) == ("agent_broke_sandbox", "zero_reward")
    assert (result.attempts, result.reward, result.grade) == (1, 0.0, None)
    assert len(backend.created) == 1  # not graded, not retried
    assert result.trajectory is not None
    assert result.trajectory.turns[-1].action == BashAction(KILL_ALL)  # the tokens that did it are trained on


# -- the real Docker backend ----------------------------------------------------------------------------


def _docker_pipeline() -> tuple[Any, SWEPipeline]:
    from skyrl_agent.sandbox.docker_backend import DockerBackend

    backend = DockerBackend(run_id="skyrl-test-broken")
    return backend, SWEPipeline(backend, agent=AgentConfig(max_turns=4), spec=SandboxSpec(memory_mb=512))


@pytest.mark.docker
def test_an_agent_that_kills_its_docker_sandbox_fails_its_episode() -> None:
    async def main() -> Any:
        backend, pipeline = _docker_pipeline()
        llm = ScriptedClient([bash_block("echo hi"), bash_block(KILL_ALL), bash_block(SUBMIT)])
        try:
            return (await pipeline.dispatcher(llm).run([_task_episode()])).results[0]
        finally:
            await backend.close()

    result = asyncio.run(main())
    assert (result.outcome.value, result.treatment.value) == ("agent_broke_sandbox", "zero_reward"), result.error
    assert (result.attempts, result.reward, result.grade) == (1, 0.0, None)
    assert result.trajectory.finish_reason == "agent_broke_sandbox"
    assert result.trajectory.turns[-1].action == BashAction(KILL_ALL)
    assert "status 137" in result.trajectory.turns[-1].observations[0]["content"]


@pytest.mark.docker
def test_a_docker_sandbox_killed_from_the_host_between_commands_is_masked_and_retried() -> None:
    def policy(prompt: Prompt) -> str:
        """Learns the container's hostname, then kills the container from the host while it waits for the LLM."""
        turn = sum(1 for m in prompt if isinstance(m, dict) and m.get("role") == "assistant")
        if turn == 0:
            return bash_block("hostname")
        if turn == 1:
            import docker

            hostname = re.findall(r"^[0-9a-f]{12}$", str(prompt[-1]["content"]), re.M)[0]  # type: ignore[index]
            container = docker.from_env().containers.get(hostname)
            container.kill()
            while container.status != "exited":
                time.sleep(0.1)
                container.reload()
            return bash_block("echo after")
        return bash_block(SUBMIT)

    async def main() -> Any:
        backend, pipeline = _docker_pipeline()
        try:
            dispatcher = pipeline.dispatcher(ScriptedClient(policy), DispatcherConfig())
            return (await dispatcher.run([_task_episode()])).results[0]
        finally:
            await backend.close()

    result = asyncio.run(main())
    assert (result.outcome.value, result.treatment.value) == ("sandbox_error", "mask"), result.error
    assert result.attempts == 2  # retried on a fresh sandbox
