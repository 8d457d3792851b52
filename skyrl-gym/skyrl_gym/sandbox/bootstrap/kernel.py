# Part of the sandbox bootstrap (see __init__.py): runs inside the sandboxed interpreter, in one namespace with the
# other parts.
#
# --- Kernel calls without ctypes in sys.modules -----------------------------------------------------------------------
# no_new_privs, a private IPC namespace, and the removal of System V IPC objects a job's uid created.
import types

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
