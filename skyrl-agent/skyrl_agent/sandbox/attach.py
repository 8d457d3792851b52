"""A command runner reached through a Docker *attach* stream: the container's own stdin, stdout and stderr.

Starting a container costs the daemon ≈155 ms here; a ``docker exec`` into it costs another ≈40–60 ms before anything
runs. So the first runner of a Docker sandbox is started by the container's main process, :data:`INIT_SCRIPT`,
on the streams the host attached before the start, and no exec is needed. Later runners (a respawn after the
runner died or wedged) come through ``docker exec`` as usual.

An attach stream ends only when the container exits, not when the runner does, so the script reports the runner's
end itself: it writes :data:`RUNNER_EXITED` on stderr when the runner has exited. :class:`AttachedChannel`
demultiplexes the stream (stdout and stderr into one reader, as for an exec'd runner), and counts the runner as
gone from that line on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence

__all__ = ["INIT_SCRIPT", "RUNNER_EXITED", "AttachedChannel", "runner_argv_input"]

RUNNER_EXITED = b"skyrl-runner exited"

# The container's main process (under docker-init), `bash -c INIT_SCRIPT skyrl-init DEAD_MAN_S`:
# * its process name is skyrl-init, so `pkill bash` in a command leaves it alone;
# * the dead-man `sleep` (started first, so that the runner counts it among the processes to keep) ends the
#   container DEAD_MAN_S after its start, once the first runner has ended;
# * the first runner's command line arrives on stdin, NUL-separated and ended by an empty argument (on the command
#   line it would match a command's `pkill -f python`); then the runner reads the rest of stdin itself;
# * without an attached stdin (no argument arrives) it only waits for the dead man.
INIT_SCRIPT = rf"""
printf skyrl-init > "/proc/$$/comm" 2> /dev/null
sleep "$1" < /dev/null > /dev/null 2>&1 &
runner=()
while IFS= read -r -d '' arg && [ -n "$arg" ]; do runner+=("$arg"); done
if [ "${{#runner[@]}}" -gt 0 ]; then
  "${{runner[@]}}"
  printf '\n{RUNNER_EXITED.decode()}\n' >&2
fi
exec < /dev/null > /dev/null 2>&1
wait
"""

_STDERR = 2
_HEADER = 8  # stream type (1 byte), 3 zero bytes, payload length (4 bytes, big-endian)


def runner_argv_input(argv: Sequence[str]) -> bytes:
    """What :data:`INIT_SCRIPT` reads from stdin to start ``argv``."""
    if any("\0" in arg or not arg for arg in argv):
        raise ValueError("runner arguments must be non-empty and contain no NUL byte")
    return b"".join(arg.encode() + b"\0" for arg in argv) + b"\0"


class AttachedChannel:
    """The runner behind a hijacked attach connection (``Tty`` off, so stdout and stderr arrive multiplexed).

    Ownership: owns the socket; :meth:`kill` closes it (with ``StdinOnce`` set on the container, the runner's
    stdin then ends and it exits).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stdin = writer
        self.stdout = asyncio.StreamReader()
        self._raw = reader
        self._gone = False  # the stream ended, or the init process reported the runner's exit
        self._demux = asyncio.create_task(self._run_demux())

    @classmethod
    async def open(cls, sock: socket.socket) -> AttachedChannel:
        """Take over ``sock``, an attach connection already upgraded to a raw stream."""
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        return cls(reader, writer)

    @property
    def alive(self) -> bool:
        """False once the stream ended or the init process reported the runner's exit."""
        return not self._gone

    async def kill(self) -> None:
        """Close the connection (see the class docstring) and stop reading it; idempotent."""
        self._gone = True
        self._demux.cancel()
        self.stdin.close()
        with contextlib.suppress(Exception):
            await self.stdin.wait_closed()
        with contextlib.suppress(asyncio.CancelledError):
            await self._demux

    async def _run_demux(self) -> None:
        tail = b""  # the end of stderr so far, enough to find the exit line split across frames
        try:
            while True:
                header = await self._raw.readexactly(_HEADER)
                payload = await self._raw.readexactly(int.from_bytes(header[4:], "big"))
                if header[0] == _STDERR:
                    tail = (tail + payload)[-2 * len(RUNNER_EXITED) :]
                    if RUNNER_EXITED in tail:
                        self._gone = True
                self.stdout.feed_data(payload)
        except (asyncio.IncompleteReadError, OSError):
            pass
        self._gone = True
        self.stdout.feed_eof()
