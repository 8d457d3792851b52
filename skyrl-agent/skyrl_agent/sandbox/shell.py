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

The sandbox needs ``bash`` (≥ 4.1) and ``python3`` (≥ 3.8) on its PATH.
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Protocol

from skyrl_agent.sandbox.base import CommandResult, SandboxError
from skyrl_agent.sandbox.runner import KILL_AFTER_S, NAME

BACKSTOP_S = 5.0  # extra host-side wait before the runner is declared wedged and respawned
START_TIMEOUT_S = 30.0  # for the runner to say it is ready (python start-up under load)
FILE_TIMEOUT_S = 120.0  # for one read_file or write_file
DEFAULT_OUTPUT_CAP = 64 * 1024  # bytes of command output kept
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
    ) -> None:
        self._argv = list(argv)
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
        """Run ``command`` with its timeout enforced inside the sandbox; see the module docstring."""
        seconds = max(timeout_s, 0.001)
        wd, cmd = (workdir or "").encode(), command.encode()
        request = b"run %d %d %d\n%s%s" % (round(seconds * 1000), len(wd), len(cmd), wd, cmd)
        start = time.monotonic()
        reply = await self._request(request, deadline_s=seconds + KILL_AFTER_S + BACKSTOP_S)
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
        reply = await self._request(b"read %d\n%s" % (len(encoded), encoded), deadline_s=FILE_TIMEOUT_S)
        self._raise_for_file(reply, path)
        assert reply is not None
        return reply.body

    async def write_file(self, path: str, data: bytes, mode: int) -> None:
        """Create or replace ``path`` with ``data`` (parents created) as the sandbox user."""
        encoded = path.encode()
        request = b"write %d %d %d\n%s%s" % (mode, len(encoded), len(data), encoded, data)
        self._raise_for_file(await self._request(request, deadline_s=FILE_TIMEOUT_S), path)

    async def close(self) -> None:
        """Kill the host-side process; idempotent."""
        await self._kill()

    @property
    def alive(self) -> bool:
        """Whether the runner is (as far as the host can tell) running."""
        return self._channel is not None and self._channel.alive

    async def _request(self, request: bytes, *, deadline_s: float) -> _Reply | None:
        """Send ``request`` and read the reply; None (after a respawn) when none came within ``deadline_s``."""
        async with self._lock:
            if self._out_of_step or not self.alive:
                await self._spawn(None, self._keep if self._own_namespace else None)
            channel = self._channel
            assert channel is not None
            try:
                self._out_of_step = True  # until the whole reply is read
                channel.stdin.write(request)
                reply = await asyncio.wait_for(self._read_reply(channel.stdin, channel.stdout), deadline_s)
                self._out_of_step = False
                return reply
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
                # OSError: the pipe broke; ValueError: no reply header (the runner crashed and printed why).
                with contextlib.suppress(ShellDiedError):
                    await self._spawn(None, self._keep if self._own_namespace else None)
                return None

    @staticmethod
    async def _read_reply(stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader) -> _Reply:
        await stdin.drain()
        code, timed_out, truncated, length = (int(field) for field in (await stdout.readline()).split())
        return _Reply(code, bool(timed_out), bool(truncated), await stdout.readexactly(length))

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
