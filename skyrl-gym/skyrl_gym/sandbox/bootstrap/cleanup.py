# Part of the sandbox bootstrap (see __init__.py): runs inside the sandboxed interpreter, in one namespace with the
# other parts.
#
# --- What a job leaves behind -----------------------------------------------------------------------------------------
# Signals to a job's processes, and the checks that restore a sandbox after a job: no process of the job alive, the
# private directories back to what they held before any job, no IPC object left.
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
