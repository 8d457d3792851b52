"""Whose failure a dead Docker sandbox is: a command that ended it from the inside, or the infrastructure."""

from __future__ import annotations

import asyncio
import time

import pytest

from skyrl_agent.sandbox import shell
from skyrl_agent.sandbox.base import SandboxError

from .conftest import in_sandbox

pytestmark = pytest.mark.docker


def _wait_exited(container, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        container.reload()
        if container.status == "exited":
            return
        time.sleep(0.1)
    raise AssertionError(f"container {container.id[:12]} is still {container.status}")


def test_a_command_that_kills_every_process_ends_the_sandbox_by_its_own_doing() -> None:
    async def body(sb, _) -> None:
        assert (await sb.run("echo up")).output == "up\n"
        with pytest.raises(SandboxError) as info:
            await sb.run("kill -9 -1", timeout_s=20)
        assert isinstance(info.value, shell.CommandBrokeSandboxError), repr(info.value)
        assert "status 137" in str(info.value)

    in_sandbox("docker", body)


def test_a_container_killed_from_the_host_during_a_command_is_an_infrastructure_failure() -> None:
    async def body(sb, _) -> None:
        running = asyncio.ensure_future(sb.run("sleep 60", timeout_s=60))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(sb.container.kill)
        with pytest.raises(SandboxError) as info:
            await asyncio.wait_for(running, 30)
        assert not isinstance(info.value, shell.CommandBrokeSandboxError), repr(info.value)

    in_sandbox("docker", body)


def test_a_container_that_died_while_idle_is_an_infrastructure_failure() -> None:
    async def body(sb, _) -> None:
        assert (await sb.run("echo up")).output == "up\n"
        # Ended from the inside, but between commands: no request of the caller was running.
        sb.container.exec_run(["bash", "-c", "kill -9 -1"], user="sandbox")
        await asyncio.to_thread(_wait_exited, sb.container)
        with pytest.raises(SandboxError) as info:
            await sb.run("echo after")
        assert not isinstance(info.value, shell.CommandBrokeSandboxError), repr(info.value)

    in_sandbox("docker", body)
