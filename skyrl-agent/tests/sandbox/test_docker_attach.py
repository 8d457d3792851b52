"""The first command runner of a Docker sandbox: started by the container's init process on the attached streams."""

from __future__ import annotations

import asyncio
import time

import pytest

from skyrl_agent.sandbox import attach, docker_backend
from skyrl_agent.sandbox.attach import runner_argv_input

from .conftest import SPEC, in_sandbox

LIST = 'for p in /proc/[0-9]*; do printf \'%s %s\\n\' "${p#/proc/}" "$(cat $p/comm)"; done 2> /dev/null'


async def _processes(sandbox) -> dict[str, str]:
    """comm -> pid of every process the sandbox user sees (one each: the names looked for are unique)."""
    lines = (await sandbox.run(LIST)).output.split("\n")
    return {comm: pid for pid, _, comm in (line.partition(" ") for line in lines if line)}


async def _processes_including(sandbox, expected: set[str], within_s: float = 10.0) -> dict[str, str]:
    """:func:`_processes` once it lists ``expected``: the dead-man ``sleep`` is forked in the background, and on a
    loaded host its ``exec`` may come after the runner already answers."""
    deadline = time.monotonic() + within_s
    while not expected <= set(names := await _processes(sandbox)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return names


@pytest.mark.docker
def test_the_first_runner_needs_no_exec_and_survives_pkill_bash() -> None:
    async def body(sb, _) -> None:
        sb.container.reload()
        assert not sb.container.attrs["ExecIDs"]  # no `docker exec` was needed to reach the runner
        names = await _processes_including(sb, {"skyrl-init", "skyrl-runner", "sleep"})
        assert {"skyrl-init", "skyrl-runner", "sleep"} <= set(names)
        # The init process is not a `bash` by name: a command's `pkill bash` ends only the runner's shell.
        await sb.run("pkill -KILL bash", timeout_s=10)
        assert (await sb.run("echo alive")).output == "alive\n"
        sb.container.reload()
        assert sb.container.status == "running"
        assert not sb.container.attrs["ExecIDs"]  # ... and the same runner answers

    in_sandbox("docker", body)


@pytest.mark.docker
def test_a_runner_that_dies_between_commands_is_replaced_before_the_next() -> None:
    async def body(sb, _) -> None:
        await sb.run("cd /tmp && export KEPT=yes")
        # Killed from outside while idle, as the OOM killer would: no request is waiting for its reply.
        runner = (await _processes(sb))["skyrl-runner"]
        assert sb.container.exec_run(["bash", "-c", f"kill -9 {runner}"], user=SPEC.user).exit_code == 0
        deadline = time.monotonic() + 10
        while sb._shell.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not sb._shell.alive  # the init process said so on the attach stream
        result = await sb.run('pwd; echo "$KEPT"')
        assert (result.output, result.exit_code) == ("/tmp\nyes\n", 0)  # a new runner ran it
        names = await _processes_including(sb, {"skyrl-init", "sleep"})
        assert {"skyrl-init", "sleep"} <= set(names)  # the respawned runner's sweep kept them

    in_sandbox("docker", body)


@pytest.mark.docker
def test_a_vanished_host_leaves_the_dead_man_in_charge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_backend, "DEAD_MAN_S", 3)

    async def body(sb, _) -> None:
        assert (await sb.run("echo up")).output == "up\n"
        # What the host's death does to the attach stream: it closes. The runner's stdin ends with it.
        await sb._shell.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sb.container.reload()
            if sb.container.status == "exited":
                break
            await asyncio.sleep(0.2)
        assert sb.container.status == "exited"

    in_sandbox("docker", body)


def test_runner_arguments_are_checked() -> None:
    assert runner_argv_input(["python3", "-c", "x = 1"]) == b"python3\0-c\0x = 1\0\0"
    for bad in (["python3", ""], ["a\0b"]):
        with pytest.raises(ValueError, match="NUL"):
            runner_argv_input(bad)
    assert attach.RUNNER_EXITED.decode() in attach.INIT_SCRIPT
