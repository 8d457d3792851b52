r"""The command runner: a small server inside each sandbox that runs the host's commands and file operations.

:class:`~skyrl_agent.sandbox.shell.PersistentShell` sends this file's source to ``python3 -I -S`` inside the
sandbox (``-I -S``: nothing in the sandbox, such as a ``select.py`` in the working directory or a site package,
can shadow a module the runner imports). It needs python ≥ 3.8 with the C module ``_ctypes`` (for ``prctl``) and
bash ≥ 4.1. It uses the standard library only, and only modules that import quickly: it starts in images we
do not control.

Protocol, over the runner's stdin/stdout (numbers in decimal ASCII, one request at a time)::

    hello  ->  "skyrl-runner ready PID…\\n"           (the other pids visible when the runner started)
    run    <-  "run TOKEN TIMEOUT_MS LEN_WORKDIR LEN_COMMAND\\n" WORKDIR COMMAND
    read   <-  "read TOKEN LEN_PATH\\n" PATH
    write  <-  "write TOKEN MODE LEN_PATH LEN_DATA\\n" PATH DATA
    reply  ->  "TOKEN CODE TIMED_OUT TRUNCATED LEN\\n" BODY

``TOKEN`` is a random word the host chooses afresh for each request; the reply repeats it. ``CODE`` is the
command's exit status (128+N when killed by signal N) or, for a file operation, an errno (0: done). ``BODY`` is the
command's output (at most the cap) or the file's bytes (at most :data:`MAX_FILE_BYTES`; a larger file is EFBIG).

Commands cannot reach the runner or its channel to the host:

* The runner makes itself non-dumpable (``PR_SET_DUMPABLE`` 0) as soon as it runs, before it says it is ready:
  its ``/proc/PID/fd``, ``/proc/PID/mem`` and ptrace then need ``CAP_SYS_PTRACE``, which commands (the same user,
  no capabilities) lack. They can neither write into its stdout nor read its stdin or memory (a request's token).
* Another process may hold the same channel (in Docker, docker-init, PID 1, holds the container's stdout, on which
  the first runner answers), and a command may write there. The host refuses whatever is not a reply carrying the
  request's token, unread (:mod:`.shell`); a command cannot learn a token: the runner reads each request whole
  before the command starts, and only the runner and the host know it.
* The shell runs in a session of its own and each command in a process group of its own, apart from the runner's.
* Every reply is bounded (the output cap, :data:`MAX_FILE_BYTES`); files are opened non-blocking, so that a FIFO a
  command left behind cannot wedge a ``read`` or ``write``.

How a command runs:

* A long-lived ``bash`` (the shell, :data:`SHELL`) forks one subshell per command: a fork of an initialised bash
  costs a fraction of starting one, and no other process starts per command. The shell has an empty
  environment and job control on, so each subshell gets a process group of its own, stdin from ``/dev/null``
  and stdout and stderr on the output pipe. The subshell restores the shell state (exported variables, working
  directory) from the state file, sources the command (the runner wrote it to a memfd), and saves the state with
  builtins only (so that saving works even when a fork bomb has exhausted the pids limit). On a status pipe the
  subshell reports its pid as it starts, and the shell, which waits for it as a foreground job, its exit status.
* The runner reads the output, keeps ``cap`` bytes and discards the rest, so a flood never reaches the host.
  At the timeout it sends SIGTERM to the subshell's process group, and SIGKILL ``KILL_AFTER_S`` later.
* When the subshell has exited, the runner SIGKILLs its process group, then every other leftover of the command,
  until none is left: background jobs, ``setsid`` daemons, a fork bomb that exhausted the pids limit. In a
  sandbox with a PID namespace of its own (Docker, bwrap) a leftover is any process that was not there when the
  runner started (PID 1, a dead-man process) and is not the shell. In a shared namespace (a host process) the
  runner is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so that whatever a command starts stays its
  descendant, and leftovers are its descendants. When the command left nothing, one listing of ``/proc`` shows it.
* A command that kills the shell (``kill $$``: ``$$`` is the shell's pid) ends there; the next one gets a new shell.
"""

from __future__ import annotations

import errno
import os
import select
import sys
import time

# Start-up time matters (a runner starts with every sandbox, and python alone takes ~10 ms here): in a CPU-limited
# container ``signal`` (it imports ``enum``), ``contextlib`` and ``typing`` each cost 10–30 ms, ``ctypes`` 7 ms;
# the C modules ``_signal`` and ``_ctypes`` (0.4 ms) cost next to nothing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from typing import BinaryIO
else:
    import _signal

KILL_AFTER_S = 2.0  # SIGKILL follows SIGTERM this long after a command's timeout
MAX_FILE_BYTES = 64 << 20  # the largest file a `read` returns (larger: EFBIG), so that every reply is bounded
NAME = b"skyrl-runner"  # the process name (comm), so that `pkill python` in a command leaves the runner alone
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_SIGKILL, _SIGTERM = 9, 15

# The shell. $1: the state file; $2, $3, $4: the fds of the control pipe (it reads "WORKDIR\0" per command), the
# status pipe and the output pipe; $5: the fd of the memfd holding the command. The subshell runs as a foreground
# job: bash 5.2 can lose a background job's record before `wait` sees it, and `wait -f` then spins forever
# ("wait_for: No record of process"). A foreground job has no `$!`, so the subshell reports its own pid.
SHELL = r"""
set -m
__skyrl_state=$1 __skyrl_ctl=$2 __skyrl_status=$3 __skyrl_out=$4 __skyrl_cmd=$5
set --
while IFS= read -r -d '' -u "$__skyrl_ctl" __skyrl_wd; do
  (
    set +m
    printf 'p%d\n' "$BASHPID" >&"$__skyrl_status"
    exec {__skyrl_ctl}<&- {__skyrl_status}>&- {__skyrl_out}>&-
    [ -r "$__skyrl_state" ] && . "$__skyrl_state"
    __skyrl_home=$PWD
    if [ -n "$__skyrl_wd" ]; then cd -- "$__skyrl_wd" || exit 1; else __skyrl_home=; fi
    . "/dev/fd/$__skyrl_cmd"
    __skyrl_rc=$?
    # Builtins only from here: saving must work even when no process can be forked (pids limit reached).
    # Overwritten in place (<>), not truncated: truncating a written file makes ext4 flush it (auto_da_alloc),
    # which cost more than the rest of a command. `return` ends the sourcing before any longer tail.
    printf -v __skyrl_cd 'cd -- %q' "${__skyrl_home:-$PWD}"
    { export -p; printf '%s\nreturn\n' "$__skyrl_cd"; } 1<> "$__skyrl_state"
    exit $__skyrl_rc
  ) < /dev/null >&"$__skyrl_out" 2>&1
  printf 's%d\n' "$?" >&"$__skyrl_status"
done
"""


class Shell:
    """The long-lived bash that forks a subshell per command, and the runner's ends of its pipes."""

    def __init__(self, state_path: str, output_fd: int) -> None:
        self.command_fd = os.memfd_create("skyrl-command")  # the subshells source it
        control_r, self.control_fd = os.pipe()
        self.status_fd, status_w = os.pipe()
        os.set_blocking(self.status_fd, False)
        inherited = (control_r, status_w, output_fd, self.command_fd)
        for fd in inherited:
            os.set_inheritable(fd, True)
        try:
            self.pid = os.posix_spawnp(
                "bash",
                ["bash", "--noprofile", "--norc", "-c", SHELL, "skyrl", state_path, *map(str, inherited)],
                {},  # the environment comes from the state file, in each subshell
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),  # job notices
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                ],
                setsid=True,
                setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),  # python ignores both; commands expect the default
            )
        except OSError:
            self.close()
            raise
        finally:
            os.close(control_r)
            os.close(status_w)
            os.set_inheritable(output_fd, False)
        os.set_inheritable(self.command_fd, False)
        self.pending = b""  # status pipe bytes not yet parsed

    def send(self, command: bytes, workdir: bytes) -> None:
        """Hand ``command`` to the shell (it forks a subshell for it at once)."""
        os.ftruncate(self.command_fd, 0)
        os.pwrite(self.command_fd, command, 0)
        with Ignoring(BrokenPipeError):  # the shell is dead: its exit is noticed by the caller
            write_all(self.control_fd, workdir + b"\0")

    def status(self) -> tuple[bytes, int] | None:
        """The next complete report on the status pipe, if any.

        ``(b"p", pid)`` comes from the subshell as it starts, then ``(b"s", exit status)`` from the shell when the
        subshell has ended.
        """
        with Ignoring(BlockingIOError):
            self.pending += os.read(self.status_fd, 4096)
        line, newline, rest = self.pending.partition(b"\n")
        if not newline:
            return None
        self.pending = rest
        return line[:1], int(line[1:])

    def close(self) -> None:
        """Close the runner's ends; the shell, if alive, sees end of file on its control pipe and exits."""
        for fd in (self.command_fd, self.control_fd, self.status_fd):
            with Ignoring(OSError):
                os.close(fd)


class Output:
    """A command's output: the first ``cap`` bytes are kept, the rest is read and dropped."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.kept = bytearray()
        self.truncated = False

    def read(self) -> bool:
        """Read what the pipe holds; False when it was empty."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return False
        room = self.cap - len(self.kept)
        self.truncated = self.truncated or len(chunk) > room
        self.kept += chunk[: max(room, 0)]
        return bool(chunk)


class Runner:
    """Serves the host's requests; see the module docstring."""

    def __init__(self, state_path: str, cap: int, initial_state: bytes, own_namespace: bool) -> None:
        self.state_path, self.cap, self.initial_state = state_path, cap, initial_state
        self.own_namespace = own_namespace
        # SIGCHLD writes to this pipe (the self-pipe trick), so that ``poll`` sees at once a shell that died.
        self.wake_fd, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
        _signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        # One output pipe for all commands: the shell keeps its write end open, so the end of a command is its
        # status, not the end of the pipe. Whatever is left in it is read before the next command.
        self.output_fd, self.output_w = os.pipe()
        os.set_blocking(self.output_fd, False)  # the read end only: commands write to a blocking pipe
        self.known = pids()  # what runs besides commands: PID 1, a dead-man process, the runner; the host's too
        self.shell: Shell | None = None
        self.reaped: dict[int, int] = {}  # exit statuses collected by ``collect`` and not yet claimed

    def serve(self, stdin: BinaryIO) -> None:
        """Answer requests until the host closes ``stdin``."""
        with Ignoring(OSError):  # started now, while the host reads the hello; else when the first command comes
            self.ready_shell()
        while True:
            line = stdin.readline()
            if not line:
                return
            op, token, *numbers = line.split()
            args = [int(n) for n in numbers]
            if op == b"run":
                timeout_ms, workdir_len, command_len = args
                workdir, command = stdin.read(workdir_len), stdin.read(command_len)
                send(token, *self.run(command, workdir, timeout_ms / 1000))
            elif op == b"read":
                send(token, *read_file(stdin.read(args[0])))
            elif op == b"write":
                mode, path_len, data_len = args
                path, data = stdin.read(path_len), stdin.read(data_len)
                send(token, *write_file(path, data, mode))
            else:
                raise ValueError(f"unknown request {line!r}")

    def ready_shell(self) -> Shell:
        """The shell, started anew if there is none or it died (a command may `kill $$` or `pkill bash`)."""
        self.collect()
        if self.shell is not None and self.shell.pid in self.reaped:
            del self.reaped[self.shell.pid]
            self.shell.close()
            self.shell = None
        if self.shell is None:
            if not os.path.exists(self.state_path):  # deleted by a command: start over from the initial state
                write_state(self.state_path, self.initial_state)
            self.shell = Shell(self.state_path, self.output_w)
        return self.shell

    def run(self, command: bytes, workdir: bytes, timeout_s: float) -> tuple[int, int, int, bytes]:
        """Run ``command`` in a subshell; the reply fields (exit code, timed out, truncated, output)."""
        try:
            shell = self.ready_shell()
        except OSError as exc:
            return 126, 0, 0, b"skyrl-runner: could not start bash (%s)\n" % str(exc).encode()
        deadline = time.monotonic() + timeout_s
        shell.send(command, workdir)
        output = Output(self.output_fd, self.cap)
        code, group, timed_out = self.wait(shell, output, deadline)
        self.kill_leftovers(group)
        while output.read():  # what the command wrote before it ended, now that no writer is left
            pass
        return code, int(timed_out), int(output.truncated), bytes(output.kept)

    def wait(self, shell: Shell, output: Output, deadline: float) -> tuple[int, int | None, bool]:
        """Read output until the subshell's status comes; its process group gets killed at the deadline.

        Returns the exit code, the subshell's pid (its process group; None if it never started) and whether the
        deadline passed.
        """
        poller = select.poll()
        for fd in (output.fd, shell.status_fd, self.wake_fd):
            poller.register(fd, select.POLLIN)
        group, signal, timed_out = None, _SIGTERM, False
        while True:
            report = shell.status()
            while report is not None:
                kind, number = report
                if kind == b"s":
                    return number, group, timed_out
                group, report = number, shell.status()
            self.collect()
            if shell.pid in self.reaped:  # the command killed the shell: its status is the command's
                status = self.reaped[shell.pid]
                return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status), group, False
            now = time.monotonic()
            if now >= deadline and group is not None:
                timed_out = True
                with GONE:
                    os.killpg(group, signal)
                deadline = now + KILL_AFTER_S if signal == _SIGTERM else float("inf")
                signal = _SIGKILL
            timeout_ms = -1 if deadline == float("inf") else max(0, int((deadline - now) * 1000) + 1)
            for fd, _ in poller.poll(timeout_ms):
                if fd == output.fd:
                    output.read()
                elif fd == self.wake_fd:
                    with GONE:
                        os.read(self.wake_fd, 4096)

    def collect(self) -> None:
        """Reap every exited child without blocking: shells, and orphans of commands when a subreaper."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reaped[pid] = status

    def kill_leftovers(self, group: int | None) -> None:
        """SIGKILL what the command left (its process group, then the rest) until nothing is left.

        "The rest" is every process not known from the start, in a PID namespace of the sandbox's own; in a
        shared one, the runner's descendants. Either way the shell is spared. Listing ``/proc`` tells at once
        whether anything is left; only then are processes looked at one by one.
        """
        if group is not None:
            with GONE:
                os.killpg(group, _SIGKILL)  # usually everything, in one call
        shell = self.shell.pid if self.shell else -1
        expected = self.known | {shell}
        while True:
            self.collect()
            if pids() <= expected:
                break
            if self.own_namespace:
                left = [pid for pid, (_, state) in processes().items() if pid not in expected and state != b"Z"]
            else:
                left = [pid for pid in descendants(os.getpid()) if pid not in expected]
            if not left:
                break
            kill(left, self.known)
            expected |= self.known
            time.sleep(0.001)  # let them die
        self.reaped = {pid: status for pid, status in self.reaped.items() if pid == shell}  # a dead shell


def kill(victims: list[int], spared: set[int]) -> None:
    """SIGKILL ``victims``; one this user may not signal is not a command's: it joins ``spared``."""
    for pid in victims:
        try:
            os.kill(pid, _SIGKILL)
        except PermissionError:
            spared.add(pid)
        except ProcessLookupError:
            pass


def pids() -> set[int]:
    """The pids visible in ``/proc`` (those of the sandbox's PID namespace)."""
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}


def processes() -> dict[int, tuple[int, bytes]]:
    """Every visible process: pid -> (parent pid, state letter)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue  # exited meanwhile
            fields = stat[stat.rfind(b")") + 2 :].split()  # the command name may hold spaces and parentheses
            table[int(name)] = (int(fields[1]), fields[0])
    return table


def descendants(root: int) -> list[int]:
    """Living (non-zombie) descendants of ``root``."""
    table = processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop()
        queue.extend(children.get(pid, []))
        if table[pid][1] != b"Z":
            found.append(pid)
    return found


def sweep(keep: set[int]) -> None:
    """SIGKILL every process but PID 1, ``keep`` and the runner, until none is left (zombies aside).

    A respawned runner calls this to remove a wedged predecessor and everything it had started.
    """
    keep = keep | {1, os.getpid()}
    for _ in range(1000):
        left = [pid for pid, (_, state) in processes().items() if pid not in keep and state != b"Z"]
        if not left:
            return
        kill(left, keep)
        time.sleep(0.001)


def read_file(path: bytes) -> tuple[int, int, int, bytes]:
    """The reply to a ``read``: errno and the file's bytes; EFBIG beyond :data:`MAX_FILE_BYTES` (``/dev/zero`` too)."""
    chunks, size = [], 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            while size <= MAX_FILE_BYTES:
                chunk = os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.errno or errno.EIO, 0, 0, b""
    if size > MAX_FILE_BYTES:
        return errno.EFBIG, 0, 0, b""
    return 0, 0, 0, b"".join(chunks)


def write_file(path: bytes, data: bytes, mode: int) -> tuple[int, int, int, bytes]:
    """The reply to a ``write``: errno after creating or replacing ``path`` (parents created)."""
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC, mode)
        try:
            os.set_blocking(fd, True)  # non-blocking only to open: a FIFO without a reader fails (ENXIO) at once
            write_all(fd, data)
            os.fchmod(fd, mode)  # also when the file existed, and regardless of the umask
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.errno or errno.EIO, 0, 0, b""
    return 0, 0, 0, b""


def initial_state(workdir: str) -> bytes:
    """A state file with the runner's environment and ``workdir``, as the wrapper's ``. STATE`` expects."""

    def quote(value: str) -> str:
        return "'" + value.replace("'", "'\\''") + "'"

    lines = [f"export {k}={quote(v)}" for k, v in os.environ.items() if k.isidentifier() and k.isascii()]
    return "\n".join([*lines, f"cd -- {quote(workdir)}", "return", ""]).encode(errors="surrogateescape")


def write_state(path: str, state: bytes) -> None:
    """Write the state file in place, as the wrapper does (``state`` ends with ``return``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, state)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def send(token: bytes, code: int, timed_out: int, truncated: int, body: bytes) -> None:
    """Write the reply to the request that carried ``token`` to stdout."""
    write_all(1, b"%s %d %d %d %d\n" % (token, code, timed_out, truncated, len(body)) + body)


def prctl(option: int, arg: int) -> None:
    """``prctl(option, arg)``, through the C module ``_ctypes`` (importing ``ctypes`` costs ≈7 ms in a sandbox)."""
    import _ctypes

    function = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")  # type: ignore[arg-type]  # None: the program itself
    if _ctypes.call_function(function, (option, arg, 0, 0, 0)) != 0:
        raise OSError(f"prctl({option}, {arg}) failed")


class Ignoring:
    """``contextlib.suppress`` (see the imports for why not contextlib)."""

    def __init__(self, *errors: type[BaseException]) -> None:
        self.errors = errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, self.errors)


# A process or pipe that is gone or empty, or a process we may not signal.
GONE = Ignoring(ProcessLookupError, ChildProcessError, BlockingIOError, PermissionError)


def main(state_path: str, cap: int, workdir: str | None, keep: list[int] | None, own_namespace: bool) -> None:
    """Start serving on stdin/stdout.

    Args:
        state_path: the state file (created from the environment and ``workdir`` unless ``workdir`` is None).
        cap: bytes of output kept per command.
        workdir: the initial working directory on a first start; None when respawning (the state is kept).
        keep: on a respawn, the pids to spare when sweeping the predecessor's processes (None: no sweep).
        own_namespace: the sandbox has a PID namespace of its own, so whatever the runner did not find at
            start is a command's leftover. Otherwise (a host process) leftovers are the runner's descendants:
            the runner becomes a child subreaper so that orphans stay its descendants.
    """
    with open("/proc/self/comm", "wb") as comm:  # before the next line, which gives /proc/self to root
        comm.write(NAME)
    prctl(_PR_SET_DUMPABLE, 0)  # see the module docstring
    if not own_namespace:
        prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if keep is not None:
        sweep(set(keep))
    state = initial_state(workdir or os.getcwd())
    if workdir is not None:
        write_state(state_path, state)
    runner = Runner(state_path, cap, state, own_namespace)
    others = sorted(pids() - {os.getpid()})
    write_all(1, b"%s ready %s\n" % (NAME, " ".join(map(str, others)).encode()))
    runner.serve(sys.stdin.buffer)
