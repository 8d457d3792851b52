"""One job's conversation with its sandboxed process, as a state machine, and its two drivers.

:class:`Exchange` does no waiting itself: :func:`drive` (threads) and :func:`adrive` (asyncio) wait for the
descriptors it names, so the sync and async paths behave identically. It works on any
:class:`~skyrl_gym.sandbox.worker.Run` (one interpreter per run, or a job on a fork server).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import time
from typing import Final

from skyrl_gym.sandbox.errors import SandboxStartError
from skyrl_gym.sandbox.limits import SandboxLimits
from skyrl_gym.sandbox.result import ExecutionResult
from skyrl_gym.sandbox.worker import Event, Run

__all__ = ["Exchange", "adrive", "drive"]

_READ_CHUNK: Final = 1 << 16
# After the run's process exits (or is killed), how long to keep reading pipes that something else still holds.
_DRAIN_GRACE_S: Final = 1.0


class Exchange:
    """One job on one run, as a state machine: starting → running → draining → done.

    starting: wait until the process is ready (bounded by ``start_timeout_s``); a reused fork server is ready at
        once. Output seen before that belongs to start-up and is only used in error messages; the job is not
        sent before, so no snippet output can be mistaken for start-up output.
    running: send the job and stdin, collect stdout/stderr. Ends when the run's process exits, at the wall-clock
        deadline, or when a stream exceeds ``max_output_bytes``; in the last two cases the run is killed.
    draining: after the leftovers were killed, read what is still buffered in the pipes (up to a short grace).

    Handlers take the current ``time.monotonic()`` value; nothing here blocks except the final reap of a process
    that has already exited or been SIGKILLed.
    """

    def __init__(
        self, run: Run, code: str | bytes, stdin: str | bytes, limits: SandboxLimits, *, batch: bool = False
    ) -> None:
        self.run = run
        self.limits = limits
        # The job: its kind, the rlimits, then the snippet's source (or, for a batch, marshal data); see
        # bootstrap/serve.py.
        kind = b"batch\n" if batch else b"run\n"
        header = limits.rlimit_header(max_processes=run.uid >= 0)
        body = code.encode("utf-8", "surrogatepass") if isinstance(code, str) else code
        data = stdin.encode("utf-8", "surrogateescape") if isinstance(stdin, str) else stdin
        self._outgoing = {run.job_w: memoryview(kind + header + body), run.stdin_w: memoryview(data)}
        self._streams = {run.stdout_r: bytearray(), run.stderr_r: bytearray()}
        self._startup_output = bytearray()
        self._truncated = {run.stdout_r: False, run.stderr_r: False}
        self.phase = "starting"
        self._deadline: float | None = time.monotonic() + run.config.start_timeout_s
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._exited = False
        self._timed_out = False
        self._start_error: str | None = None
        self._result: ExecutionResult | None = None

    def start(self, now: float) -> None:
        """Send the job at once if the process is ready already. Call once, before waiting."""
        if self.phase == "starting" and self.run.ready:
            self._begin(now)

    # What to wait for -------------------------------------------------------------------------------------------

    def readers(self) -> list[int]:
        """Descriptors to wait on for reading."""
        if self.phase == "done":
            return []
        return self._streams_open() + self.run.signal_fds()

    def writers(self) -> list[int]:
        """Descriptors to wait on for writing (only while running)."""
        return list(self._outgoing) if self.phase == "running" else []

    def deadline(self) -> float | None:
        """The monotonic time at which :meth:`on_tick` has something to do, or None."""
        return self._deadline if self.phase != "done" else None

    @property
    def done(self) -> bool:
        """Whether the run is over and its process reaped."""
        return self.phase == "done"

    # Events ----------------------------------------------------------------------------------------------------

    def on_readable(self, fd: int, now: float) -> None:
        """``fd`` (one of :meth:`readers`) is readable or closed."""
        if self.phase == "done":
            return
        if fd in self._streams:
            if self.run.is_open(fd):  # else a stale event for a descriptor this run already closed
                self._read_stream(fd, now)
        elif fd in self.run.signal_fds():
            for event in self.run.on_signal(fd):
                self._on_event(event, now)
        self._maybe_finish()

    def on_writable(self, fd: int, now: float) -> None:
        """``fd`` (one of :meth:`writers`) accepts data or its reader went away."""
        buffer = self._outgoing.get(fd)
        if buffer is None or not self.run.is_open(fd):
            return
        try:
            written = os.write(fd, buffer[:_READ_CHUNK])
        except BlockingIOError:
            return
        except OSError as exc:  # EPIPE: the interpreter exited or closed stdin without reading it all
            if exc.errno != errno.EPIPE:
                raise
            written = len(buffer)
        self._outgoing[fd] = buffer = buffer[written:]
        if not buffer:
            del self._outgoing[fd]
            self.run.close_fd(fd)  # EOF: the job is complete / stdin ends

    def on_tick(self, now: float) -> None:
        """Act on an expired deadline, if any. Call after each wait."""
        if self._deadline is None or now < self._deadline or self.phase == "done":
            return
        if self.phase == "starting":
            self._start_error = f"the sandboxed interpreter was not ready after {self.run.config.start_timeout_s} s"
            self._end(now, kill=True)
        elif self.phase == "running":
            self._timed_out = True
            self._end(now, kill=True)
        else:  # draining: something outside our reach still holds a pipe; stop reading it
            self._finish()
        self._maybe_finish()

    def abort(self) -> None:
        """Stop the run now (the caller was cancelled): kill, reap and close. The result is never read."""
        self.run.stop(kill=True)
        self.run.reap()
        self.phase = "done"

    # Outcome ---------------------------------------------------------------------------------------------------

    def result(self) -> ExecutionResult:
        """The outcome, once :attr:`done`.

        Raises:
            SandboxStartError: The interpreter died or hung before it was ready.
        """
        assert self._result is not None or self._start_error is not None, "result() before the run is done"
        if self._result is None:
            output = bytes(self._startup_output + self._streams[self.run.stderr_r]).decode(errors="replace")
            raise SandboxStartError(f"{self._start_error}; its output: {output.strip()!r}")
        return self._result

    def raw_stdout(self) -> bytes:
        """The run's stdout as bytes (capped), once :attr:`done`; :meth:`result` decodes it."""
        return bytes(self._streams[self.run.stdout_r])

    # Internals -------------------------------------------------------------------------------------------------

    def _streams_open(self) -> list[int]:
        return [fd for fd in self._streams if self.run.is_open(fd)]

    def _on_event(self, event: Event, now: float) -> None:
        if event == "ready":
            if self.phase == "starting":
                self._begin(now)
        elif event == "started":
            pass  # the job reached a forked child; only matters to the run (a later loss is then a kill)
        else:  # "exited" or "lost"
            self._exited = True
            if event == "lost" or self.phase == "starting":
                # Also a process that was ready but died while it waited in the pool (killed from outside): the
                # job must not be reported as a run that was killed.
                if self.phase in ("starting", "running"):
                    self._start_error = "the sandboxed interpreter exited before it got the job"
                self._end(now, kill=True)
            else:
                self._end(now, kill=False)

    def _begin(self, now: float) -> None:
        try:
            self.run.begin(self.limits.timeout_s)
        except SandboxStartError as exc:
            self._start_error = str(exc)
            self._end(now, kill=True)
            return
        if self.run.startup_on_streams:
            # Whatever start-up wrote is already in the pipes (writes complete before the process said ready).
            for fd in self._streams:
                self._read_stream(fd, now, startup=True)
        self.phase = "running"
        self._started_at = now
        self._deadline = now + self.limits.timeout_s
        # Fresh pipes take a short job and its input at once: one wait for the driver less.
        for fd in list(self._outgoing):
            self.on_writable(fd, now)

    def _read_stream(self, fd: int, now: float, *, startup: bool = False) -> None:
        while self.run.is_open(fd):
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.run.close_fd(fd)
                return
            if startup or self.phase == "starting":
                self._startup_output += chunk
                continue
            self._keep(fd, chunk, now)

    def _keep(self, fd: int, chunk: bytes, now: float) -> None:
        buffer, cap = self._streams[fd], self.limits.max_output_bytes
        room = cap - len(buffer)
        buffer += chunk[: max(room, 0)]
        if len(chunk) > room:
            # Over the cap. Also when it is read only after the process exited (a quick writer): flag it all the
            # same; a run still going is killed.
            self._truncated[fd] = True
            if self.phase in ("starting", "running"):
                self._end(now, kill=True)

    def _end(self, now: float, *, kill: bool) -> None:
        """Leave starting/running: stop the clock, end the run's processes, and drain the pipes."""
        if self.phase in ("starting", "running"):
            if self.phase == "starting" and self._start_error is None:
                self._start_error = "the sandboxed interpreter exited before it was ready"
            self._ended_at = now
            self.phase = "draining"
            self._deadline = now + _DRAIN_GRACE_S
            for fd in list(self._outgoing):
                self.run.close_fd(fd)
            self._outgoing.clear()
            self.run.stop(kill=kill)
        elif kill:
            self.run.stop(kill=True)

    def _maybe_finish(self) -> None:
        if self.phase == "draining" and self._exited and not self._streams_open():
            self._finish()

    def _finish(self) -> None:
        if self._start_error is not None:
            # Now: once the run is retired, its process (and what it printed) may be gone.
            self._startup_output += self.run.startup_output()
        exit_code = self.run.reap()
        self.phase = "done"
        if self._start_error is not None:
            return
        assert self._started_at is not None
        assert self._ended_at is not None
        out, err = self._streams[self.run.stdout_r], self._streams[self.run.stderr_r]
        self._result = ExecutionResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            exit_code=exit_code,
            timed_out=self._timed_out,
            stdout_truncated=self._truncated[self.run.stdout_r],
            stderr_truncated=self._truncated[self.run.stderr_r],
            duration_s=self._ended_at - self._started_at,
            isolation=self.run.config.mode,
        )


def drive(exchange: Exchange) -> None:
    """Run ``exchange`` to completion on this thread (poll(2) on its descriptors)."""
    try:
        exchange.start(time.monotonic())
        while not exchange.done:
            poller = select.poll()
            readers, writers = exchange.readers(), exchange.writers()
            for fd in readers:
                poller.register(fd, select.POLLIN)
            for fd in writers:
                poller.register(fd, select.POLLOUT)
            deadline = exchange.deadline()
            timeout_ms = None if deadline is None else max(0.0, (deadline - time.monotonic()) * 1000)
            events = poller.poll(timeout_ms)
            now = time.monotonic()
            for fd, _mask in events:
                # Any event (data, hang-up, error) means "try the operation"; the handlers tell them apart and
                # ignore descriptors an earlier event of this batch closed.
                if fd in readers:
                    exchange.on_readable(fd, now)
                elif fd in writers:
                    exchange.on_writable(fd, now)
            exchange.on_tick(now)
    finally:
        if not exchange.done:
            exchange.abort()


async def adrive(exchange: Exchange) -> None:
    """Run ``exchange`` to completion on the running event loop (its reader/writer callbacks).

    Cancellation kills the run and reaps its process before the CancelledError propagates.
    """
    loop = asyncio.get_running_loop()
    wakeup = asyncio.Event()
    watched_r: set[int] = set()
    watched_w: set[int] = set()

    def readable(fd: int) -> None:
        exchange.on_readable(fd, time.monotonic())
        wakeup.set()

    def writable(fd: int) -> None:
        exchange.on_writable(fd, time.monotonic())
        wakeup.set()

    def unwatch(fd: int) -> None:
        # The selector must forget a descriptor before it is closed: its number may be reused at once.
        if fd in watched_r:
            watched_r.discard(fd)
            loop.remove_reader(fd)
        if fd in watched_w:
            watched_w.discard(fd)
            loop.remove_writer(fd)

    def sync_watches() -> None:
        wanted_r, wanted_w = set(exchange.readers()), set(exchange.writers())
        for fd in watched_r - wanted_r:
            loop.remove_reader(fd)
        for fd in wanted_r - watched_r:
            loop.add_reader(fd, readable, fd)
        for fd in watched_w - wanted_w:
            loop.remove_writer(fd)
        for fd in wanted_w - watched_w:
            loop.add_writer(fd, writable, fd)
        watched_r.clear()
        watched_r.update(wanted_r)
        watched_w.clear()
        watched_w.update(wanted_w)

    exchange.run.before_close = unwatch
    try:
        exchange.start(time.monotonic())
        while not exchange.done:
            sync_watches()
            deadline = exchange.deadline()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), timeout)
            wakeup.clear()
            exchange.on_tick(time.monotonic())
    finally:
        for fd in [*watched_r, *watched_w]:
            unwatch(fd)
        if not exchange.done:
            exchange.abort()
        exchange.run.before_close = None
