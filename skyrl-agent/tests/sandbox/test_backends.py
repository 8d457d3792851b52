"""Behaviour every isolating backend (Docker, local bwrap) must show."""

from __future__ import annotations

import asyncio

import pytest

from skyrl_agent.sandbox import shell
from skyrl_agent.sandbox.base import SandboxClosedError, SandboxSpec

from .conftest import SPEC, in_sandbox

pytestmark = pytest.mark.docker  # the local backend exports its rootfs from the Docker image


def test_output_exit_code_and_user(backend_kind: str) -> None:
    async def body(sb, _):
        result = await sb.run("echo out; echo err >&2; id -un; exit 3")
        assert (result.output, result.exit_code, result.timed_out) == ("out\nerr\nsandbox\n", 3, False)

    in_sandbox(backend_kind, body)


def test_shell_state_persists(backend_kind: str) -> None:
    async def body(sb, _):
        await sb.run("mkdir -p sub && cd sub && export GREETING=hello")
        result = await sb.run('pwd; echo "$GREETING"')
        assert result.output == "/workspace/sub\nhello\n"
        assert (await sb.run("pwd", workdir="/tmp")).output == "/tmp\n"
        assert (await sb.run("pwd")).output == "/workspace/sub\n"

    in_sandbox(backend_kind, body)


def test_timeout_kills_process_group(backend_kind: str) -> None:
    async def body(sb, _):
        result = await sb.run("sleep 300 & sleep 301", timeout_s=1)
        assert result.timed_out
        assert result.exit_code == -1
        leftover = await sb.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'sleep 30[01]' || true")
        assert leftover.output.strip() == "0"
        assert (await sb.run("echo alive")).output == "alive\n"

    in_sandbox(backend_kind, body)


def test_output_flood_is_capped_and_shell_survives(backend_kind: str) -> None:
    async def body(sb, _):
        result = await sb.run("yes", timeout_s=2)
        assert result.truncated
        assert result.timed_out
        assert len(result.output) == 64 * 1024
        assert (await sb.run("echo ok")).output == "ok\n"

    in_sandbox(backend_kind, body)


def test_fork_bomb_is_contained(backend_kind: str) -> None:
    async def body(sb, _):
        # The bomb's top-level command returns at once; its processes are killed when it does.
        await sb.run("b() { b | b & }; b", timeout_s=3)
        result = await sb.run("echo recovered", timeout_s=20)
        assert result.output == "recovered\n"
        assert (await sb.run("echo again")).output == "again\n"

    in_sandbox(backend_kind, body)


def test_processes_do_not_outlive_their_command(backend_kind: str) -> None:
    async def body(sb, _):
        await sb.run("setsid nohup sleep 303 > /dev/null 2>&1 & sleep 304 &")
        leftover = await sb.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'sleep 30[34]' || true")
        assert leftover.output.strip() == "0"

    in_sandbox(backend_kind, body)


# 2> /dev/null: a process listed by the glob may exit before cat reads it
COUNT_SLEEPS = "cat /proc/[0-9]*/cmdline 2> /dev/null | tr '\\0' ' ' | grep -c 'sleep 30[5-9]' || true"
COUNT_STOPPED = "grep -lE '^State:\\s+T' /proc/[0-9]*/status 2> /dev/null | wc -l"


def test_state_survives_a_killed_shell_or_runner(backend_kind: str) -> None:
    async def body(sb, _):
        await sb.run("mkdir -p sub && cd sub && export KEPT=yes")
        assert (await sb.run("cat /proc/$PPID/comm")).output == "skyrl-runner\n"  # `pkill python` spares it
        # $$ is the long-lived bash that forks each command: killing it ends the command; a new one takes over.
        assert (await sb.run("kill -9 $$")).exit_code == 137
        assert (await sb.run('pwd; echo "$KEPT"')).output == "/workspace/sub\nyes\n"
        # The command kills the runner itself: no reply comes, the runner is respawned.
        result = await sb.run("sleep 305 & kill -9 $PPID; sleep 306", timeout_s=20)
        assert (result.timed_out, result.exit_code) == (True, -1)
        assert result.duration_s < 10  # the dead runner is noticed at once, not at the backstop
        assert (await sb.run('pwd; echo "$KEPT"')).output == "/workspace/sub\nyes\n"
        assert (await sb.run(COUNT_SLEEPS)).output.strip() == "0"

    in_sandbox(backend_kind, body)


def test_wedged_runner_is_respawned_by_the_backstop(backend_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell, "BACKSTOP_S", 0.5)

    async def body(sb, _):
        await sb.run("cd /tmp && export KEPT=yes")
        result = await sb.run("sleep 307 & kill -STOP $PPID", timeout_s=0.5)  # the runner stops answering
        assert (result.timed_out, result.exit_code) == (True, -1)
        assert (await sb.run('pwd; echo "$KEPT"')).output == "/tmp\nyes\n"
        # The stopped runner and what it had started are gone (Docker: swept by the new runner).
        assert (await sb.run(COUNT_SLEEPS)).output.strip() == "0"
        assert (await sb.run(COUNT_STOPPED)).output.strip() == "0"

    in_sandbox(backend_kind, body)


def test_a_sandbox_python_of_another_version_compiles_the_runner(
    backend_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runner is sent precompiled and as source; a python whose bytecode magic differs uses the source.
    monkeypatch.setattr(shell, "MAGIC_NUMBER", b"\x00\x00\r\n")
    monkeypatch.setattr(shell, "_RUNNER_CODE", b"not marshal data")  # would fail to load if it were used

    async def body(sb, _):
        assert (await sb.run("echo compiled here")).output == "compiled here\n"

    in_sandbox(backend_kind, body)


def test_a_command_that_stops_itself_ends_there(backend_kind: str) -> None:
    async def body(sb, _):
        result = await sb.run("sleep 308 & kill -STOP $BASHPID; echo never", timeout_s=20)
        assert (result.exit_code, result.timed_out, result.output) == (128 + 19, False, "")
        assert (await sb.run(COUNT_SLEEPS)).output.strip() == "0"
        assert (await sb.run(COUNT_STOPPED)).output.strip() == "0"

    in_sandbox(backend_kind, body)


@pytest.mark.slow
def test_every_fresh_runner_answers_its_first_command(backend_kind: str) -> None:
    # bash 5.2 could lose the record of a command's subshell and spin forever in `wait -f` (about one fresh runner
    # in 200 hung on its first command); the subshell now runs as a foreground job.
    async def body(sb, _):
        for _ in range(300):
            await sb._shell.close()  # the next command starts a new runner and shell
            result = await sb.run("true && /bin/true", timeout_s=5)
            assert (result.exit_code, result.timed_out) == (0, False)

    in_sandbox(backend_kind, body)


def test_cancelled_command_does_not_answer_the_next(backend_kind: str) -> None:
    async def body(sb, _):
        await sb.run("export KEPT=yes")
        task = asyncio.create_task(sb.run("sleep 309; echo late", timeout_s=30))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await sb.run('echo "next $KEPT"')).output == "next yes\n"
        assert (await sb.run(COUNT_SLEEPS)).output.strip() == "0"

    in_sandbox(backend_kind, body)


def test_memory_bomb_is_killed(backend_kind: str) -> None:
    async def body(sb, _):
        result = await sb.run("python3 -c 'x = bytearray(1024 * 1024 * 1024)'", timeout_s=20)
        assert result.exit_code != 0
        assert (await sb.run("echo ok")).output == "ok\n"

    in_sandbox(backend_kind, body)


def test_no_network(backend_kind: str) -> None:
    async def body(sb, _):
        code = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"
        result = await sb.run(f'python3 -c "{code}"', timeout_s=10)
        assert result.exit_code != 0

    in_sandbox(backend_kind, body)


def test_cannot_write_outside_workspace(backend_kind: str) -> None:
    async def body(sb, _):
        assert (await sb.run("touch /etc/evil")).exit_code != 0
        assert (await sb.run("touch /usr/bin/evil")).exit_code != 0
        with pytest.raises(PermissionError):
            await sb.write_file("/etc/passwd", "root::0:0::/:/bin/sh\n")

    in_sandbox(backend_kind, body)


def test_files_are_binary_safe(backend_kind: str) -> None:
    async def body(sb, _):
        data = bytes(range(256)) * 300 + b"\n__SKYRL_fake:0\n"
        await sb.write_file("deep/dir/blob.bin", data, mode=0o600)
        assert await sb.read_file("deep/dir/blob.bin") == data
        assert (await sb.run("stat -c %a deep/dir/blob.bin")).output == "600\n"
        await sb.write_file("empty", b"")
        assert await sb.read_file("/workspace/empty") == b""
        with pytest.raises(FileNotFoundError):
            await sb.read_file("missing")
        assert (await sb.run("echo still in sync")).output == "still in sync\n"

    in_sandbox(backend_kind, body)


def test_snapshot_and_fork(backend_kind: str) -> None:
    async def body(sb, backend):
        await sb.write_file("state.txt", "v1")
        await sb.run("git init -q repo")
        snap = await sb.snapshot()
        await sb.write_file("state.txt", "after-snapshot")
        forks = await backend.fork(snap, 2, SPEC)
        try:
            for fork in forks:
                assert await fork.read_file("state.txt") == b"v1"
                assert (await fork.run("test -d repo/.git")).exit_code == 0
            await forks[0].write_file("state.txt", "fork0")
            assert await forks[1].read_file("state.txt") == b"v1"
            assert await sb.read_file("state.txt") == b"after-snapshot"
        finally:
            for fork in forks:
                await fork.close()

    in_sandbox(backend_kind, body)


def test_closed_sandbox_refuses_and_close_is_idempotent(backend_kind: str) -> None:
    async def body(sb, _):
        await sb.close()
        await sb.close()
        with pytest.raises(SandboxClosedError):
            await sb.run("true")

    in_sandbox(backend_kind, body, SandboxSpec())
