"""The model socket and its forwarder on the host alone: bytes both ways, many connections, half-closes, closing."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from skyrl_agent.sandbox import session_forwarder
from skyrl_agent.sandbox.session_socket import SessionSocket

MB = 1 << 20
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _digest_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads to the end, answers with the sha256 of what it read, then ``n`` bytes as asked in the first line."""
    data = await reader.read()
    first, _, _ = data.partition(b"\n")
    writer.write(hashlib.sha256(data).hexdigest().encode() + b"\n" + b"x" * int(first))
    await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def _relayed(server: Handler = _digest_server) -> AsyncIterator[tuple[SessionSocket, int]]:
    """A TCP server on the loopback and a model socket serving it; closed afterwards."""
    tcp = await asyncio.start_server(server, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    model_socket = SessionSocket()
    try:
        await model_socket.serve("127.0.0.1", port)
        yield model_socket, port
    finally:
        await model_socket.close()
        tcp.close()


async def _exchange(open_connection: Opener, request: bytes) -> bytes:
    reader, writer = await open_connection()
    writer.write(request)
    await writer.drain()
    writer.write_eof()  # the server reads to the end: the half-close must reach it
    answer: bytes = await reader.read()
    writer.close()
    return answer


def _request(answer_bytes: int, body_bytes: int) -> bytes:
    return f"{answer_bytes}\n".encode() + os.urandom(body_bytes)


def test_megabytes_go_both_ways_over_many_connections_at_once() -> None:
    async def main() -> None:
        async with _relayed() as (model_socket, _):
            requests = [_request(4 * MB, 4 * MB), *(_request(k * 1000, k * 7919) for k in range(16))]
            answers = await asyncio.gather(
                *(_exchange(lambda: asyncio.open_unix_connection(model_socket.path), r) for r in requests)
            )
            for request, answer in zip(requests, answers, strict=True):
                digest, _, tail = answer.partition(b"\n")
                assert digest.decode() == hashlib.sha256(request).hexdigest()
                assert len(tail) == int(request.partition(b"\n")[0])

    asyncio.run(main())


def test_the_forwarder_serves_the_socket_on_a_loopback_port() -> None:
    async def main() -> None:
        async with _relayed() as (model_socket, _):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            forwarder = subprocess.Popen(
                [sys.executable, "-I", "-S", session_forwarder.__file__, str(port), model_socket.path],
                start_new_session=True,  # its group: the serving child stays in it
            )
            try:
                # It returns once the port listens (the serving child goes on): no wait before the first connection.
                assert await asyncio.to_thread(forwarder.wait, 60) == 0
                requests = [_request(3 * MB, 3 * MB), *(_request(1000, 5000) for _ in range(8))]
                answers = await asyncio.gather(
                    *(_exchange(lambda: asyncio.open_connection("127.0.0.1", port), r) for r in requests)
                )
                for request, answer in zip(requests, answers, strict=True):
                    assert answer.partition(b"\n")[0].decode() == hashlib.sha256(request).hexdigest()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(forwarder.pid, signal.SIGKILL)
                forwarder.wait()

    asyncio.run(main())


def test_no_server_there_closes_the_connection() -> None:
    async def main() -> None:
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]  # bound, never listening: connections are refused
            model_socket = SessionSocket()
            try:
                await model_socket.serve("127.0.0.1", port)
                reader, writer = await asyncio.open_unix_connection(model_socket.path)
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
            finally:
                await model_socket.close()

    asyncio.run(main())


def test_closing_ends_connections_in_flight_and_removes_the_directory() -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers
        writer.close()

    async def main() -> None:
        async with _relayed(hold) as (model_socket, _):
            directory = Path(model_socket.directory)
            assert (directory / "forward.py").read_text() == Path(session_forwarder.__file__).read_text()
            assert oct(Path(model_socket.path).stat().st_mode & 0o777) == oct(0o666)  # the sandbox user connects
            reader, writer = await asyncio.open_unix_connection(model_socket.path)
            writer.write(b"waiting")
            await writer.drain()
            await asyncio.sleep(0.1)
            await model_socket.close()
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            assert not directory.exists()
            await model_socket.close()  # idempotent

    asyncio.run(main())


def test_a_sandbox_cannot_hold_more_than_its_share_of_connections() -> None:
    from skyrl_agent.sandbox.session_socket import MAX_CONNECTIONS

    release = asyncio.Event()

    async def holding(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()  # holds every connection it gets open
        writer.close()

    async def main() -> tuple[int, int]:
        async with _relayed(holding) as (model_socket, _port):
            opened = [await asyncio.open_unix_connection(model_socket.path) for _ in range(MAX_CONNECTIONS + 5)]
            await asyncio.sleep(0.5)
            refused = 0
            for reader, _writer in opened:
                with contextlib.suppress(asyncio.TimeoutError):
                    if await asyncio.wait_for(reader.read(), 0.05) == b"":  # closed by the relay at once
                        refused += 1
            held = len(model_socket._connections)
            release.set()
            for _reader, writer in opened:
                writer.close()
            return held, refused

    held, refused = asyncio.run(main())
    assert (held, refused) == (MAX_CONNECTIONS, 5)
