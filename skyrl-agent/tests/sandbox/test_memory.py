"""The in-memory test double honours the protocol (without isolation)."""

from __future__ import annotations

import asyncio

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
