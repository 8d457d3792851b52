"""Isolation modes: which one this machine permits, what each guarantees, and the command that starts a worker.

Three modes, strongest first. :func:`isolation_mode` picks the strongest that works here (probed once per
process); ``SKYRL_SANDBOX_ISOLATION=bwrap|unshare|rlimits`` or ``CodeExecutor(isolation=...)`` asks for one.

``bwrap``
    The interpreter starts inside bubblewrap: new network, PID, IPC and UTS namespaces and a new mount namespace
    whose root is an empty read-only tmpfs holding read-only binds of ``/usr`` (and the ``/bin``, ``/lib*``
    links), a few files of ``/etc`` and the interpreter's own prefixes, a fresh ``/proc`` and minimal ``/dev``,
    and two private size-capped tmpfs mounts, ``/tmp`` (the working directory) and ``/dev/shm``. Nothing else
    of the host is visible, nothing of the host is writable, and when the interpreter exits or is killed every
    process it started dies with its PID namespace.
``unshare``
    ``unshare(1)`` gives the interpreter new network, IPC and UTS namespaces; it sees the host's files and
    processes. Its private temporary directory is a fresh host directory, removed after the run.
``rlimits``
    A plain child process in its own session, with the same private host directory. No namespaces, except an
    IPC namespace of each run's own where the kernel allows it (a root caller with ``CAP_SYS_ADMIN``).

In every mode: the interpreter is a separate process started with a clean environment and ``no_new_privs``
set (bwrap sets it itself; elsewhere the bootstrap does, before the snippet runs), so nothing the snippet execs
gains privileges from setuid bits or file capabilities; memory (address space), CPU time, file size and core
dumps are capped with rlimits; the run is killed (its whole process group) at the wall-clock timeout or when
an output stream exceeds its cap.

When auto-detection settles on a mode weaker than bwrap, :func:`detect_isolation_mode` logs one warning per
process saying why bwrap does not work, what is lost and how to get it; ``CodeExecutor.metrics()`` reports
the mode and whether it is such a fallback.

When the library runs as root (the usual case in containers) every mode also switches each run to a private
unprivileged uid/gid before the snippet runs (setgroups/setgid/setuid: a one-run interpreter at start, a fork
server's child before the snippet; the server itself stays root and never runs a snippet). That is what
makes RLIMIT_NPROC effective (the kernel never enforces it for uid 0), what makes host files owned by root
read-only to the snippet outside bwrap, and what lets the ``unshare`` and ``rlimits`` modes kill every process
the run left behind, even daemons that left the process group (``kill(-1, SIGKILL)`` as that uid). It also
lets them remove what the run wrote to the world-writable directories :data:`WORLD_WRITABLE_DIRS`, and, in
``rlimits`` mode without an IPC namespace of its own, the System V IPC objects it created (found by their
creator uid, which a snippet cannot change). As a non-root caller those guarantees are absent;
:func:`isolation_guarantees` lists what holds. (Under bwrap a fork server's namespaces serve its runs one after
another; the server restores them after each run, see :mod:`~skyrl_gym.sandbox.forkserver`.)
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable
from typing import Final, Literal, get_args

from skyrl_gym.sandbox.errors import SandboxUnavailableError

__all__ = [
    "GUARANTEES",
    "WORLD_WRITABLE_DIRS",
    "IsolationMode",
    "UidPool",
    "bwrap_command",
    "detect_isolation_mode",
    "isolation_guarantees",
    "isolation_mode",
    "mode_requested",
    "running_as_root",
    "uid_pool",
    "unshare_command",
]

IsolationMode = Literal["bwrap", "unshare", "rlimits"]
MODES: Final[tuple[IsolationMode, ...]] = get_args(IsolationMode)
ENV_VAR: Final = "SKYRL_SANDBOX_ISOLATION"

logger = logging.getLogger(__name__)

# What a guarantee name in isolation_guarantees() promises.
GUARANTEES: Final[dict[str, str]] = {
    "resource_limits": "memory (RLIMIT_AS), CPU time, file size and core dumps are capped per process",
    "wall_clock": "the run's process group is killed at its wall-clock timeout",
    "output_cap": "stdout and stderr are capped; a run that exceeds the cap is killed",
    "private_tmp": "the working directory is a fresh private directory that is gone after the run",
    "network": "no network: an empty network namespace with only a loopback of its own",
    "filesystem": "the host's files are invisible except system and interpreter directories, all read-only",
    "unprivileged": "the snippet runs as a private unprivileged uid, so root-owned host files are read-only",
    "process_limit": "max_processes (RLIMIT_NPROC) caps the processes and threads of the run",
    "escaped_processes": "every process the run started is killed when it ends, even ones that left its group",
    "no_new_privs": "nothing the snippet executes gains privileges (setuid bits and file capabilities are ignored)",
    "ipc": "System V IPC objects the run creates (shared memory, semaphores, queues) are gone when it ends",
}
_BASE: Final = frozenset({"resource_limits", "wall_clock", "output_cap", "private_tmp", "no_new_privs"})
_AS_ROOT: Final = frozenset({"unprivileged", "process_limit", "escaped_processes", "ipc"})
_BY_MODE: Final[dict[IsolationMode, frozenset[str]]] = {
    "bwrap": frozenset({"network", "filesystem", "escaped_processes", "ipc"}),
    "unshare": frozenset({"network", "ipc"}),
    "rlimits": frozenset(),
}
# How to make bwrap work, for the fallback warning.
_BWRAP_HELP: Final = (
    "To get bwrap: install bubblewrap (e.g. `apt-get install bubblewrap`) and let it create namespaces: as root "
    "that needs CAP_SYS_ADMIN, otherwise unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
    "user.max_user_namespaces > 0); in a Docker container, e.g. `--security-opt seccomp=unconfined --security-opt "
    "apparmor=unconfined` or `--cap-add SYS_ADMIN`. Set SKYRL_SANDBOX_ISOLATION to choose a mode explicitly (and "
    "silence this warning)."
)

# Directories any uid may write to. Outside bwrap a run can leave files there; they are removed after the run
# (top-level entries owned by the run's uid).
WORLD_WRITABLE_DIRS: Final = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

# Read-only binds inside bwrap besides /usr and the interpreter's prefixes. Each is optional.
_ETC_FILES: Final = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
)
_USR_LINKS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def running_as_root() -> bool:
    """Whether this process can switch the sandbox to a private uid (effective uid 0)."""
    return os.geteuid() == 0


def isolation_guarantees(mode: IsolationMode | None = None) -> frozenset[str]:
    """The guarantees (keys of :data:`GUARANTEES`) that hold for ``mode`` here; default: the detected mode."""
    mode = mode or isolation_mode()
    return _BASE | _BY_MODE[mode] | (_AS_ROOT if running_as_root() else frozenset())


_detect_lock = threading.Lock()


def isolation_mode() -> IsolationMode:
    """The mode new executors use by default: ``$SKYRL_SANDBOX_ISOLATION`` if set, else the strongest available.

    Raises:
        SandboxUnavailableError: The environment variable names an unknown mode or one this machine lacks.
    """
    requested = os.environ.get(ENV_VAR, "").strip()
    if not requested:
        return detect_isolation_mode()
    if requested not in MODES:
        raise SandboxUnavailableError(f"{ENV_VAR}={requested!r} is not one of {', '.join(MODES)}")
    return check_mode(requested)


def check_mode(mode: IsolationMode) -> IsolationMode:
    """Return ``mode`` if it works on this machine.

    Raises:
        SandboxUnavailableError: It does not; the message says why.
    """
    problem = _mode_problem(mode)
    if problem is not None:
        raise SandboxUnavailableError(f"isolation mode {mode!r} is unavailable: {problem}")
    return mode


def mode_requested() -> bool:
    """Whether ``$SKYRL_SANDBOX_ISOLATION`` names the mode, rather than auto-detection choosing it."""
    return bool(os.environ.get(ENV_VAR, "").strip())


def detect_isolation_mode() -> IsolationMode:
    """The strongest mode that works on this machine (probed once per process, a few milliseconds).

    A mode weaker than bwrap is logged as a warning, once per process: why bwrap cannot run, what is lost.
    """
    for mode in MODES:
        if _mode_problem(mode) is None:
            if mode != "bwrap":
                _warn_fallback(mode)
            return mode
    raise AssertionError("the rlimits mode is always available")  # pragma: no cover


_fallback_warned: set[IsolationMode] = set()


def _warn_fallback(mode: IsolationMode) -> None:
    with _detect_lock:
        if mode in _fallback_warned:
            return
        _fallback_warned.add(mode)
    lost = sorted(isolation_guarantees("bwrap") - isolation_guarantees(mode))
    logger.warning(
        "the code sandbox cannot use bwrap here (%s) and falls back to isolation mode %r, which loses: %s; and runs "
        "see the host's processes and files. %s",
        _mode_problem("bwrap"),
        mode,
        "; ".join(f"{name} ({GUARANTEES[name]})" for name in lost) or "nothing of what bwrap guarantees",
        _BWRAP_HELP,
    )


def _mode_problem(mode: IsolationMode) -> str | None:
    with _detect_lock:
        return _probe(mode)


@functools.cache
def _probe(mode: IsolationMode) -> str | None:
    """Why ``mode`` cannot run here, or None. Runs a trivial sandboxed command (cached)."""
    if mode == "rlimits":
        return None
    tool = shutil.which(mode)
    if tool is None:
        return f"`{mode}` is not installed"
    true = shutil.which("true") or "/bin/true"
    command = bwrap_command([true], ro_paths=(), tmpfs_bytes=1 << 20) if mode == "bwrap" else unshare_command([true])
    try:
        done = subprocess.run(command, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probe failed: {exc}"
    if done.returncode != 0:
        return f"probe exited with {done.returncode}: {done.stderr.decode(errors='replace').strip()}"
    return None


def bwrap_command(
    argv: list[str], *, ro_paths: Iterable[str], tmpfs_bytes: int, fork_server: bool = False
) -> list[str]:
    """The bubblewrap command line that runs ``argv`` (see the module docstring for the resulting view).

    Args:
        argv: The command to run inside, e.g. ``[python, "-c", source]``.
        ro_paths: Host directories to make visible read-only at the same path (the interpreter's prefixes).
        tmpfs_bytes: Size cap of each private tmpfs (``/tmp`` and ``/dev/shm``), in bytes.
        fork_server: ``argv`` is a fork server (see :mod:`~skyrl_gym.sandbox.forkserver`), which restores the
            sandbox between jobs: it keeps the capabilities to kill and delete whatever a job left, and gets a
            ``/dev/mqueue`` to check that no POSIX message queue is left.
    """
    command = [
        "bwrap",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
    ]
    if running_as_root():
        # Without a user namespace the sandbox starts as uid 0 with every capability dropped; the bootstrap needs
        # these two to switch to its private uid, after which it holds none.
        command += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if fork_server:
            # The server stays root between jobs; each job's child drops every capability with its uid switch.
            command += ["--cap-add", "CAP_KILL", "--cap-add", "CAP_DAC_OVERRIDE", "--cap-add", "CAP_FOWNER"]
    command += ["--ro-bind", "/usr", "/usr"]
    for link in _USR_LINKS:
        if os.path.islink(link):
            command += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            command += ["--ro-bind", link, link]
    # The private mounts first, so that an interpreter living under /tmp stays visible through its bind.
    size = str(tmpfs_bytes)
    command += ["--proc", "/proc", "--dev", "/dev"]
    command += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
    command += ["--size", size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    if fork_server:
        command += ["--mqueue", "/dev/mqueue"]
    binds = sorted(_outermost(p for p in ro_paths if not _is_within(p, "/usr")))
    command += _parent_dirs([*binds, *_ETC_FILES])
    for path in _ETC_FILES:
        command += ["--ro-bind-try", path, path]
    for path in binds:
        command += ["--ro-bind", path, path]
    command += ["--remount-ro", "/", "--chdir", "/tmp", "--", *argv]
    return command


def unshare_command(argv: list[str]) -> list[str]:
    """The ``unshare(1)`` command line that runs ``argv`` in new network, IPC and UTS namespaces.

    ``unshare`` execs ``argv`` in place (no ``--fork``), so the child's exit status is the interpreter's own.
    """
    command = ["unshare", "--net", "--ipc", "--uts"]
    if not running_as_root():
        command += ["--user", "--map-current-user"]
    return [*command, "--", *argv]


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _outermost(paths: Iterable[str]) -> set[str]:
    """Drop paths inside another of the paths: binding the outer one already shows them."""
    unique = {os.path.normpath(p) for p in paths if os.path.isdir(p)}
    return {p for p in unique if not any(q != p and _is_within(p, q) for q in unique)}


def _parent_dirs(paths: Iterable[str]) -> list[str]:
    """``--dir`` arguments creating each missing ancestor with mode 0755.

    bwrap would create them itself, but copies the mode of the host directory: an ancestor such as ``/root``
    (0700) would hide the bind below it from the unprivileged uid.
    """
    ancestors: set[str] = set()
    for path in paths:
        parent = os.path.dirname(os.path.normpath(path))
        while parent not in ("/", ""):
            ancestors.add(parent)
            parent = os.path.dirname(parent)
    args: list[str] = []
    for directory in sorted(ancestors):
        if not _is_within(directory, "/usr"):
            args += ["--perms", "0755", "--dir", directory]
    return args


class UidPool:
    """Hands out private uids for sandboxed runs, one per live worker, never two live workers the same.

    The range is derived from this process's pid so that executors in different processes on one machine do not
    share uids (a uid shared with another sandbox would share its RLIMIT_NPROC count and its end-of-run kill).
    uids are handed out round-robin, so a uid is reused as late as possible after its processes died.
    The range: ``BASE + (pid % 2**20) * SPAN`` ... ``+ SPAN - 1``, which stays below 2**31. (Two live processes
    share a range only if their pids differ by a multiple of 2**20, possible where pid_max exceeds that.)
    """

    BASE: Final = 1 << 20
    SPAN: Final = 1 << 10
    _PID_MODULUS: Final = 1 << 20

    def __init__(self, pid: int | None = None) -> None:
        self._first = self.BASE + ((os.getpid() if pid is None else pid) % self._PID_MODULUS) * self.SPAN
        self._next = 0
        self._in_use: set[int] = set()
        self._lock = threading.Lock()

    def acquire(self) -> int:
        """A uid no other live worker of this process holds (also used as its gid).

        Raises:
            SandboxUnavailableError: All ``SPAN`` uids are in use.
        """
        with self._lock:
            for _ in range(self.SPAN):
                uid = self._first + self._next
                self._next = (self._next + 1) % self.SPAN
                if uid not in self._in_use:
                    self._in_use.add(uid)
                    return uid
        raise SandboxUnavailableError(f"all {self.SPAN} sandbox uids of this process are in use")

    def release(self, uid: int) -> None:
        """Give ``uid`` back once no process of it is left."""
        with self._lock:
            self._in_use.discard(uid)

    def __contains__(self, uid: object) -> bool:
        with self._lock:
            return uid in self._in_use

    @property
    def uids(self) -> range:
        """Every uid this pool can hand out."""
        return range(self._first, self._first + self.SPAN)


_uid_pools: dict[int, UidPool] = {}
_uid_pools_lock = threading.Lock()


def uid_pool() -> UidPool:
    """The uid pool of this process (a forked child gets its own, from its own pid's range)."""
    pid = os.getpid()
    with _uid_pools_lock:
        pool = _uid_pools.get(pid)
        if pool is None:
            pool = _uid_pools[pid] = UidPool(pid)
        return pool
