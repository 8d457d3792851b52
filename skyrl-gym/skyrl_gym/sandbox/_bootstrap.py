# The program every sandboxed interpreter runs. The library never imports this module: it reads its text and starts
# `python -c TEXT` with one more line appended, `_serve(_pristine, ...)` (see worker.bootstrap_source). Running
# as `-c` gives the snippet exactly what `python -c CODE` gives it: sys.argv == ['-c'], sys.path[0] == '' (the
# private temporary directory), and a `__main__` module whose namespace starts as the one captured on the next
# line, before any of this file's names existed.
#
# It deliberately has no module docstring: a docstring would become `__main__.__doc__`, which is None under
# `python -c`.
#
# Two ways to serve, chosen by the library:
#
# One interpreter per run (`server` is None). File descriptors are inherited, their numbers passed to _serve:
#   status_fd  the interpreter writes b"R" once it is ready (privileges dropped, modules preloaded), then closes it.
#   job_fd     the parent writes one job and closes its end: its kind, b"run\n" or b"batch\n"; a header line of
#              four integers b"<memory_bytes> <cpu_seconds> <nproc> <fsize_bytes>\n" (-1: no limit); then the UTF-8
#              source of the snippet (run) or the batch (see _run_batch). EOF without a job means "the pool is
#              closing": exit quietly.
#   After the job the process exits the way `python -c` would; it never serves a second job.
#
# Fork server (`server` is a tuple, see _fork_server). The interpreter stays privileged and never runs a snippet
# itself. It forks a child ahead of each job; the child waits for the job on the control socket, becomes the job's
# private uid and runs the snippet exactly as above, then ends with _finish (the interpreter's shutdown as the
# snippet sees it, without tearing down the modules the server loaded: that teardown would copy most of the
# server's memory into the child). Messages on the control socket (SOCK_SEQPACKET, one message each):
#   server -> library  b"R" ready for a job (a child waits for it); b"S" the child took the job (sent by the
#                      child); b"X <status>" the child's exit status (negative: killed by that signal), as soon as
#                      the child reported it after its last output and the kernel shows the child exiting (see
#                      _watch_job), else once it was reaped. After that the server kills every process the job left
#                      and restores its sandbox, then sends b"R" again; if the sandbox cannot be restored, it exits
#                      instead.
#   library -> server  b"<uid>\n<workdir>\n<timeout_s>" with four descriptors (SCM_RIGHTS): the job pipe (read
#                      end, carrying the job as above), and the child's stdin, stdout and stderr. uid -1: keep the
#                      server's uid; workdir empty: keep the server's working directory. An empty message: exit.
#
# Outside bwrap (`no_new_privs`) the interpreter sets no_new_privs before anything else; bwrap has set it already.
# In rlimits mode as root (`private_ipc`) each run gets an IPC namespace of its own where the kernel allows it
# (CAP_SYS_ADMIN): a one-run interpreter at start, a fork server's child right after its fork. Where it does not, a
# fork server removes the System V objects the job's uid created from the host's namespace before it reports ready
# again (the library does the same after one-run interpreters and killed jobs).
_pristine = dict(globals())

import types  # noqa: E402 -- after the snapshot above; the interpreter has imported it already

# Recurses until RecursionError; `depth` is how many calls fit. The parent runs the same text under python -c
# (interpreter.inspect_interpreter) and passes that depth to _serve.
RECURSION_PROBE = """
def f(n):
    try:
        return f(n + 1)
    except RecursionError:
        return n
depth = f(1)
"""


# One function on purpose: all it uses stays in its locals, out of the snippet's namespace and sys.modules.
def _serve(
    pristine: dict[str, object],
    uid: int,
    gid: int,
    preload: tuple[str, ...],
    job_fd: int,
    status_fd: int,
    recursion_depth: int,
    server: tuple[int, bool, tuple[str, ...], bool] | None = None,
    no_new_privs: bool = False,
    private_ipc: bool = False,
) -> None:
    import os
    import resource
    import sys
    import types

    kernel = _harden(no_new_privs, private_ipc, one_run=server is None)
    if uid >= 0:
        # Started as root with only CAP_SETUID/CAP_SETGID (bwrap) or as root outright: become the run's private
        # unprivileged uid before anything else, so RLIMIT_NPROC applies and host files stay read-only.
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    for name in preload:
        __import__(name)
    # How deep a recursion gets when run from here, measured exactly as the parent measured it under python -c.
    probe: dict[str, int] = {}
    exec(RECURSION_PROBE, probe)
    probe_depth = probe["depth"]
    del probe
    # The first compile() of a process sets up the compiler's AST types (about 1.5 ms): do it before a job waits.
    # A batch's parent needs select and time: import them now rather than while its first input runs.
    compile("pass", "<string>", "exec", dont_inherit=True)
    import select  # noqa: F401
    import time  # noqa: F401

    # Forked processes (a fork server's children, a batch's inputs) end with _finish instead of the interpreter's
    # own shutdown (see below).
    finish, exit_status, keep_modules = _shutdown_functions()
    fast_exit = server is not None
    # Move everything that exists now out of the collector's view: the snippet's first collections and the
    # interpreter's shutdown then skip the start-up objects, which halves a short run's time. The snippet's
    # own objects are collected as usual. (In a fork server it also keeps the collector from writing to, and so
    # copying, the pages each child shares with the server.)
    import gc

    gc.freeze()
    done_fd = -1  # a fork server's child reports its exit status here, after its last output (see _finish)
    if server is None:
        os.write(status_fd, b"R")
        os.close(status_fd)
    else:
        # Returns only in a job's forked child, which goes on below.
        job_fd, done_fd = _fork_server(*server, kernel if private_ipc else None)

    chunks = []
    while True:
        chunk = os.read(job_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(job_fd)
    if not chunks:
        if fast_exit:
            os._exit(0)
        return
    kind, _, job = b"".join(chunks).partition(b"\n")
    header, _, body = job.partition(b"\n")
    memory, cpu, nproc, fsize = (int(field) for field in header.split())

    used = resource.getrusage(resource.RUSAGE_SELF)
    if cpu >= 0:
        # RLIMIT_CPU counts from process start: add what start-up already used. SIGXCPU at the soft limit, SIGKILL
        # one second later if the snippet ignores it.
        cpu += int(used.ru_utime + used.ru_stime) + 1
    limits = (
        (resource.RLIMIT_AS, memory, memory),
        (resource.RLIMIT_CPU, cpu, cpu + 1 if cpu >= 0 else cpu),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_FSIZE, fsize, fsize),
        (resource.RLIMIT_CORE, 0, 0),
    )
    for which, soft, hard in limits:
        if soft >= 0:  # -1 means "no limit from us": keep the inherited one (raising it may not be allowed)
            resource.setrlimit(which, (soft, hard))
    del chunks, chunk, job, header, used, limits

    # A new __main__ module, created after gc.freeze() so that the collector still sees the snippet's namespace
    # (objects in a cycle through it, e.g. an instance whose class has __del__, are finalized at exit as under
    # python -c). Same keys in the same order; it takes the old module's place in sys.modules.
    main = types.ModuleType("__main__")
    namespace = main.__dict__
    namespace.update(pristine)
    if "__annotations__" in namespace:
        namespace["__annotations__"] = {}
    sys.modules["__main__"] = main
    # This frame and the file's <module> frame sit below the snippet; python -c has none. Raise the limit by the
    # difference so RecursionError strikes at the same depth and its traceback reads the same.
    if recursion_depth > 0:
        sys.setrecursionlimit(sys.getrecursionlimit() + recursion_depth - probe_depth)

    def report(exc: BaseException, tb: types.TracebackType | None) -> None:
        # What PyErr_Print does for `python -c`: record sys.last_* and hand the exception to sys.excepthook.
        exc.__traceback__ = tb
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        hook = getattr(sys, "excepthook", sys.__excepthook__)
        try:
            hook(type(exc), exc, tb)
        except BaseException as hook_error:  # a broken user hook: CPython falls back to the default display
            print("Error in sys.excepthook:", file=sys.stderr)
            sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
            print("\nOriginal exception was:", file=sys.stderr)
            sys.__excepthook__(type(exc), exc, tb)

    code = None
    if kind == b"batch":
        # Returns only in each input's own forked process, with that input on its standard streams.
        source, code = _run_batch(
            body, namespace, report, exit_status, keep_modules, sweep=uid >= 0 or server is not None, done_fd=done_fd
        )
        fast_exit = True
        done_fd = -1  # an input's process: its batch parent watches it
    else:
        source = body.decode("utf-8", "surrogatepass")
    del body

    status = 1
    interrupted = False
    try:
        if code is None:
            code = compile(source, "<string>", "exec", dont_inherit=True)
    except Exception as exc:
        # A compile error has no traceback under python -c: only the "File ..., line N" block and the message.
        report(exc, None)
        if not fast_exit:
            raise SystemExit(1) from None
        del exc
    else:
        try:
            exec(code, namespace)
        except SystemExit as exc:
            if not fast_exit:
                # Let the interpreter handle it at top level, exactly as python -c does (exit status, or message + 1).
                raise
            status = exit_status(exc)
            del exc
        except BaseException as exc:
            # Drop this frame: the traceback starts at the snippet's <module>.
            report(exc, exc.__traceback__.tb_next if exc.__traceback__ is not None else None)
            interrupted = isinstance(exc, KeyboardInterrupt)
            del exc
        else:
            status = 0
            if not fast_exit:
                return
        del code
    if fast_exit:
        # Only sys.modules may keep the snippet's namespace alive now, as at the end of python -c.
        del main, namespace, source, report
        finish(status, interrupted, done_fd)
    if interrupted:
        # After an unhandled KeyboardInterrupt python -c shuts down, then re-raises SIGINT on itself. Run the
        # part of the shutdown a snippet can observe (atexit handlers, flushing), then do the same.
        import atexit
        import signal

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(1)


# --- Kernel calls without ctypes in sys.modules -----------------------------------------------------------------------
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWIPC = 0x08000000
_IPC_RMID = 0
_SHM_DEST = 0o1000  # in a segment's mode: removed, destroyed once its last process detaches


def _harden(no_new_privs: bool, private_ipc: bool, *, one_run: bool) -> types.SimpleNamespace | None:
    """At start, before the uid switch: set no_new_privs, and (``private_ipc``) try a private IPC namespace.

    A one-run interpreter moves into its IPC namespace now; a fork server gives one to each child instead.
    Returns the kernel calls (see _kernel_calls) if either was asked for, else None.

    Raises:
        OSError: no_new_privs could not be set (the interpreter must then not serve).
    """
    if not (no_new_privs or private_ipc):
        return None
    kernel = _kernel_calls()
    if no_new_privs and kernel.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(kernel.errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if private_ipc and one_run:
        _unshare_ipc(kernel)
    return kernel


def _kernel_calls() -> types.SimpleNamespace:
    """The C library's prctl, unshare, shmctl, semctl and msgctl, bound through _ctypes; sys.modules stays as it was.

    ctypes itself would take ≈1.5 ms and leave five modules a fresh ``python -c`` does not have; _ctypes is
    dropped from sys.modules again, so a snippet that imports ctypes gets it as in a fresh interpreter.
    """
    import sys
    import types

    loaded = "_ctypes" in sys.modules
    import _ctypes

    class Int(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "i"

    class ULong(_ctypes._SimpleCData):  # type: ignore[type-arg]
        _type_ = "L"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    class Libc:
        _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]  # NULL: the program and its libraries

    def bind(name: str, *argtypes: type) -> object:
        function = Function((name, Libc()))  # type: ignore[arg-type]  # anything with a _handle will do
        function.argtypes = argtypes
        return function

    calls = types.SimpleNamespace(
        prctl=bind("prctl", Int, ULong, ULong, ULong, ULong),
        unshare=bind("unshare", Int),
        shmctl=bind("shmctl", Int, Int, ULong),  # the buffer: NULL
        semctl=bind("semctl", Int, Int, Int),
        msgctl=bind("msgctl", Int, Int, ULong),
        errno=_ctypes.get_errno,
    )
    if not loaded:
        del sys.modules["_ctypes"]
    return calls


def _unshare_ipc(kernel: types.SimpleNamespace) -> bool:
    """Move this process into a new IPC namespace (it dies with the last process in it); False if not allowed."""
    return kernel.unshare(_CLONE_NEWIPC) == 0  # type: ignore[no-any-return]


def _remove_ipc_of(uid: int, kernel: types.SimpleNamespace) -> bool:
    """Remove the System V IPC objects of this IPC namespace that ``uid`` created; False if some are still there.

    Run after the job's processes are gone: a removed shared memory segment is destroyed once nothing has it
    attached. The creator uid (``cuid``) is the one thing about an object its owner cannot change. The removal
    runs as ``uid``, in a short-lived child: root may remove other users' objects only with CAP_SYS_ADMIN, which a
    root caller that gets rlimits mode usually lacks.
    """
    import os

    kinds = ("shm", "sem", "msg")
    found = {kind: _ipc_ids(kind, uid) for kind in kinds}
    if not any(found.values()):
        return True  # the common case, decided with three reads
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for ident in found["shm"]:
                kernel.shmctl(ident, _IPC_RMID, 0)
            for ident in found["sem"]:
                kernel.semctl(ident, 0, _IPC_RMID)
            for ident in found["msg"]:
                kernel.msgctl(ident, _IPC_RMID, 0)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return not any(_ipc_ids(kind, uid) for kind in kinds)


def _ipc_ids(kind: str, uid: int) -> list[int]:
    """The ids of the live System V objects of ``kind`` (``shm``, ``sem``, ``msg``) that ``uid`` created."""
    import os

    try:
        fd = os.open("/proc/sysvipc/" + kind, os.O_RDONLY)
    except FileNotFoundError:
        return []  # a kernel without System V IPC
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    header, *rows = (line.split() for line in b"".join(chunks).splitlines())
    cuid, mode = header.index(b"cuid"), header.index(b"perms")
    return [int(row[1]) for row in rows if int(row[cuid]) == uid and not int(row[mode], 8) & _SHM_DEST]


# --- Batches: one program, several standard inputs --------------------------------------------------------------------
# The job body is marshal data: (setup, source, stdins, timeout_s, output_cap, total_output_cap, stop_on_failure).
# The job's process (the batch parent) runs `setup` in the snippet's namespace once, compiles `source`, and forks
# one child per input, which runs the code like python -c with that input as its standard input. The parent
# collects each child's exit status and output (each stream capped; the child is killed at the cap or at its
# timeout), kills whatever the child left, and writes one record per input on its own stdout:
#   b"<exit_status> <timed_out> <stdout_truncated> <stderr_truncated> <duration_ns> <stdout_len> <stderr_len>\n"
#   followed by the stdout and stderr bytes.
# A setup that fails is reported as the first input's record (its output, exit status 1), and no input runs.


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
    import select
    import time

    stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = streams
    for fd in (stdin_r, stdout_w, stderr_w):
        os.close(fd)
    _signal_group(pid, 0)  # setpgid, as the child does too: whichever runs first, no killpg can miss the group
    pidfd = os.pidfd_open(pid)
    output = {stdout_r: bytearray(), stderr_r: bytearray()}
    truncated = {stdout_r: False, stderr_r: False}
    pending = memoryview(data)
    poller = select.poll()
    for fd in (pidfd, stdout_r, stderr_r):
        poller.register(fd, select.POLLIN)
    if pending:
        poller.register(stdin_w, select.POLLOUT)  # non-blocking since _run_batch prefilled it
    else:
        os.close(stdin_w)
        stdin_w = -1
    exited = timed_out = killed = False
    deadline = started + timeout_s
    while not exited and not killed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _event in poller.poll(remaining * 1000):
            if fd == stdin_w:
                try:
                    pending = pending[os.write(stdin_w, pending[: 1 << 16]) :]
                except BlockingIOError:
                    continue
                except OSError:  # EPIPE: the child closed its stdin or exited
                    pending = pending[:0]
                if not pending:
                    poller.unregister(stdin_w)
                    os.close(stdin_w)
                    stdin_w = -1
            elif fd == pidfd:
                exited = True  # not reaped yet: until then its pid, and so its group id, cannot be reused
            elif not _batch_read(fd, output, truncated, cap, poller):
                killed = True
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


_SIGKILL = 9  # the same on every Linux architecture; the signal module is not imported for it


def _signal_group(pid: int, signal: int) -> None:
    """``killpg(pid, signal)`` (``kill(-1, signal)`` for pid -1; ``setpgid(pid, pid)`` for signal 0); no errors."""
    import os

    try:
        if signal == 0:
            os.setpgid(pid, pid)
        elif pid == -1:
            os.kill(-1, signal)
        else:
            os.killpg(pid, signal)
    except OSError:
        pass


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


# --- Fork server ---------------------------------------------------------------------------------------------------


def _fork_server(
    control_fd: int,
    in_namespace: bool,
    tidy_dirs: tuple[str, ...],
    check_ipc: bool,
    kernel: types.SimpleNamespace | None,
) -> tuple[int, int]:
    """Serve jobs on ``control_fd`` until the library hangs up; return only in a job's forked child.

    The server forks each job's child before the job arrives (a fork costs a good part of a short job), so a job
    starts in an already forked process. It returns ``(job_fd, done_fd)``: the job pipe, and where the child
    reports its exit status.

    ``in_namespace``: the server is alone in its own PID namespace (bwrap), so after a job every process but the
    namespace's init and the server is a leftover of that job. ``tidy_dirs``: directories private to this server
    that a job may write to, emptied after each job. ``check_ipc``: the IPC namespace is private to this server, and
    must hold no System V or POSIX IPC object after a job. ``kernel`` (rlimits mode: the IPC namespace is the
    host's): give each child an IPC namespace of its own where allowed, and remove the System V objects each job's
    uid created in the host's namespace.
    """
    import _socket
    import os
    import sys

    control = _socket.socket(fileno=control_fd)
    # What the directories hold before any job: bwrap creates root-owned mount points there for bind mounts of
    # paths under them (an interpreter living under /tmp); those stay, everything a job adds goes.
    baseline = {directory: frozenset(os.listdir(directory)) for directory in tidy_dirs}
    try:
        while True:
            done_r, done_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(done_r)
                if kernel is not None:
                    _unshare_ipc(kernel)  # now, while the child is still root and before its job waits
                return _await_job(control, done_w), done_w
            os.close(done_w)
            control.send(b"R")
            uid = _watch_job(pid, done_r, control, in_namespace)
            restored = _kill_leftovers(uid, in_namespace) and _empty(baseline)
            restored = restored and not (check_ipc and _ipc_objects())
            if not (restored and (kernel is None or _remove_ipc_of(uid, kernel))):
                os._exit(0)  # the sandbox could not be restored: never serve again (the pool replaces us)
    except BaseException:
        # A broken server (or a child whose set-up failed) must never serve on: report on stderr and exit.
        sys.excepthook(*sys.exc_info())
        os._exit(70)


def _await_job(control: object, done_w: int) -> int:
    """In a forked child waiting for a job: take it, tell the server its uid and timeout; return the job pipe."""
    import _socket
    import os
    import sys

    _rehearse()
    message, ancillary, _flags, _address = control.recvmsg(1 << 16, _socket.CMSG_SPACE(4 * 4))  # type: ignore[attr-defined]
    if not message:
        os._exit(0)  # the library closes its pool (the server exits when it sees us go without a job)
    fds = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, len(data) - 3, 4)]
    uid_text, workdir, timeout_text = message.decode().split("\n")
    uid = int(uid_text)
    if len(fds) != 4:
        raise RuntimeError(f"expected 4 descriptors with a job, got {len(fds)}")
    # Written before the snippet runs, so the server can trust this line (and only this one).
    os.write(done_w, b"J %d %d\n" % (uid, int(float(timeout_text) * 1000)))
    control.send(b"S")  # type: ignore[attr-defined]
    control.close()  # type: ignore[attr-defined]
    return _enter_job(fds, uid, workdir)


def _rehearse() -> None:
    """While a forked child waits for its job: do, on throwaway objects, what every job does.

    The child shares its memory with the server copy-on-write, and the first write to each shared page copies it
    (a page fault). A job's set-up, a short snippet and _finish write to much the same pages every time (the
    allocator's pools, the collector's lists, common objects' reference counts): touching them now takes about
    half of those faults, and a third of a short job's time, off the job's path. Nothing observable changes: the
    objects are gone again, and no module is imported or registered.
    """
    import gc
    import sys
    import types

    module = types.ModuleType("__main__")
    exec(compile("x = [str(6 * 7)]", "<string>", "exec", dont_inherit=True), module.__dict__)
    del module
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # the server's own streams, empty: nothing is written
    gc.collect()


def _watch_job(pid: int, done_r: int, control: object, in_namespace: bool) -> int:
    """In the server: follow a forked child until it exits, relaying its exit status as ``b"X <status>"``.

    Returns the uid of the child's job; exits the server if the child ended without a job (the library closed the
    pool, or the child's set-up failed). The status is relayed as soon as the child reports it on ``done_r`` (after
    its last output, see _finish), so the library does not wait for the kernel to tear the child down; a child
    that ends without a report (killed, or it closed the pipe) is relayed when reaped. The pipe is open while the
    snippet runs, so the snippet can write a report too: one is believed only if the kernel then shows the child
    exiting (see _exiting), which the snippet cannot fake without ending for good. Any other report, or anything
    malformed, makes the server ignore the pipe and relay the status it reaps.
    """
    import os
    import select
    import time

    os.set_blocking(done_r, False)
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(done_r, select.POLLIN)
    uid: int | None = None
    timeout_s = 0.0
    reported = listening = False
    watching = True  # done_r is registered with the poller
    deadline: float | None = None  # after a report: when a child still alive is killed
    try:
        while True:
            wait = None if deadline is None else max(0.0, (deadline - time.monotonic()) * 1000)
            events = poller.poll(wait)
            if not events:
                _kill_job(uid if uid is not None else -1, in_namespace)
                deadline = None
                continue
            # Read the pipe before looking at the child's exit: a quick child reports and exits before we wake.
            lines = _done_lines(done_r) if watching else None
            if watching and lines is None:  # end of the pipe, or we stopped listening
                poller.unregister(done_r)
                watching = False
            for line in lines or ():
                fields = line.split()
                if uid is None and len(fields) == 3 and fields[0] == b"J":
                    uid, timeout_s, listening = int(fields[1]), int(fields[2]) / 1000, True
                    deadline_at = time.monotonic() + timeout_s + 1.0
                elif listening and not reported and _exit_report(fields) and _exiting(pid, pidfd):
                    control.send(b"X %s" % fields[1])  # type: ignore[attr-defined]
                    reported, deadline = True, deadline_at
                else:
                    listening = watching = False  # anything else is the snippet's doing: ignore the pipe
            if any(fd == pidfd for fd, _mask in events):
                break
    finally:
        os.close(pidfd)
        os.close(done_r)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if uid is None:
        os._exit(0 if status == 0 else 70)
    if not reported:
        control.send(b"X %d" % status)  # type: ignore[attr-defined]
    return uid


def _done_lines(done_r: int) -> list[bytes] | None:
    """The complete lines a child's done pipe holds now (the child writes two), or None at its end.

    A line is written at once and is far shorter than the pipe's atomic write size, so it never arrives in parts;
    anything that does not end in a newline is not ours and is dropped.
    """
    import os

    data = b""
    while len(data) < 4096:
        try:
            chunk = os.read(done_r, 4096)
        except BlockingIOError:
            break
        if not chunk:
            return None if not data else data.split(b"\n")[:-1]
        data += chunk
    return data.split(b"\n")[:-1]


def _exit_report(fields: list[bytes]) -> bool:
    """Whether a line of a child's done pipe, split, is an exit report ``E <status 0-255>``."""
    if len(fields) != 2 or fields[0] != b"E":
        return False
    status = fields[1]
    return status.isdigit() and len(status) <= 3 and int(status) < 256


_PF_EXITING = 0x4  # a thread's kernel flag (field 9 of /proc/<pid>/task/<tid>/stat), set as it starts to exit
_EXIT_GRACE_S = 0.05  # how long a report may run ahead of the child's exit before it counts as false


def _exiting(pid: int, pidfd: int) -> bool:
    """Whether the child ``pid`` is on its way out: every thread of it has PF_EXITING set, or it exited.

    The kernel sets that flag as a thread starts to exit, before it tears down the memory (the slow part of an
    exit, which a report lets the library skip waiting for); no process can set it otherwise. The child reports
    just before it exits, so the flag may lag the report by a moment (the child may not have the CPU yet): it is
    looked at again after short sleeps, for up to ``_EXIT_GRACE_S``. False: the report came from a process that is
    still running.
    """
    import select
    import time

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    deadline = time.monotonic() + _EXIT_GRACE_S
    delay = 0.00002
    while not (_all_threads_exiting(pid) or poller.poll(0)):
        if time.monotonic() > deadline:
            return False
        # Sleep rather than yield: a yield would hand the CPU to the child's teardown, which is what we skip.
        time.sleep(delay)
        delay = min(delay * 2, 0.002)
    return True


def _all_threads_exiting(pid: int) -> bool:
    """Whether every thread of ``pid`` (a child not yet reaped) has PF_EXITING set."""
    import os

    fields = _stat_fields(f"/proc/{pid}/stat")
    if fields is None or not int(fields[6]) & _PF_EXITING:
        return False
    if int(fields[17]) == 1:  # num_threads: the common case, one read decides
        return True
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
        if fields is not None and not int(fields[6]) & _PF_EXITING:  # None: that thread is gone
            return False
    return True


def _stat_fields(path: str) -> list[bytes] | None:
    """The fields of a ``/proc`` stat file after the command name (the state first), or None if it is gone."""
    import os

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).rpartition(b")")[2].split()
    finally:
        os.close(fd)


def _kill_job(uid: int, in_namespace: bool) -> None:
    """SIGKILL a job's processes: all but init and the server in our PID namespace, else every process of ``uid``."""
    if in_namespace:
        _signal_group(-1, _SIGKILL)
    elif uid >= 0:
        _kill_all_of(uid)


def _enter_job(fds: list[int], uid: int, workdir: str) -> int:
    """In a job's forked child: take the job's streams, working directory and uid; return the job pipe."""
    import os
    import sys

    os.setsid()
    job_fd, *streams = fds
    for target, fd in enumerate(streams):  # every received descriptor is >= 3: 0-2 are the server's own
        os.dup2(fd, target)
        os.close(fd)
    if workdir:
        os.chdir(workdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        # A fresh interpreter seeds numpy's global generator at import; every child of a server would otherwise
        # share the server's seed. (The standard library's random reseeds itself after a fork.)
        numpy_random.seed()
    return job_fd


def _kill_leftovers(uid: int, in_namespace: bool, own: bool = False) -> bool:
    """SIGKILL every process the job left, until none is alive (zombies aside); False if some survive 5 s.

    ``own``: the caller runs as ``uid`` itself (a batch's parent), so ``kill(-1)`` reaches exactly the others.
    """
    import os
    import time

    if in_namespace or own:
        try:
            os.kill(-1, _SIGKILL)  # as in the loop below; ESRCH when there was no process at all to signal
        except ProcessLookupError:
            return True  # the common case, decided without a look at /proc
    deadline = time.monotonic() + 5.0
    delay = 0.0002
    while _leftover(uid, in_namespace):
        if time.monotonic() > deadline:
            return False
        if in_namespace or own:
            # In our own PID namespace (with CAP_KILL): every process but its init and this server. As the uid:
            # every other process of the uid. Either way kill(-1) spares its caller.
            _signal_group(-1, _SIGKILL)
        else:
            _kill_all_of(uid)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def _leftover(uid: int, in_namespace: bool) -> bool:
    """Whether a live process of the job exists: any but init and this server in our PID namespace, else of ``uid``."""
    import os

    mine = (str(os.getpid()), "1") if in_namespace else (str(os.getpid()),)
    for name in os.listdir("/proc"):
        if not name.isdigit() or name in mine:
            continue
        try:
            if not in_namespace and os.stat("/proc/" + name).st_uid != uid:
                continue
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                state = os.read(fd, 4096).rpartition(b")")[2].split()[0]
            finally:
                os.close(fd)
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state != b"Z":
            return True
    return False


def _kill_all_of(uid: int) -> None:
    """``kill(-1, SIGKILL)`` as ``uid`` from a short-lived child: every process of that uid dies, atomically."""
    import os

    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, 9)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _empty(baseline: dict[str, frozenset[str]]) -> bool:
    """Remove everything inside each directory but its ``baseline`` entries; False if something stayed."""
    import os

    try:
        for directory, keep in baseline.items():
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for name in os.listdir(fd):
                    if name not in keep:
                        _remove(name, fd)
                if set(os.listdir(fd)) - keep:
                    return False
            finally:
                os.close(fd)
    except (OSError, RecursionError):
        return False
    return True


def _remove(name: str, dir_fd: int) -> None:
    """Remove ``name`` in ``dir_fd`` and, for a directory, all inside it; never follows a symbolic link."""
    import os

    if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode & 0o170000 != 0o040000:
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        for entry in os.listdir(fd):
            _remove(entry, fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _ipc_objects() -> bool:
    """Whether the IPC namespace holds a System V object or (where mounted) a POSIX message queue."""
    import os

    for kind in ("shm", "sem", "msg"):
        fd = os.open("/proc/sysvipc/" + kind, os.O_RDONLY)
        try:
            if os.read(fd, 1 << 16).count(b"\n") > 1:  # more than the header line
                return True
        finally:
            os.close(fd)
    return os.path.isdir("/dev/mqueue") and bool(os.listdir("/dev/mqueue"))


# --- The end of a run in a forked process -----------------------------------------------------------------------------
# CPython's own shutdown (Py_FinalizeEx) clears every module's namespace and frees the interpreter's objects. In a
# forked child that writes to nearly every page shared with its parent, which costs milliseconds of copying for
# nothing: the child's memory is discarded anyway. _finish does, in the same order, the part of that shutdown a
# snippet can observe, on what the snippet created: wait for its non-daemon threads, run atexit handlers, flush
# the standard streams, clear sys's special attributes, drop the snippet's modules (and __main__) from
# sys.modules, restore the builtins, collect garbage and clear the namespaces of the modules the snippet imported;
# then it exits at once. So destructors and weakref callbacks of the snippet's objects run as in python -c, except
# for objects it attached to modules that were imported before it started (preloaded, or by a batch's setup):
# those modules stay in sys.modules and are never cleared, so such objects stay alive, and an import of such a
# module from a destructor at exit still succeeds.
#
# These functions run with private globals (see _shutdown_functions): a snippet that replaced builtins, sys.modules
# or functions of os cannot break its own shutdown.


def _shutdown_functions() -> tuple[types.FunctionType, types.FunctionType, types.FunctionType]:
    """``(finish, exit_status, keep_modules)``: those functions bound to what the interpreter has now.

    Call before any job. ``keep_modules()`` adds the modules imported since (by a batch's setup) to those _finish
    leaves alone.
    """
    import _signal  # type: ignore[import-not-found]  # signal's C half, loaded at start-up; signal would add enum
    import _weakref
    import atexit
    import builtins
    import gc
    import os
    import sys

    # CPython restores the builtins it had before `site` added its helpers.
    site_names = ("exit", "quit", "copyright", "credits", "license", "help")
    original = {name: value for name, value in vars(builtins).items() if name not in site_names}
    captured = types.SimpleNamespace(
        sys=sys,
        modules=sys.modules,
        builtins=vars(builtins),
        original_builtins=original,
        builtins_size=len(vars(builtins)) + ("_" not in vars(builtins)),
        server_modules=frozenset(id(module) for module in sys.modules.values()),
        # Keeps those modules alive: an id stays theirs only as long as they live (the bootstrap's __main__ is
        # replaced by each run's, which could otherwise be allocated at the same address).
        server_module_refs=tuple(sys.modules.values()),
        hook_args=_unraisable_hook_args_type(),
        module_type=types.ModuleType,
        weakref=_weakref.ref,
        collect=gc.collect,
        run_exitfuncs=atexit._run_exitfuncs,
        exit=os._exit,
        write=os.write,
        closerange=os.closerange,
        kill=os.kill,
        getpid=os.getpid,
        setpriority=os.setpriority,
        signal=_signal.signal,
        sigint=_signal.SIGINT,
        sig_dfl=_signal.SIG_DFL,
    )
    scope: dict[str, object] = {"__builtins__": dict(original), "_S": captured}
    functions = (
        _finish,
        _report_exit,
        _exit_status,
        _keep_modules,
        _snippet_modules,
        _flush_std_files,
        _report_unraisable,
        _clear_module_dict,
    )
    for function in functions:
        scope[function.__name__] = types.FunctionType(function.__code__, scope, function.__name__)
    return scope["_finish"], scope["_exit_status"], scope["_keep_modules"]  # type: ignore[return-value]


def _unraisable_hook_args_type() -> type:
    """The type of sys.unraisablehook's argument (not exposed by name): the default hook accepts no other."""
    import sys

    seen: list[object] = []
    hook = sys.unraisablehook
    sys.unraisablehook = seen.append

    class _Probe:
        def __del__(self) -> None:
            raise RuntimeError

    try:
        _Probe()
    finally:
        sys.unraisablehook = hook
    args_type = type(seen[0])
    # The argument's traceback reaches this frame, and this frame's `seen` the argument: a cycle that holds this
    # module's globals. Left to the collector, it kept a snippet's cyclic garbage from being finalized at exit
    # (no __del__ ran) in an interpreter that shuts down for real. Break it now.
    seen.clear()
    return args_type


_S = types.SimpleNamespace()  # replaced, in the private scope, by what _shutdown_functions captured


def _exit_status(exc: SystemExit) -> int:
    """The exit status CPython derives from an uncaught SystemExit, printing a non-integer code as it does."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(1 << 63) <= code < 1 << 63 else 0xFF  # a C long, then exit(); overflow gives -1
    stderr = getattr(_S.sys, "stderr", None)
    try:
        if stderr is not None:
            stderr.write(str(code))
            stderr.write("\n")
        else:
            _S.write(2, str(code).encode(errors="backslashreplace") + b"\n")
    except Exception:
        pass  # as CPython does: a message that cannot be printed is dropped
    return 1


def _keep_modules() -> None:
    """Count every module imported so far (but the snippet's __main__) as one the runs started from."""
    modules = _S.modules
    _S.server_module_refs = tuple(modules[name] for name in modules if name != "__main__")
    _S.server_modules = frozenset(id(module) for module in _S.server_module_refs)


def _finish(status: int, interrupted: bool, done_fd: int = -1) -> None:
    """End the child as the interpreter's shutdown would, as far as the snippet can tell; never returns.

    ``done_fd`` (>= 0 in a fork server's child): after the last output, close the standard streams and report the
    exit status there, so the library has the whole result before the kernel has torn this process down.
    """
    try:
        sys, modules, builtins = _S.sys, _S.modules, _S.builtins
        threading = modules.get("threading")
        if threading is not None:
            try:
                threading._shutdown()
            except BaseException as exc:
                _report_unraisable(exc, threading)
            del threading
        _S.run_exitfuncs()
        failed = _flush_std_files()
        builtins["_"] = None
        for name in ("path", "argv", "ps1", "ps2", "last_type", "last_value", "last_traceback"):
            setattr(sys, name, None)
        for name in ("path_hooks", "path_importer_cache", "meta_path", "__interactivehook__"):
            setattr(sys, name, None)
        for name in ("stdin", "stdout", "stderr"):
            setattr(sys, name, vars(sys).get(f"__{name}__"))
        alive = []
        for name in _snippet_modules():
            module = modules.get(name)
            if isinstance(module, _S.module_type):
                alive.append((name, _S.weakref(module)))
            module = None
            modules.pop(name, None)  # a destructor may have removed it already
        if len(builtins) != _S.builtins_size:
            # Only when the snippet added or removed builtins: rewriting them all would copy their pages.
            builtins.clear()
            builtins.update(_S.original_builtins)
        _S.collect()
        cleared = False
        for _name, ref in reversed(alive):
            module = ref()
            if module is not None and module.__dict__ is not builtins and module.__dict__ is not vars(sys):
                _clear_module_dict(module.__dict__)
                cleared = True
            module = None
        if cleared:
            _S.collect()
        if _flush_std_files() or failed:
            status = 120
        if interrupted:
            _S.signal(_S.sigint, _S.sig_dfl)
            _S.kill(_S.getpid(), _S.sigint)
            status = 130
    finally:
        if done_fd >= 0 and not interrupted:
            _report_exit(status, done_fd)
        _S.exit(status)


def _report_exit(status: int, done_fd: int) -> None:
    """Close the standard streams, lower this process's priority, then write ``E <status>`` on ``done_fd``.

    The library sees the streams end; nice 10 is for the teardown; the report is the last thing before the exit,
    which the server waits to see (_exiting).
    """
    try:
        _S.closerange(0, 3)  # ignores descriptors the snippet closed already
        # What is left is the kernel tearing this process down: let the next job and the library go first (on 2
        # cores back-to-back runs took ≈10% less time). Lowering one's own priority needs no privilege.
        _S.setpriority(0, 0, 10)
        _S.write(done_fd, b"E %d\n" % (status & 0xFF))
    except BaseException:
        pass  # the server then reports the status it reaps


def _snippet_modules() -> list[str]:
    """The names in sys.modules of modules the runs did not start with, __main__ first, then in import order.

    Only the newest entries are looked at (sys.modules keeps insertion order; a module the snippet imported is
    added at the end): reading an entry writes to the module's reference count, which would copy its page.
    """
    modules, server_modules = _S.modules, _S.server_modules
    names = []
    for name in reversed(modules):
        if id(modules[name]) in server_modules:
            break
        names.append(name)
    names.reverse()
    if "__main__" in modules and id(modules["__main__"]) not in server_modules and "__main__" not in names:
        names.insert(0, "__main__")
    return names


def _report_unraisable(exc: BaseException, obj: object) -> None:
    """Report ``exc`` as CPython's PyErr_WriteUnraisable(obj) does, through sys.unraisablehook."""
    sys = _S.sys
    args = _S.hook_args((type(exc), exc, exc.__traceback__, None, obj))
    hook = getattr(sys, "unraisablehook", None)
    try:
        (hook if hook is not None else sys.__unraisablehook__)(args)
    except BaseException as hook_error:
        sys.__unraisablehook__(_S.hook_args((type(hook_error), hook_error, hook_error.__traceback__, None, hook)))


def _flush_std_files() -> bool:
    """Flush sys.stdout then sys.stderr as interpreter exit does; True if either failed (exit status 120)."""
    failed = False
    for name in ("stdout", "stderr"):
        stream = getattr(_S.sys, name, None)
        if stream is None:
            continue
        try:
            closed = bool(stream.closed)
        except BaseException:
            closed = False
        if closed:
            continue
        try:
            stream.flush()
        except BaseException as exc:
            if name == "stdout":  # CPython reports a failure of stdout only
                _report_unraisable(exc, stream)
            failed = True
    return failed


def _clear_module_dict(namespace: dict[str, object]) -> None:
    """CPython's _PyModule_ClearDict: set names with one leading underscore to None, then all but __builtins__."""
    for key in list(namespace):
        if isinstance(key, str) and key[:1] == "_" and key[1:2] != "_" and namespace[key] is not None:
            namespace[key] = None
    for key in list(namespace):
        if isinstance(key, str) and key != "__builtins__" and namespace[key] is not None:
            namespace[key] = None
