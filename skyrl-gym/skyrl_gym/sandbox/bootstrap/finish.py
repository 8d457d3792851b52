# Part of the sandbox bootstrap (see __init__.py): runs inside the sandboxed interpreter, in one namespace with the
# other parts.
#
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
import types


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
