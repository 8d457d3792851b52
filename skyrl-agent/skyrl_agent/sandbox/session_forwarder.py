"""The model forwarder: a TCP port on a sandbox's own loopback whose connections go to a mounted unix socket.

``python3 -I -S session_forwarder.py PORT SOCKET`` listens on ``127.0.0.1:PORT`` and pipes each connection, both
ways, to a new connection to the unix socket ``SOCKET`` (the host's :class:`~.session_socket.SessionSocket`,
mounted into the sandbox). A sandbox without network thus has one way out, to its model server, through a port an
ordinary HTTP client can use.

A container's init starts it before any command runs (:func:`.session_socket.forwarder_command`) and goes on once
it listens (it detaches itself then), so that the first command finds the port open and the command runner counts
it among the processes to keep. It uses the standard library only and runs on python ≥ 3.8,
as the command runner does: it starts in images we do not control.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

CHUNK = 65536  # bytes per read


def pipe(source: socket.socket, sink: socket.socket, done: threading.Semaphore) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends, then end ``sink``'s writing side (a half-close)."""
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:  # one side reset: the whole connection is over
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
    finally:
        done.release()


def serve_one(client: socket.socket, path: str) -> None:
    """Pipe ``client`` to a new connection to the socket at ``path``; close both when both directions ended."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:  # no relay (yet, or any more): the client sees its connection closed
        upstream.close()
        client.close()
        return
    done = threading.Semaphore(0)
    threading.Thread(target=pipe, args=(upstream, client, done), daemon=True).start()
    pipe(client, upstream, done)
    done.acquire()
    done.acquire()
    client.close()
    upstream.close()


def main(argv: list[str]) -> None:
    """Listen on ``127.0.0.1:argv[1]``; every connection is piped to the unix socket ``argv[2]``.

    Once the port listens, the process forks and the parent exits (0): whoever started it (the container's init)
    goes on only then, so the sandbox's first command finds the port open. The child, in the same process group,
    serves.
    """
    port, path = int(argv[1]), argv[2]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    if os.fork() > 0:
        os._exit(0)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve_one, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv)
