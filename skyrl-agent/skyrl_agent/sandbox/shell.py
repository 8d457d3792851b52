r"""One command runner per sandbox, driven over the stdin/stdout pipes of a process inside it.

Every backend hands :class:`PersistentShell` the command prefix that runs a program inside its sandbox
(``docker exec -i …``, ``bwrap …``, or nothing for a host process). The shell starts the command runner
(:mod:`.runner`) through it as ``python3 -I -S`` and sends it the runner on stdin (compiled, when the sandbox's
python reads this interpreter's bytecode; else its source). A backend may start the first runner its own way
(a :data:`ChannelOpener`: Docker has the container's init process start it, :mod:`.attach`). Each command then
runs in a subshell forked from a long-lived bash: no exec and no helper program per command (a round trip for
``true`` takes ≈1.5 ms in Docker and ≈1 ms locally on 2 shared cores; see docs/agent/sandboxes.md).

What every command gets (all enforced inside the sandbox, so nothing depends on the host killing remote
processes; :mod:`.runner` says how):

* **Timeout**: at ``T`` the command's process group gets SIGTERM, ``KILL_AFTER_S`` later SIGKILL.
* **State**: exported variables and the working directory persist across commands through a state file, and so
  survive a respawn of the runner. Shell functions, aliases and unexported variables do not. ``workdir=``
  applies to one command.
* **Output cap**: stdout and stderr interleaved, ``CAP`` bytes kept; the rest is read and dropped inside the
  sandbox, so a flood never crosses the pipe. More than ``CAP`` bytes means ``truncated``.
* **A command's processes do not outlive it**: when it returns or is killed at its timeout, everything it started
  (background jobs, ``setsid nohup … &`` daemons, a fork bomb that exhausted the pids limit) is SIGKILLed before
  the next command. To use a server, start it and use it within one command.
* A command that stops itself (``kill -STOP $BASHPID``) ends there, with status 128+19, and its processes are
  killed.
* Commands read ``/dev/null`` as stdin. ``$$`` is the long-lived bash (the same for every command; ``$BASHPID``
  is the command's own subshell); a command that kills it ends there, and the next command gets a new one.
* **Backstop**: the host waits at most ``T + KILL_AFTER + BACKSTOP`` for a reply. When none comes (the runner
  was killed, stopped or is wedged), it respawns the runner; in a sandbox with a PID namespace of its own, whose
  processes outlive the runner (Docker), the new runner first kills every process except those present before
  the first runner started (PID 1 and, in Docker, the init script and its dead-man ``sleep``).
* **The channel is the runner's alone**: commands cannot open the runner's stdout (it is not dumpable, see
  :mod:`.runner`), and the host takes as a reply only a header that repeats the request's random token and claims
  no more than the request's limit (the output cap; :data:`.runner.MAX_FILE_BYTES` for a file; nothing for a
  write). Anything else, such as bytes a command wrote into a stdout that also reaches the host (Docker's PID 1
  holds the container's), is refused unread: the request fails with :class:`ReplyRefusedError` and the runner is
  respawned. Every read is bounded: a header line by the reader's limit (64 KiB), a body by the request's limit.

Errors (all :class:`~skyrl_agent.sandbox.base.SandboxError`; whose failure they are is the caller's to say: the
agent's when the request was an agent's action, see docs/agent/dispatcher.md)::

    SandboxError
    ├── ShellDiedError              the runner is gone and no new one starts (the sandbox died, or is unreachable)
    └── CommandBrokeSandboxError    the request that was running broke the sandbox: it ended from the inside
        │                           meanwhile (its processes were killed, it ran out of memory), as the
        │                           backend's postmortem says
        └── ReplyRefusedError       the channel carried bytes the runner did not send
            └── ReplyTooLargeError  a reply header claimed more than the request's limit

The sandbox needs ``bash`` (≥ 4.1) and ``python3`` (≥ 3.8, with ``_ctypes``) on its PATH.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Protocol

from skyrl_agent.sandbox.base import CommandResult, SandboxError
from skyrl_agent.sandbox.runner import KILL_AFTER_S, MAX_FILE_BYTES, NAME

BACKSTOP_S = 5.0  # extra host-side wait before the runner is declared wedged and respawned
START_TIMEOUT_S = 30.0  # for the runner to say it is ready (python start-up under load)
FILE_TIMEOUT_S = 120.0  # for one read_file or write_file
DEFAULT_OUTPUT_CAP = 64 * 1024  # bytes of command output kept
CRASH_GRACE_S = 1.0  # after a line that is no reply: how long a runner that crashed (and said why) has to end
_RUNNER_SOURCE = (Path(__file__).parent / "runner.py").read_bytes()
# Compiling the runner takes ≈5 ms in a sandbox, as long as starting python there: a sandbox whose python has this
# interpreter's bytecode (the same magic number, e.g. any 3.11 for a 3.11 host) runs it precompiled instead.
_RUNNER_CODE = marshal.dumps(compile(_RUNNER_SOURCE, "skyrl-runner", "exec", dont_inherit=True))
# What follows on stdin (a short command line, and no quoting of 50 KB through a shell): this interpreter's magic
# number, the marshalled runner, its source, and the call that starts it.
_BOOT = (
    "import sys, marshal, _frozen_importlib_external as b;"
    " sys.version_info >= (3, 8) or sys.exit('{name} needs python3 >= 3.8');"
    " d = sys.stdin.buffer.read({n});"
    " exec(marshal.loads(d[4:{c}]) if d[:4] == b.MAGIC_NUMBER else compile(d[{c}:{s}], 'skyrl-runner', 'exec'));"
    " exec(d[{s}:])"
)


class ShellDiedError(SandboxError):
    """The command runner exited or stopped answering and could not be restarted (the sandbox may be gone)."""


class CommandBrokeSandboxError(SandboxError):
    """The request that was running broke the sandbox: it ended from the inside, or its channel was written to.

    The sandbox layer cannot tell whose request it was; a caller that ran an agent's action makes this the agent's
    failure (:class:`~skyrl_agent.agents.tool_env.SandboxToolEnv` does).
    """


class ReplyRefusedError(CommandBrokeSandboxError):
    """The runner's channel carried bytes the runner did not send; they were not taken as a reply."""


class ReplyTooLargeError(ReplyRefusedError):
    """A reply header claimed more bytes than the request may return; the body was not read."""


Postmortem = Callable[[], Awaitable[str | None]]
"""Asked when the runner's channel ended while a request ran and no new runner starts: how the sandbox ended from
the inside (its own processes ended, or it ran out of memory; e.g. ``"… exited with status 137 …"``), or None when
it did not or the backend cannot tell (killed, stopped or removed from the host; the daemon does not answer).
It must not raise."""


class RunnerChannel(Protocol):
    """The host's end of one command runner: its stdin, its stdout and stderr merged, and whether it still runs."""

    @property
    def stdin(self) -> asyncio.StreamWriter:
        """Where requests go."""

    @property
    def stdout(self) -> asyncio.StreamReader:
        """Where replies (and anything the runner prints on stderr) come from."""

    @property
    def alive(self) -> bool:
        """False once the host knows the runner has ended."""

    async def kill(self) -> None:
        """Disconnect from the runner (the runner sees its stdin end) and release the channel; idempotent."""


ChannelOpener = Callable[[Sequence[str]], Awaitable[RunnerChannel]]
"""Starts the runner's command line (``python3 -I -S -c …``) in the sandbox, or hands it to a process there that
starts it, and returns the channel to it."""


class _ProcessChannel:
    """A host process (``docker exec -i …``, ``bwrap …``, or the runner itself) with its stdin and stdout piped."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._proc = proc
        self.stdin: asyncio.StreamWriter = proc.stdin
        self.stdout: asyncio.StreamReader = proc.stdout

    @classmethod
    async def start(cls, argv: Sequence[str], env: dict[str, str] | None) -> _ProcessChannel:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C on the host terminal must not reach the sandbox first
        )
        return cls(proc)

    @property
    def alive(self) -> bool:
        return self._proc.returncode is None

    async def kill(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._proc.wait(), 5.0)


@dataclass(frozen=True)
class _Reply:
    code: int  # exit status, or errno for a file operation
    timed_out: bool
    truncated: bool
    body: bytes


class PersistentShell:
    """The host side of the sandbox's command runner; one request at a time.

    Args:
        argv: the command prefix that runs a program inside the sandbox, its stdin and stdout connected to the
            host (the runner's command line is appended).
        state_path: a file inside the sandbox, writable by the sandbox user, that holds the shell state.
        output_cap: bytes of output kept per command; more sets ``truncated``.
        env: environment of the host-side process (``None``: inherit).
        python: the python interpreter inside the sandbox.
        postmortem: asked how the sandbox ended when it ended during a request (see :data:`Postmortem`); without
            one, every death is a :class:`ShellDiedError`.
        own_pid_namespace: the sandbox has a PID namespace of its own (Docker, bwrap): a command's leftovers are
            all processes the runner did not find at its start, and a respawned runner first kills every process
            but those present before the first one. Otherwise (a host process) leftovers are the runner's
            descendants and a respawn kills nothing inside.

    The owner must call :meth:`close`; it kills the host-side process (not processes inside the sandbox,
    which the backend removes with the sandbox).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        state_path: str,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        env: dict[str, str] | None = None,
        python: str = "python3",
        own_pid_namespace: bool = False,
        postmortem: Postmortem | None = None,
    ) -> None:
        self._argv = list(argv)
        self._postmortem = postmortem
        self._state = state_path
        self._cap = output_cap
        self._env = env
        self._python = python
        self._own_namespace = own_pid_namespace
        self._keep: list[int] = []  # pids present before the first runner (PID 1, Docker's init script, …)
        self._channel: RunnerChannel | None = None
        self._lock = asyncio.Lock()
        # A request was cancelled before its reply was read: that reply would answer the next request, so the
        # next request starts a new runner first (which also ends what the cancelled command left running).
        self._out_of_step = False

    async def start(self, initial_workdir: str, *, opener: ChannelOpener | None = None) -> None:
        """Start the runner and write the initial state (its environment, ``initial_workdir``).

        ``opener``: how to start this first runner, instead of running its command line behind ``argv`` (a
        backend that has a process in the sandbox waiting to start it). Respawns always go through ``argv``.
        """
        self._keep = await self._spawn(initial_workdir, None, opener)

    async def run(self, command: str, *, timeout_s: float, workdir: str | None = None) -> CommandResult:
        """Run ``command`` with its timeout enforced inside the sandbox; see the module docstring.

        Raises:
            CommandBrokeSandboxError: the command ended the sandbox, or wrote into the runner's channel.
            ShellDiedError: the sandbox is gone for another reason (the runner cannot be restarted).
        """
        seconds = max(timeout_s, 0.001)
        wd, cmd = (workdir or "").encode(), command.encode()
        start = time.monotonic()
        deadline_s = seconds + KILL_AFTER_S + BACKSTOP_S
        reply = await self._request(b"run", (round(seconds * 1000), len(wd), len(cmd)), wd + cmd, self._cap, deadline_s)
        duration = time.monotonic() - start
        if reply is None:  # no answer: the runner was killed or wedged (and has been respawned)
            return CommandResult(output="", exit_code=-1, timed_out=True, duration_s=duration)
        return CommandResult(
            output=reply.body.decode("utf-8", errors="replace"),
            exit_code=-1 if reply.timed_out else reply.code,
            timed_out=reply.timed_out,
            truncated=reply.truncated,
            duration_s=duration,
        )

    async def read_file(self, path: str) -> bytes:
        """Bytes of ``path`` as the sandbox user; raises ``FileNotFoundError``/``PermissionError``/…."""
        encoded = path.encode()
        reply = await self._request(b"read", (len(encoded),), encoded, MAX_FILE_BYTES, FILE_TIMEOUT_S)
        self._raise_for_file(reply, path)
        assert reply is not None
        return reply.body

    async def write_file(self, path: str, data: bytes, mode: int) -> None:
        """Create or replace ``path`` with ``data`` (parents created) as the sandbox user."""
        encoded = path.encode()
        reply = await self._request(b"write", (mode, len(encoded), len(data)), encoded + data, 0, FILE_TIMEOUT_S)
        self._raise_for_file(reply, path)

    async def close(self) -> None:
        """Kill the host-side process; idempotent."""
        await self._kill()

    @property
    def alive(self) -> bool:
        """Whether the runner is (as far as the host can tell) running."""
        return self._channel is not None and self._channel.alive

    async def _request(
        self, op: bytes, numbers: tuple[int, ...], payload: bytes, limit: int, deadline_s: float
    ) -> _Reply | None:
        """Send one request and read its reply of at most ``limit`` bytes.

        Returns None (after a respawn) when no reply came within ``deadline_s`` or the runner ended without one.
        A runner that was gone before the request is a :class:`ShellDiedError` (the sandbox died while idle).

        Raises:
            ReplyRefusedError: the channel carried something else than the reply (the runner is respawned).
            CommandBrokeSandboxError: the sandbox ended from the inside while the request ran.
            ShellDiedError: the runner is gone and no new one starts.
        """
        async with self._lock:
            if self._out_of_step or not self.alive:
                await self._respawn()
            channel = self._channel
            assert channel is not None
            token = secrets.token_hex(8).encode()  # what a command cannot know, so cannot forge
            header = b" ".join([op, token, *(b"%d" % n for n in numbers)])
            self._out_of_step = True  # until the whole reply is read
            try:
                channel.stdin.write(header + b"\n" + payload)
                reply = await asyncio.wait_for(self._read_reply(channel, token, limit), deadline_s)
            except ReplyRefusedError:
                with contextlib.suppress(ShellDiedError):
                    await self._respawn()  # the new runner's sweep ends what the request left running
                raise
            except (OSError, EOFError, TimeoutError):
                # OSError: the pipe broke; EOFError: the runner ended (killed, or crashed); TimeoutError: wedged.
                try:
                    await self._respawn()
                except ShellDiedError as exc:
                    raise await self._death(op, exc) from exc
                return None
            self._out_of_step = False
            return reply

    @staticmethod
    async def _read_reply(channel: RunnerChannel, token: bytes, limit: int) -> _Reply:
        """The reply to the request that carried ``token``; nothing beyond its header is read unless it is one."""
        await channel.stdin.drain()
        try:
            line = await channel.stdout.readline()  # buffers at most the reader's limit without a newline
        except ValueError:  # a longer line: no header is that long
            line = b"(a line over the reader's limit)\n"
        if not line.endswith(b"\n"):
            raise EOFError("the runner ended without a reply")
        fields = line.split()
        if len(fields) != 5 or fields[0] != token or not all(field.isdigit() for field in fields[1:]):
            if await _ends(channel):  # a runner that crashed prints why, then ends
                raise EOFError("the runner ended without a reply")
            raise ReplyRefusedError(
                f"the sandbox's channel to its command runner carried bytes the runner did not send ({line[:60]!r}…);"
                " a command wrote into a stdout that reaches the host. They were not taken as the reply"
            )
        code, timed_out, truncated, length = (int(field) for field in fields[1:])
        if length > limit:
            raise ReplyTooLargeError(
                f"a reply claimed {length} bytes, which exceeds the limit of {limit} bytes for this request;"
                " it was refused unread"
            )
        return _Reply(code, bool(timed_out), bool(truncated), await channel.stdout.readexactly(length))

    async def _death(self, op: bytes, error: ShellDiedError) -> SandboxError:
        """What a runner that ended during an ``op`` request and cannot be restarted means (see :data:`Postmortem`)."""
        cause = None if self._postmortem is None else await self._postmortem()
        if cause is None:
            return error
        return CommandBrokeSandboxError(f"the sandbox ended from the inside while a {op.decode()} request ran: {cause}")

    async def _respawn(self) -> None:
        await self._spawn(None, self._keep if self._own_namespace else None)

    async def _spawn(
        self, workdir: str | None, keep: list[int] | None, opener: ChannelOpener | None = None
    ) -> list[int]:
        """(Re)start the runner; returns the pids that were present in the sandbox before it.

        ``workdir``: write the initial state with this working directory (None on a respawn: keep the state).
        ``keep``: sweep every other process first (see :func:`.runner.sweep`).
        ``opener``: starts the runner's command line (default: as a host process, behind ``argv``).
        """
        await self._kill()
        self._out_of_step = False
        call = f"main({self._state!r}, {self._cap}, {workdir!r}, {keep!r}, {self._own_namespace!r})"
        code_end = 4 + len(_RUNNER_CODE)
        source_end = code_end + len(_RUNNER_SOURCE)
        source = MAGIC_NUMBER + _RUNNER_CODE + _RUNNER_SOURCE + call.encode()
        boot = _BOOT.format(name=NAME.decode(), n=len(source), c=code_end, s=source_end)
        command = [self._python, "-I", "-S", "-c", boot]
        channel: RunnerChannel
        if opener is None:
            channel = await _ProcessChannel.start([*self._argv, *command], self._env)
        else:
            channel = await opener(command)
        self._channel = channel
        channel.stdin.write(source)
        hello = b""
        with contextlib.suppress(OSError, TimeoutError, ValueError):
            await channel.stdin.drain()
            hello = await asyncio.wait_for(channel.stdout.readline(), START_TIMEOUT_S)
        if hello.startswith(NAME + b" ready"):
            return [int(pid) for pid in hello.split()[2:]]
        with contextlib.suppress(OSError, TimeoutError, ValueError):
            hello += await asyncio.wait_for(channel.stdout.read(4000), 1.0)
        await self._kill()
        text = hello.decode(errors="replace").strip()[-2000:]
        where = " ".join([*self._argv, self._python][:3]) if opener is None else "the sandbox's init process"
        raise ShellDiedError(f"the sandbox command runner did not start ({where} …): {text}")

    async def _kill(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.kill()

    @staticmethod
    def _raise_for_file(reply: _Reply | None, path: str) -> None:
        if reply is None:
            raise ShellDiedError(f"the sandbox command runner died while accessing {path}")
        if reply.code != 0:
            raise OSError(reply.code, os.strerror(reply.code), path)  # FileNotFoundError, PermissionError, …


async def _ends(channel: RunnerChannel) -> bool:
    """Whether ``channel`` ends within :data:`CRASH_GRACE_S`; what arrives meanwhile (64 KiB at most) is dropped."""
    loop = asyncio.get_running_loop()
    deadline, dropped = loop.time() + CRASH_GRACE_S, 0
    while channel.alive and dropped < 1 << 16:
        try:
            chunk = await asyncio.wait_for(channel.stdout.read(4096), max(deadline - loop.time(), 0))
        except TimeoutError:
            return False
        if not chunk:
            return True
        dropped += len(chunk)
    return not channel.alive
