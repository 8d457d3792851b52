"""A sandbox's one way out: a unix socket whose connections the host pipes to the sandbox's model server.

An agent sandbox has no network (Docker: ``network_mode="none"``, nothing but its own loopback). For a harness
that runs inside it, the host makes a private directory per sandbox; the backend mounts it read-only at
:data:`~.base.MODEL_SOCKET_MOUNT` and starts the forwarder (:mod:`.session_forwarder`) there before any command::

    sandbox                                                   host
    harness ─► 127.0.0.1:FORWARD_PORT ─► forwarder ─► model.sock ═► SessionSocket ─► model server (127.0.0.1:port)

:class:`SessionSocket` pipes every connection to the one address given to :meth:`~SessionSocket.serve`, so
whatever a sandbox sends reaches that server and nothing else: no other port of the host (whatever listens on its
wildcard addresses), no other sandbox, no internet. The server listens on the host's loopback only.

Ownership: whoever makes a :class:`SessionSocket` closes it, after the sandbox it serves; closing ends the
connections in flight and removes the directory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from skyrl_agent.sandbox.base import MODEL_SOCKET_MOUNT

__all__ = ["FORWARD_PORT", "SessionSocket", "forwarder_command"]

FORWARD_PORT = 17400  # the forwarder's port on the sandbox's loopback (fixed: the harness's URL names it)
SOCKET_NAME = "model.sock"
FORWARDER_NAME = "forward.py"
CHUNK = 65536  # bytes per read
MAX_CONNECTIONS = 64  # connections one sandbox may hold open through its socket; more are closed at once


def forwarder_command(port: int = FORWARD_PORT) -> str:
    """The shell line that starts the forwarder; it returns once the port listens (the forwarder then detaches)."""
    script, path = f"{MODEL_SOCKET_MOUNT}/{FORWARDER_NAME}", f"{MODEL_SOCKET_MOUNT}/{SOCKET_NAME}"
    return f"python3 -I -S {script} {port} {path} < /dev/null > /dev/null 2>&1\n"


class SessionSocket:
    """The host's end of one sandbox's way to its model server (see the module docstring).

    Made with its directory (which holds the forwarder's program); the socket appears in it at :meth:`serve`.
    """

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="skyrl-model-")
        # The sandbox user (another uid) must reach the socket; the directory holds nothing else to protect.
        os.chmod(self.directory, 0o755)
        shutil.copyfile(Path(__file__).with_name("session_forwarder.py"), Path(self.directory, FORWARDER_NAME))
        os.chmod(Path(self.directory, FORWARDER_NAME), 0o644)
        self.last_error: str | None = None  # why the last connection to the server failed, for messages
        self._server: asyncio.AbstractServer | None = None
        self._target: tuple[str, int] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def path(self) -> str:
        """The socket's path on the host."""
        return str(Path(self.directory, SOCKET_NAME))

    async def serve(self, host: str, port: int) -> None:
        """Listen on :attr:`path`; each connection is piped to a new connection to ``(host, port)``, both ways.

        A side that stops sending ends the other's sending too (a half-close); a reset ends both.

        Raises:
            RuntimeError: it serves already.
        """
        if self._server is not None:
            raise RuntimeError(f"the model socket {self.path} already serves {self._target}")
        self._target = (host, port)
        self._server = await asyncio.start_unix_server(self._connected, self.path)
        os.chmod(self.path, 0o666)  # connecting takes write permission on the socket

    async def close(self) -> None:
        """Stop listening, end the connections in flight and remove the directory; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        shutil.rmtree(self.directory, ignore_errors=True)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task, target = asyncio.current_task(), self._target
        assert task is not None
        assert target is not None  # a connection comes only once serving
        if len(self._connections) >= MAX_CONNECTIONS:  # the sandbox's doing: it may not hold the host's sockets
            self.last_error = f"the sandbox held {MAX_CONNECTIONS} connections already; one more was refused"
            writer.close()
            return
        self._connections.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError as exc:  # the server is not there: the sandbox sees its connection closed
                self.last_error = f"connecting to {target[0]}:{target[1]} failed ({exc})"
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()
            self._connections.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until it ends, then end ``writer``'s sending side (a half-close)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:  # one side reset: the whole connection is over (the other direction then ends too)
        writer.transport.abort()
