"""AttachedChannel's demultiplexing, over a socket pair standing in for the daemon's attach connection."""

from __future__ import annotations

import asyncio
import socket

from skyrl_agent.sandbox.attach import RUNNER_EXITED, AttachedChannel


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


async def _open() -> tuple[AttachedChannel, socket.socket]:
    ours, daemon = socket.socketpair()
    return await AttachedChannel.open(ours), daemon


async def _eventually(condition, timeout_s: float = 2.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def test_stdout_and_stderr_frames_arrive_in_order_in_one_reader() -> None:
    async def main() -> None:
        channel, daemon = await _open()
        data = frame(1, b"12 0 ") + frame(2, b"warning\n") + frame(1, b"0 3\nabc")
        for index in range(len(data)):  # one byte at a time: frames split anywhere, headers included
            daemon.send(data[index : index + 1])
        assert await channel.stdout.readline() == b"12 0 warning\n"
        assert await channel.stdout.readexactly(7) == b"0 3\nabc"
        assert channel.alive
        channel.stdin.write(b"request")
        await channel.stdin.drain()
        assert daemon.recv(100) == b"request"  # stdin goes out raw, not framed
        await channel.kill()
        assert not channel.alive
        daemon.close()

    asyncio.run(main())


def test_the_exit_line_on_stderr_ends_the_runner_even_split_across_frames() -> None:
    async def main() -> None:
        channel, daemon = await _open()
        half = len(RUNNER_EXITED) // 2
        daemon.send(frame(2, b"\n" + RUNNER_EXITED[:half]))
        await asyncio.sleep(0.05)
        assert channel.alive
        daemon.send(frame(2, RUNNER_EXITED[half:] + b"\n"))
        assert await _eventually(lambda: not channel.alive)
        # A request waiting for its reply reads the line and fails to parse it, as for any dead runner.
        assert await channel.stdout.readline() == b"\n"
        await channel.kill()
        daemon.close()

    asyncio.run(main())


def test_the_exit_text_in_a_reply_on_stdout_means_nothing() -> None:
    async def main() -> None:
        channel, daemon = await _open()
        daemon.send(frame(1, RUNNER_EXITED + b"\n"))  # e.g. `cat` of a file that holds it
        assert await channel.stdout.readline() == RUNNER_EXITED + b"\n"
        assert channel.alive
        await channel.kill()
        daemon.close()

    asyncio.run(main())


def test_the_end_of_the_stream_ends_the_runner() -> None:
    async def main() -> None:
        channel, daemon = await _open()
        daemon.send(frame(1, b"partial"))
        daemon.close()
        assert await _eventually(lambda: not channel.alive)
        assert await channel.stdout.read() == b"partial"  # then EOF
        await channel.kill()
        await channel.kill()  # idempotent

    asyncio.run(main())
