"""The process backend's commands end on time, with every process they started, daemons included."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from skyrl_agent.sandbox.base import CommandResult, SandboxSpec
from skyrl_agent.sandbox.process_backend import OUTPUT_CAP, ProcessBackend, ProcessSandbox

# A daemon in a session of its own that holds the command's stdout: it writes its pid, then sleeps.
DAEMON = "setsid sh -c 'echo $$ > daemon.tmp && mv daemon.tmp daemon.pid; exec sleep 1000' &"
DAEMON += " while [ ! -e daemon.pid ]; do sleep 0.01; done;"
BOUND_S = 10.0  # a command with a 1 s timeout must be back well within this


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _run(command: str, timeout_s: float) -> tuple[CommandResult, float, int | None]:
    """The result and duration of ``command``, and the daemon's pid (killed here if it survived)."""

    async def main() -> tuple[CommandResult, float, int | None]:
        sandbox = await ProcessBackend().create(SandboxSpec())
        assert isinstance(sandbox, ProcessSandbox)
        pid_file = sandbox.host_path("daemon.pid")
        try:
            start = time.monotonic()
            result = await asyncio.wait_for(sandbox.run(command, timeout_s=timeout_s), BOUND_S)
            return result, time.monotonic() - start, int(pid_file.read_text()) if pid_file.exists() else None
        finally:
            if pid_file.exists():
                daemon = int(pid_file.read_text())
                if _alive(daemon):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(daemon, signal.SIGKILL)
            await sandbox.close()

    return asyncio.run(main())


def test_timeout_with_a_setsid_child_holding_stdout_returns_on_time() -> None:
    result, elapsed, daemon = _run(f"{DAEMON} echo started; sleep 30", timeout_s=1.0)
    assert result.timed_out
    assert result.exit_code == -1
    assert result.output == "started\n"
    assert elapsed < 5.0
    assert daemon is not None
    assert not _alive(daemon)  # the whole tree was killed, not only the command's process group


def test_a_command_that_leaves_a_daemon_holding_stdout_returns_when_it_exits() -> None:
    result, elapsed, daemon = _run(f"{DAEMON} echo started", timeout_s=30.0)
    assert (result.output, result.exit_code, result.timed_out) == ("started\n", 0, False)
    assert elapsed < 5.0
    assert daemon is not None
    assert not _alive(daemon)  # a command's processes do not outlive it


def test_output_keeps_the_tail_up_to_the_cap() -> None:
    result, _, _ = _run(f"head -c {OUTPUT_CAP + 10} /dev/zero | tr '\\0' a; echo -n END", timeout_s=30.0)
    assert result.truncated
    assert len(result.output) == OUTPUT_CAP
    assert result.output.endswith("aEND")


@pytest.mark.parametrize("command", ["exit 3", "kill -9 $$"])
def test_exit_codes_are_kept(command: str) -> None:
    result, _, _ = _run(command, timeout_s=30.0)
    assert result.exit_code == (3 if command == "exit 3" else -9)
    assert not result.timed_out


def test_commands_read_nothing_on_stdin() -> None:
    result, elapsed, _ = _run("cat; echo done", timeout_s=30.0)
    assert result.output == "done\n"
    assert elapsed < 5.0
