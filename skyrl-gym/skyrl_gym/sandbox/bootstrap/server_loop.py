# Part of the sandbox bootstrap (see __init__.py): runs inside the sandboxed interpreter, in one namespace with the
# other parts.
#
# --- Fork server ------------------------------------------------------------------------------------------------------
# Serves jobs on the control socket (protocol: see serve.py): forks each job's child ahead of the job, follows it
# until it exits, relays its exit status, then restores the sandbox (cleanup.py) before it reports ready again.
import types

TYPE_CHECKING = False  # the names below are the other parts' own, defined in the same text at run time
if TYPE_CHECKING:
    from skyrl_gym.sandbox.bootstrap.cleanup import (
        _SIGKILL,
        _empty,
        _ipc_objects,
        _kill_all_of,
        _kill_leftovers,
        _signal_group,
    )
    from skyrl_gym.sandbox.bootstrap.kernel import _remove_ipc_of, _unshare_ipc


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
