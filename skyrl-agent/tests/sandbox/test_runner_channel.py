"""The host's channel to the command runner: commands cannot write replies into it, and every read is bounded."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable

import pytest

from skyrl_agent.sandbox import runner, shell
from skyrl_agent.sandbox.base import SandboxError

from .conftest import in_sandbox

FORGED = "forged"
# What a reply looked like before replies carried the request's token: a command could print one.
FORGE = f"printf '0 0 0 {len(FORGED)}\\n{FORGED}' > /proc/{{pid}}/fd/1"


@pytest.mark.docker
def test_a_command_cannot_write_into_the_runners_stdout() -> None:
    async def body(sb, _) -> None:
        result = await sb.run(FORGE.format(pid="$PPID") + "; echo wrote $?")  # $PPID: the runner
        assert FORGED not in result.output
        assert "Permission denied" in result.output
        assert "wrote 1" in result.output
        assert (await sb.run("echo next")).output == "next\n"  # no stale reply is left behind

    in_sandbox("docker", body)


@pytest.mark.docker
def test_bytes_a_command_writes_into_the_containers_stdout_never_become_a_reply() -> None:
    async def body(sb, _) -> None:
        # PID 1 (docker-init) holds the container's own stdout: the first runner's channel to the host.
        with pytest.raises(SandboxError, match="did not send") as info:
            await sb.run(FORGE.format(pid=1) + "; sleep 3; echo genuine", timeout_s=20)
        assert isinstance(info.value, shell.CommandBrokeSandboxError)
        assert (await sb.run("echo next")).output == "next\n"  # a new runner, on a channel of its own

    in_sandbox("docker", body)


# -- host side, against a fake runner ----------------------------------------------------------------------


class CountingReader(asyncio.StreamReader):
    """Counts the bytes the host asked to read beyond header lines."""

    asked = 0

    async def readexactly(self, n: int) -> bytes:
        self.asked += n
        return await super().readexactly(n)

    async def read(self, n: int = -1) -> bytes:
        self.asked += max(n, 0)
        return await super().read(n)


class FakeRunner:
    """A runner channel that greets, then answers each request with ``answer(token)`` (the token may be b"")."""

    def __init__(self, answer: Callable[[bytes], bytes]) -> None:
        self.stdout = CountingReader()
        self.stdout.feed_data(runner.NAME + b" ready\n")
        self.stdin = self
        self.alive = True
        self._answer = answer
        self._booted = False

    def write(self, data: bytes) -> None:
        if not self._booted:  # the runner's source
            self._booted = True
            return
        fields = data.split(b"\n", 1)[0].split()
        token = fields[1] if len(fields) > 1 and len(fields[1]) == 16 else b""
        self.stdout.feed_data(self._answer(token))

    async def drain(self) -> None:
        pass

    async def kill(self) -> None:
        self.alive = False


async def _shell_with(fake: FakeRunner) -> shell.PersistentShell:
    async def opener(argv: object) -> FakeRunner:
        return fake

    # Respawns go through argv: `false` fails at once, as a sandbox that is gone would.
    persistent = shell.PersistentShell(["false"], state_path="/nonexistent/state", output_cap=1024)
    await persistent.start("/", opener=opener)  # type: ignore[arg-type]
    return persistent


def _header(token: bytes, length: int) -> bytes:
    return (token + b" " if token else b"") + b"0 0 0 %d\n" % length


def test_a_reply_longer_than_the_limit_is_refused_without_reading_it() -> None:
    claimed = 8 << 20  # far more than the 1 KiB output cap

    async def main() -> FakeRunner:
        fake = FakeRunner(lambda token: _header(token, claimed) + b"x" * claimed)
        persistent = await _shell_with(fake)
        with pytest.raises(SandboxError, match="exceeds") as info:
            await persistent.run("cat big", timeout_s=5)
        assert isinstance(info.value, shell.ReplyTooLargeError)
        assert isinstance(info.value, shell.CommandBrokeSandboxError)
        await persistent.close()
        return fake

    fake = asyncio.run(main())
    assert fake.stdout.asked < 1 << 16  # the claimed body was never read
    assert not fake.alive  # the channel was given up


def test_a_reply_without_the_requests_token_is_refused() -> None:
    async def main() -> None:
        persistent = await _shell_with(FakeRunner(lambda token: _header(b"", len(FORGED)) + FORGED.encode()))
        with pytest.raises(SandboxError, match="did not send"):
            await persistent.run("true", timeout_s=5)
        await persistent.close()

    asyncio.run(main())


def test_a_genuine_reply_is_accepted() -> None:
    async def main() -> None:
        persistent = await _shell_with(FakeRunner(lambda token: _header(token, 3) + b"ok\n"))
        result = await persistent.run("echo ok", timeout_s=5)
        assert (result.output, result.exit_code) == ("ok\n", 0)
        await persistent.close()

    asyncio.run(main())


def test_the_runner_reads_no_file_over_the_limit(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "MAX_FILE_BYTES", 10)
    (tmp_path / "small").write_bytes(b"x" * 10)
    (tmp_path / "big").write_bytes(b"x" * 11)
    assert runner.read_file(str(tmp_path / "small").encode()) == (0, 0, 0, b"x" * 10)
    assert runner.read_file(str(tmp_path / "big").encode())[0] == errno.EFBIG
    assert runner.read_file(b"/dev/zero")[0] == errno.EFBIG  # an endless file is read no further than the limit
