"""The in-memory test double honours the protocol (without isolation)."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from skyrl_agent.sandbox import InMemoryBackend, Sandbox, SandboxBackend, SandboxSpec


def test_memory_sandbox_follows_the_protocol() -> None:
    async def main() -> None:
        backend = InMemoryBackend(output_cap=100)
        assert isinstance(backend, SandboxBackend)
        sb = await backend.create(SandboxSpec(env={"X": "1"}))
        try:
            assert isinstance(sb, Sandbox)
            assert (await sb.run("echo $X; exit 4")).exit_code == 4
            await sb.run("mkdir d && cd d && export Y=2")
            assert (await sb.run("basename $PWD; echo $Y")).output == "d\n2\n"
            flood = await sb.run("yes", timeout_s=1)
            assert flood.truncated
            assert flood.timed_out
            assert len(flood.output) == 100
            await sb.write_file("f.bin", b"\x00\xff")
            snap = await sb.snapshot()
            (fork,) = await backend.fork(snap, 1)
            assert await fork.read_file("f.bin") == b"\x00\xff"
            await fork.close()
        finally:
            await sb.close()
            await backend.close()

    asyncio.run(main())


def test_memory_sandbox_kills_only_what_its_commands_started() -> None:
    """The host is shared: leftovers are the runner's descendants, never other host processes."""

    async def main() -> None:
        backend = InMemoryBackend()
        sb = await backend.create()
        bystander = subprocess.Popen(["sleep", "30"])  # started on the host after the sandbox
        try:
            result = await sb.run("setsid sleep 308 > /dev/null 2>&1 & echo $!")
            leftover = int(result.output)
            await sb.run("true")
            assert bystander.poll() is None
            with pytest.raises(ProcessLookupError):
                os.kill(leftover, 0)
        finally:
            bystander.kill()
            bystander.wait()
            await sb.close()
            await backend.close()

    asyncio.run(main())
