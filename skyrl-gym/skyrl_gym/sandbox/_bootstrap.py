# The program every pooled interpreter runs. The library never imports this module: it reads its text and starts
# `python -c TEXT` with one more line appended, `_serve(_pristine, ...)` (see worker.bootstrap_source). Running
# as `-c` gives the snippet exactly what `python -c CODE` gives it: sys.argv == ['-c'], sys.path[0] == '' (the
# private temporary directory), and a `__main__` module whose namespace starts as the one captured on the next
# line, before any of this file's names existed.
#
# It deliberately has no module docstring: a docstring would become `__main__.__doc__`, which is None under
# `python -c`.
#
# Protocol (file descriptors are inherited, their numbers passed to _serve):
#   status_fd  the interpreter writes b"R" once it is ready (privileges dropped, modules preloaded), then closes it.
#   job_fd     the parent writes one job and closes its end: a header line of four integers
#              b"<memory_bytes> <cpu_seconds> <nproc> <fsize_bytes>\n" (-1: no limit) followed by the UTF-8
#              source of the snippet. EOF without a job means "the pool is closing": exit quietly.
# After the job the process exits the way `python -c` would; it never serves a second job.
_pristine = dict(globals())

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
) -> None:
    import os
    import resource
    import sys
    import types

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
    # Move everything that exists now out of the collector's view: the snippet's first collections and the
    # interpreter's shutdown then skip the start-up objects, which halves a short run's time. The snippet's
    # own objects are collected as usual.
    import gc

    gc.freeze()
    os.write(status_fd, b"R")
    os.close(status_fd)

    chunks = []
    while True:
        chunk = os.read(job_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(job_fd)
    if not chunks:
        return
    header, _, body = b"".join(chunks).partition(b"\n")
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
    source = body.decode("utf-8", "surrogatepass")
    del chunks, chunk, header, body, used, limits

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

    try:
        code = compile(source, "<string>", "exec", dont_inherit=True)
    except Exception as exc:
        # A compile error has no traceback under python -c: only the "File ..., line N" block and the message.
        report(exc, None)
        raise SystemExit(1) from None
    interrupted = False
    try:
        exec(code, namespace)
    except SystemExit:
        # Let the interpreter handle it at top level, exactly as python -c does (exit status, or message + 1).
        raise
    except BaseException as exc:
        # Drop this frame: the traceback starts at the snippet's <module>.
        report(exc, exc.__traceback__.tb_next if exc.__traceback__ is not None else None)
        interrupted = isinstance(exc, KeyboardInterrupt)
        del exc
    else:
        return
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
