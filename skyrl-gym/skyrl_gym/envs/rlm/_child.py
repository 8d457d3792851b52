"""The child side of ``PersistentREPL(isolation="process")``: the program the child process runs.

:func:`child_main` is the entry point that :class:`~skyrl_gym.envs.rlm._process.ProcessBackend` starts in a fresh
``python -I``: it lowers the child's rlimits, builds an inline :class:`~skyrl_gym.envs.rlm.repl.PersistentREPL`
from the ``init`` message, and serves ``exec`` and ``lookup`` commands until the parent goes away. The protocol
is described in :mod:`skyrl_gym.envs.rlm._process`.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any, Final

from skyrl_gym.envs.rlm._process import encode_message, write_all
from skyrl_gym.envs.rlm.repl import PersistentREPL

__all__ = ["child_main"]

_FILE_SIZE_LIMIT: Final = 64 << 20  # RLIMIT_FSIZE of the child


class _ChildChannel:
    """The child's end of the pipes: a reader and a writer thread, so the main thread never blocks on I/O.

    Why threads: a ``SIGALRM`` timeout can interrupt the main thread between any two bytecodes. Keeping the
    framing in other threads means an interrupted helper call loses at most its own reply, never a message.
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._commands: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._waiters: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        threading.Thread(target=self._read_loop, args=(read_fd,), name="rlm-child-read", daemon=True).start()
        threading.Thread(target=self._write_loop, args=(write_fd,), name="rlm-child-write", daemon=True).start()

    def _read_loop(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            for line in stream:
                try:
                    message = json.loads(line)
                except ValueError:
                    os._exit(1)  # the parent never sends malformed lines: the pipe is corrupt
                waiter = self._waiters.get(message.get("id")) if message.get("op") == "reply" else None
                if waiter is not None:
                    waiter.put(message)
                elif message.get("op") != "reply":  # a reply nobody waits for belongs to an abandoned call
                    self._commands.put(message)
        # The parent closed the pipe: it is gone. Exit even if model code is stuck on the main thread.
        os._exit(0)

    def _write_loop(self, fd: int) -> None:
        while True:
            data = self._outbox.get()
            try:
                write_all(fd, data)
            except OSError:
                os._exit(0)

    def send(self, message: dict[str, Any]) -> None:
        """Queue one message (``SimpleQueue.put`` is a single C call: a timeout cannot split it)."""
        self._outbox.put(encode_message(message))

    def next_command(self) -> dict[str, Any] | None:
        """The next command from the parent."""
        return self._commands.get()

    def proxy(self, name: str) -> Callable[..., Any]:
        """A callback that forwards its arguments to the parent's helper ``name`` and returns its value."""

        def call(*args: Any) -> Any:
            call_id = next(self._ids)
            box: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
            self._waiters[call_id] = box
            try:
                self.send({"op": "call", "id": call_id, "name": name, "args": list(args)})
                reply = box.get()
            finally:
                self._waiters.pop(call_id, None)
            if reply.get("ok") is not True:
                raise RuntimeError(str(reply.get("error")))
            return reply.get("value")

        return call


def _lower_limits(memory_limit_mb: int) -> None:
    import resource  # POSIX only, like the rest of this module

    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, _FILE_SIZE_LIMIT)]
    if memory_limit_mb > 0:
        limits.append((resource.RLIMIT_AS, memory_limit_mb << 20))
    for kind, value in limits:
        _, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))
    # Writing past RLIMIT_FSIZE should fail the write (EFBIG), not kill the REPL.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _handle(repl: PersistentREPL, command: dict[str, Any]) -> dict[str, Any]:
    if command.get("op") == "lookup":
        return {"op": "lookup_result", "text": repl.lookup_text(str(command.get("name", "")))}
    result = repl.execute(str(command.get("code", "")))
    return {
        "op": "result",
        "stdout": result.stdout,
        "stderr": result.stderr,
        "error": result.error,
        "timed_out": result.timed_out,
        "final_value": repl.final_value,
    }


def child_main(read_fd: int, write_fd: int, memory_limit_mb: int) -> None:
    """Entry point of the child process: serve ``exec`` and ``lookup`` commands until the parent goes away."""
    _lower_limits(memory_limit_mb)
    channel = _ChildChannel(read_fd, write_fd)
    settings = channel.next_command()
    if settings is None or settings.get("op") != "init":
        return
    repl = PersistentREPL(
        settings.get("context"),
        lm_callback=channel.proxy("lm") if settings.get("lm") else None,
        subcall_fn=channel.proxy("subcall") if settings.get("subcall") else None,
        timeout=float(settings["timeout"]),
        max_output_chars=int(settings["max_output_chars"]),
        allowed_imports=settings.get("allowed_imports"),
    )
    channel.send({"op": "ready"})
    while (command := channel.next_command()) is not None:
        if command.get("op") in ("exec", "lookup"):
            channel.send(_handle(repl, command))
