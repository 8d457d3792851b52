# Part of the sandbox bootstrap (see __init__.py): runs inside the sandboxed interpreter, in one namespace with the
# other parts.
#
# --- Batches: one program, several standard inputs --------------------------------------------------------------------
# The job body is marshal data: (setup, source, stdins, timeout_s, output_cap, total_output_cap, stop_on_failure).
# The job's process (the batch parent) runs `setup` in the snippet's namespace once, compiles `source`, and forks
# one child per input, which runs the code like python -c with that input as its standard input. The parent
# collects each child's exit status and output (each stream capped; the child is killed at the cap or at its
# timeout), kills whatever the child left, and writes one record per input on its own stdout:
#   b"<exit_status> <timed_out> <stdout_truncated> <stderr_truncated> <duration_ns> <stdout_len> <stderr_len>\n"
#   followed by the stdout and stderr bytes.
# A setup that fails is reported as the first input's record (its output, exit status 1), and no input runs.
import types

TYPE_CHECKING = False  # the names below are the other parts' own, defined in the same text at run time
if TYPE_CHECKING:
    from skyrl_gym.sandbox.bootstrap.cleanup import _SIGKILL, _kill_leftovers, _signal_group


def _run_batch(
    body: bytes,
    namespace: dict[str, object],
    report: object,
    exit_status: object,
    keep_modules: object,
    *,
    sweep: bool,
    done_fd: int,
) -> tuple[str, types.CodeType | None]:
    """In the batch parent: run each input in a forked child; return ``(source, code)`` only in such a child.

    ``sweep``: the run has a uid of its own, so ``kill(-1)`` between inputs reaches exactly what an input left.
    ``done_fd``: where the batch parent reports its end (a fork server's child), or -1.
    """
    import marshal
    import os
    import time

    setup, source, stdins, timeout_s, output_cap, total_cap, stop_on_failure = marshal.loads(body)
    report_fd = os.dup(1)
    failed_setup = _batch_setup(setup, namespace, report, exit_status)
    if failed_setup is not None:
        _write_all(report_fd, failed_setup)
        _batch_end(report_fd, done_fd)
        os._exit(0)
    keep_modules()  # type: ignore[operator]
    try:
        code = compile(source, "<string>", "exec", dont_inherit=True)
    except Exception:
        code = None  # each input compiles it again and reports the error as python -c would
    # No gc.freeze() here, unlike in the server: it would freeze the snippet's namespace too, and cycles through
    # it (a class with __del__ defined by the code) would never be collected at exit.
    left = total_cap
    for data in stdins:
        cap = output_cap if left < 0 else min(output_cap, left)
        started = time.monotonic()
        streams = _batch_pipes()
        # What fits in the pipe now is there when the child starts reading: no round trip through this process.
        os.set_blocking(streams[1], False)
        try:
            prefilled = os.write(streams[1], data[: 1 << 16]) if data else 0
        except BlockingIOError:
            prefilled = 0
        pid = os.fork()
        if pid == 0:
            _batch_child(streams, (report_fd, done_fd))
            return source, code
        record, used, ok = _batch_collect(pid, streams, data[prefilled:], started, timeout_s, cap, sweep)
        _write_all(report_fd, record)
        if left >= 0:
            left = max(0, left - used)
        if stop_on_failure and not ok:
            break
    _batch_end(report_fd, done_fd)
    os._exit(0)


def _batch_setup(setup: str, namespace: dict[str, object], report: object, exit_status: object) -> bytes | None:
    """Run ``setup`` in ``namespace`` with its output captured: None if it succeeded, else the first input's record."""
    import contextlib
    import os
    import sys

    captured = [os.memfd_create("setup-stdout"), os.memfd_create("setup-stderr")]
    for target, fd in enumerate(captured, start=1):
        os.dup2(fd, target)  # the batch parent keeps these as its stdout and stderr; each input replaces them
    status = 0
    try:
        exec(compile(setup, "<setup>", "exec", dont_inherit=True), namespace)
    except SystemExit as exc:
        status = exit_status(exc)  # type: ignore[operator]
    except BaseException as exc:
        report(exc, exc.__traceback__.tb_next if exc.__traceback__ is not None else None)  # type: ignore[operator]
        status = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the output is discarded anyway
            stream.flush()
    out, err = (os.pread(fd, os.fstat(fd).st_size, 0) for fd in captured)
    for fd in captured:
        os.close(fd)
    if status == 0:
        return None
    return b"%d 0 0 0 0 %d %d\n" % (status, len(out), len(err)) + out + err


def _batch_end(report_fd: int, done_fd: int) -> None:
    """Before the batch parent exits: close its output (the records), report status 0 on ``done_fd`` if any."""
    import os

    for fd in (0, 1, 2, report_fd):
        os.close(fd)
    if done_fd >= 0:
        os.write(done_fd, b"E 0\n")


def _batch_pipes() -> tuple[int, int, int, int, int, int]:
    """``(stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w)`` for one input."""
    import os

    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    return stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w


def _batch_child(streams: tuple[int, int, int, int, int, int], parent_fds: tuple[int, int]) -> None:
    """In an input's forked child: lead a process group of its own, on the input's pipes as descriptors 0-2.

    The batch parent's report and done descriptors are closed first: an input must not write records or end the
    batch.
    """
    import os

    for fd in parent_fds:
        if fd >= 0:
            os.close(fd)
    os.setpgid(0, 0)
    stdin_r, _, _, stdout_w, _, stderr_w = streams
    for target, fd in enumerate((stdin_r, stdout_w, stderr_w)):
        os.dup2(fd, target)
    for fd in streams:
        os.close(fd)


def _batch_collect(
    pid: int,
    streams: tuple[int, int, int, int, int, int],
    data: bytes,
    started: float,
    timeout_s: float,
    cap: int,
    sweep: bool,
) -> tuple[bytes, int, bool]:
    """In the batch parent: feed and watch one input's child until it exits; ``(record, output bytes, ok)``.

    The child is SIGKILLed (its process group) when it passes ``timeout_s`` seconds or a stream passes ``cap``
    bytes; afterwards every process the input left is killed (``kill(-1)`` as the run's uid when ``sweep``).
    """
    import os
    import time

    stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = streams
    for fd in (stdin_r, stdout_w, stderr_w):
        os.close(fd)
    _signal_group(pid, 0)  # setpgid, as the child does too: whichever runs first, no killpg can miss the group
    pidfd = os.pidfd_open(pid)
    output = {stdout_r: bytearray(), stderr_r: bytearray()}
    truncated = {stdout_r: False, stderr_r: False}
    stdin_w, timed_out, killed = _batch_watch(pidfd, stdin_w, data, output, truncated, started + timeout_s, cap)
    duration_ns = int((time.monotonic() - started) * 1e9)
    _signal_group(pid, _SIGKILL)  # the child itself (timeout, output cap) and what it left in its group
    status = os.waitpid(pid, 0)[1]
    if sweep:
        _kill_leftovers(os.getuid(), in_namespace=False, own=True)  # daemons that left the group, too
    _batch_drain(output, truncated, cap)
    for fd in (stdin_w, pidfd):
        if fd >= 0:
            os.close(fd)
    exit_code = os.waitstatus_to_exitcode(status)
    out, err = output[stdout_r], output[stderr_r]
    flags = (int(timed_out), int(truncated[stdout_r]), int(truncated[stderr_r]))
    header = b"%d %d %d %d %d %d %d\n" % (exit_code, *flags, duration_ns, len(out), len(err))
    ok = exit_code == 0 and not timed_out and not killed
    return header + out + err, len(out) + len(err), ok


def _batch_watch(
    pidfd: int,
    stdin_w: int,
    data: bytes,
    output: dict[int, bytearray],
    truncated: dict[int, bool],
    deadline: float,
    cap: int,
) -> tuple[int, bool, bool]:
    """Feed ``data`` to the child's stdin and read its output until it exits, passes ``deadline`` or the ``cap``.

    Returns ``(stdin_w, timed_out, killed)``: the stdin pipe if still open (else -1; the caller closes it after
    the child is gone), whether the deadline passed, and whether a stream passed the cap. The child is not
    reaped: until then its pid, and so its group id, cannot be reused.
    """
    import os
    import select
    import time

    pending = memoryview(data)
    poller = select.poll()
    for fd in (pidfd, *output):
        poller.register(fd, select.POLLIN)
    if pending:
        poller.register(stdin_w, select.POLLOUT)  # non-blocking since _run_batch prefilled it
    else:
        os.close(stdin_w)
        stdin_w = -1
    exited = killed = False
    while not exited and not killed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return stdin_w, True, False
        for fd, _event in poller.poll(remaining * 1000):
            if fd == stdin_w:
                pending = _batch_feed(stdin_w, pending)
                if not pending:
                    poller.unregister(stdin_w)
                    os.close(stdin_w)
                    stdin_w = -1
            elif fd == pidfd:
                exited = True
            elif not _batch_read(fd, output, truncated, cap, poller):
                killed = True
    return stdin_w, False, killed


def _batch_feed(stdin_w: int, pending: memoryview) -> memoryview:
    """Write what the child's stdin pipe takes now of ``pending``; the rest (empty once the child stopped reading)."""
    import os

    try:
        return pending[os.write(stdin_w, pending[: 1 << 16]) :]
    except BlockingIOError:
        return pending
    except OSError:  # EPIPE: the child closed its stdin or exited
        return pending[:0]


def _batch_read(fd: int, output: dict[int, bytearray], truncated: dict[int, bool], cap: int, poller: object) -> bool:
    """Read what ``fd`` holds into ``output[fd]``, keeping at most ``cap`` bytes; False once it passed the cap."""
    import os

    chunk = os.read(fd, 1 << 16)
    if not chunk:
        poller.unregister(fd)  # type: ignore[attr-defined]
        return True
    buffer = output[fd]
    room = cap - len(buffer)
    buffer += chunk[: max(room, 0)]
    if len(chunk) > room:
        truncated[fd] = True
        return False
    return True


def _batch_drain(output: dict[int, bytearray], truncated: dict[int, bool], cap: int) -> None:
    """After the input's processes were killed: read the rest of its pipes (within the cap) and close them."""
    import os
    import select
    import time

    deadline = time.monotonic() + 1.0  # a pipe held by something we cannot kill is given up on
    for fd, buffer in output.items():
        os.set_blocking(fd, False)
        while time.monotonic() < deadline:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            room = cap - len(buffer)
            buffer += chunk[: max(room, 0)]
            truncated[fd] = truncated[fd] or len(chunk) > room
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    import os

    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
