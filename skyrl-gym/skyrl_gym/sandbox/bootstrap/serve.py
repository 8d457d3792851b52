# Part of the sandbox bootstrap, and the first (see __init__.py for how the parts become one program).
#
# The program every sandboxed interpreter runs. The library never imports it: it joins the text of the parts and
# starts `python -c TEXT` with one more line appended, `_run_job(_serve(_pristine, ...))` (see
# worker.bootstrap_source). Running as `-c` gives the snippet exactly what `python -c CODE` gives it: sys.argv ==
# ['-c'], sys.path[0] == '' (the private temporary directory), and a `__main__` module whose namespace starts as
# the one captured on the first line of code below, before any of the bootstrap's names existed.
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
#              source of the snippet (run) or the batch (see batch_parent.py). EOF without a job means "the pool is
#              closing": exit quietly.
#   After the job the process exits the way `python -c` would; it never serves a second job.
#
# Fork server (`server` is a tuple, see _fork_server in server_loop.py). The interpreter stays privileged and never
# runs a snippet itself. It forks a child ahead of each job; the child waits for the job on the control socket,
# becomes the job's private uid and runs the snippet exactly as above, then ends with _finish (finish.py: the
# interpreter's shutdown as the snippet sees it, without tearing down the modules the server loaded: that teardown
# would copy most of the server's memory into the child). Messages on the control socket (SOCK_SEQPACKET, one
# message each):
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

TYPE_CHECKING = False  # the names below are the other parts' own, defined in the same text at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

    from skyrl_gym.sandbox.bootstrap.batch_parent import _run_batch
    from skyrl_gym.sandbox.bootstrap.finish import _shutdown_functions
    from skyrl_gym.sandbox.bootstrap.kernel import _harden
    from skyrl_gym.sandbox.bootstrap.server_loop import _fork_server

    # Reports an exception as python -c does: the exception and the traceback to show (None: no traceback).
    Report = Callable[[BaseException, types.TracebackType | None], None]
    # A job ready to run (see _serve): the snippet's __main__, its source and code (None: compile the source),
    # report, exit_status and finish (see finish.py), whether the process ends with finish, and its done_fd.
    Job = tuple[
        types.ModuleType,
        str,
        types.CodeType | None,
        Report,
        Callable[[SystemExit], int],
        Callable[[int, bool, int], None],
        bool,
        int,
    ]

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


# The appended line is `_run_job(_serve(...))`: _serve gets ready and takes the job, _run_job runs it. So the
# snippet's <module> frame has two bootstrap frames below it (the file's <module>, _run_job), and all the steps
# use stays in their own locals, out of the snippet's namespace and sys.modules.
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
) -> "Job | None":
    """Get ready and take one job: what _run_job needs to run it, or None if the pool closes first.

    The arguments are described at the top of this file. A fork server returns only in a job's forked child, a
    batch only in each input's own forked process (see _run_batch).
    """
    import os

    kernel = _harden(no_new_privs, private_ipc, one_run=server is None)
    _drop_privileges(uid, gid)
    _warm_up(preload)
    # How deep a recursion gets from here, measured exactly as the parent measured it under python -c. This frame
    # is as deep in the stack as _run_job's, where the snippet runs (see _match_recursion_limit).
    probe: dict[str, int] = {}
    exec(RECURSION_PROBE, probe)
    probe_depth = probe["depth"]
    del probe
    # Forked processes end with _finish instead of the interpreter's own shutdown (see finish.py).
    finish, exit_status, keep_modules = _shutdown_functions()
    _freeze_start_up()
    # In a fork server, returns only in a job's forked child, which goes on below.
    job_fd, done_fd = _wait_for_job(job_fd, status_fd, server, kernel if private_ipc else None)
    job = _take_job(job_fd)
    if job is None:
        if server is not None:
            os._exit(0)
        return None
    kind, body = job
    del job
    main = _fresh_main(pristine)
    _match_recursion_limit(recursion_depth, probe_depth)
    report = _error_reporter()
    fast_exit, code = server is not None, None
    if kind == b"batch":
        # Returns only in each input's own forked process, with that input on its standard streams.
        sweep = uid >= 0 or server is not None
        source, code = _run_batch(body, main.__dict__, report, exit_status, keep_modules, sweep=sweep, done_fd=done_fd)
        fast_exit, done_fd = True, -1  # an input's process: its batch parent watches it
    else:
        source = body.decode("utf-8", "surrogatepass")
    return main, source, code, report, exit_status, finish, fast_exit, done_fd


def _run_job(job: "Job | None") -> None:
    """Run the job _serve took as python -c runs its code: same output, exit status and tracebacks.

    One interpreter per run returns, or raises SystemExit, as python -c's run ends; a forked process (a fork
    server's child, a batch's input: ``fast_exit``) ends with _finish instead, and never returns.
    """
    if job is None:
        return  # the pool is closing
    main, source, code, report, exit_status, finish, fast_exit, done_fd = job
    del job
    namespace = main.__dict__
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
    _exit_after_error(interrupted)


def _freeze_start_up() -> None:
    """Move everything that exists now out of the collector's view (``gc.freeze()``).

    The snippet's first collections and the interpreter's shutdown then skip the start-up objects, which halves a
    short run's time. The snippet's own objects are collected as usual. (In a fork server it also keeps the
    collector from writing to, and so copying, the pages each child shares with the server.)
    """
    import gc

    gc.freeze()


def _wait_for_job(
    job_fd: int,
    status_fd: int,
    server: tuple[int, bool, tuple[str, ...], bool] | None,
    kernel: types.SimpleNamespace | None,
) -> tuple[int, int]:
    """Report ready and return ``(job_fd, done_fd)`` once a job may come; done_fd -1: none.

    One interpreter per run writes b"R" on ``status_fd``; its job comes on ``job_fd``. A fork server serves jobs
    (_fork_server, with ``kernel`` for private IPC namespaces) and returns only in a job's forked child, with that
    job's pipe and the descriptor where the child reports its exit status after its last output (see _finish).
    """
    import os

    if server is not None:
        return _fork_server(*server, kernel)
    os.write(status_fd, b"R")
    os.close(status_fd)
    return job_fd, -1


def _drop_privileges(uid: int, gid: int) -> None:
    """Become the run's private unprivileged ``uid`` (-1: stay as started); before any module is imported.

    Started as root with only CAP_SETUID/CAP_SETGID (bwrap) or as root outright, the interpreter becomes that uid
    before anything else, so RLIMIT_NPROC applies and host files stay read-only.
    """
    import os

    if uid >= 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)


def _warm_up(preload: tuple[str, ...]) -> None:
    """Import the ``preload`` modules, and do now what a job's start would otherwise pay for."""
    for name in preload:
        __import__(name)
    # The first compile() of a process sets up the compiler's AST types (about 1.5 ms): do it before a job waits.
    # A batch's parent needs select and time: import them now rather than while its first input runs.
    compile("pass", "<string>", "exec", dont_inherit=True)
    import select  # noqa: F401
    import time  # noqa: F401


def _take_job(job_fd: int) -> tuple[bytes, bytes] | None:
    """Read the job to its end and apply its limits; ``(kind, body)``, or None if the pipe closed without a job."""
    import os

    chunks = []
    while True:
        chunk = os.read(job_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(job_fd)
    if not chunks:
        return None
    kind, _, job = b"".join(chunks).partition(b"\n")
    header, _, body = job.partition(b"\n")
    memory, cpu, nproc, fsize = (int(field) for field in header.split())
    _set_limits(memory, cpu, nproc, fsize)
    return kind, body


def _set_limits(memory: int, cpu: int, nproc: int, fsize: int) -> None:
    """Set the job's rlimits: address space and file size in bytes, CPU in seconds, processes; -1: no limit."""
    import resource

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


def _fresh_main(pristine: dict[str, object]) -> types.ModuleType:
    """A new ``__main__`` module whose namespace starts as ``pristine``; it takes the old one's place in sys.modules.

    Created after gc.freeze() so that the collector still sees the snippet's namespace (objects in a cycle through
    it, e.g. an instance whose class has __del__, are finalized at exit as under python -c). Same keys in the same
    order as python -c's.
    """
    import sys

    main = types.ModuleType("__main__")
    namespace = main.__dict__
    namespace.update(pristine)
    if "__annotations__" in namespace:
        namespace["__annotations__"] = {}
    sys.modules["__main__"] = main
    return main


def _match_recursion_limit(recursion_depth: int, probe_depth: int) -> None:
    """Raise the recursion limit so that RecursionError strikes as deep as under python -c.

    The bootstrap's frames (<module>, _run_job) sit below the snippet; python -c has none. ``probe_depth`` was
    measured as deep in the stack as the snippet runs (from _serve), ``recursion_depth`` under python -c: raising
    the limit by the difference makes the error, and its traceback, read the same.
    """
    import sys

    if recursion_depth > 0:
        sys.setrecursionlimit(sys.getrecursionlimit() + recursion_depth - probe_depth)


def _error_reporter() -> "Report":
    """What PyErr_Print does for ``python -c``: record sys.last_* and hand the exception to sys.excepthook.

    The function returned holds the sys module of now: the snippet cannot take it away.
    """
    import sys

    def report(exc: BaseException, tb: types.TracebackType | None) -> None:
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

    return report


def _exit_after_error(interrupted: bool) -> "NoReturn":
    """End a one-run interpreter whose snippet raised: exit status 1, or death by SIGINT as python -c does.

    After an unhandled KeyboardInterrupt (``interrupted``) python -c shuts down, then re-raises SIGINT on itself.
    Only the part of that shutdown a snippet can observe runs first: atexit handlers, flushing.

    Raises:
        SystemExit: Always (status 1), unless SIGINT ended the process first.
    """
    if interrupted:
        import atexit
        import os
        import signal
        import sys

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(1)
