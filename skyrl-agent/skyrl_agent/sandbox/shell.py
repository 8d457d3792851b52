"""One persistent bash per sandbox, driven over its stdin/stdout pipes.

Every backend starts a long-lived ``bash`` inside its sandbox (``docker exec -i``, ``bwrap``, or a plain
subprocess) and hands its argv to :class:`PersistentShell`. A command then costs a few forks inside the sandbox
instead of a new exec through a daemon (≈10 ms round trip in Docker, ≈5 ms locally, on 2 shared cores; see
docs/agent/sandboxes.md).

How one command runs (all inside the sandbox, so nothing depends on the host killing remote processes):

* ``timeout -k KILL_AFTER T bash -c WRAPPER`` runs the command in a fresh bash; at ``T`` GNU ``timeout`` signals
  the command's whole process group.
* The wrapper restores the shell state (exported variables and the working directory) from a state file, runs
  the command with ``eval``, and saves the state again. ``cd`` and ``export`` therefore persist across commands,
  and the state survives a respawn of the shell. Shell functions, aliases and unexported variables do not.
* Output (stdout and stderr interleaved) goes to a reader, ``head -c CAP+1`` with the rest drained inside the
  sandbox, so a flood never crosses the pipe; more than ``CAP`` bytes means ``truncated``.
* When the command has returned (or was killed at its timeout), the shell SIGKILLs every other process of the
  sandbox user except PID 1 and the dead-man ``sleep``, using builtins only, in passes until none is left. This
  holds even against a fork bomb that exhausted the pids limit (its top-level command returns at once).
* The exit code follows a per-shell random sentinel. The host waits at most ``T + KILL_AFTER + BACKSTOP`` and
  respawns the shell when the sentinel never comes (a wedged or dead shell); the new shell reaps the old one.

Commands read ``/dev/null`` as stdin so they can never swallow the next command. **A command's processes do not
outlive it**: background jobs and daemons (even ``setsid nohup cmd &``) are killed when the command returns. To
use a server, start it and use it within one command.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass

from skyrl_agent.sandbox.base import CommandResult, SandboxError

KILL_AFTER_S = 2.0  # SIGKILL follows SIGTERM this long after a command's timeout
BACKSTOP_S = 5.0  # extra host-side wait before the shell is declared wedged and respawned
DEFAULT_OUTPUT_CAP = 64 * 1024  # bytes of command output kept
_READ_CHUNK = 1 << 16

# Runs in a fresh bash per command. $1 command, $2 one-off workdir ("" for none), $3 state file.
_WRAPPER = r"""
__skyrl_cmd=$1 __skyrl_wd=$2 __skyrl_state=$3
set --
if [ -r "$__skyrl_state" ]; then
  for __skyrl_v in $(compgen -e); do unset "$__skyrl_v"; done
  . "$__skyrl_state"
fi
if [ -n "$__skyrl_wd" ]; then cd -- "$__skyrl_wd" || exit 1; fi
eval "$__skyrl_cmd"
__skyrl_rc=$?
# Builtins only from here: saving must work even when no process can be forked (pids limit reached).
if [ -z "$__skyrl_wd" ]; then
  printf -v __skyrl_cd 'cd -- %q' "$PWD"
else
  while read -r __skyrl_l; do case $__skyrl_l in "cd -- "*) __skyrl_cd=$__skyrl_l ;; esac; done < "$__skyrl_state"
fi
{ export -p; printf '%s\n' "$__skyrl_cd"; } > "$__skyrl_state"
exit $__skyrl_rc
"""

# Defined in the persistent shell at (re)start. ``__skyrl_reap [PID]`` SIGKILLs every process it may signal except
# PID 1, the pids in $__skyrl_keep (present before the first command: the dead-man ``sleep``), itself, and PID with
# its children (the output reader). Builtins only, so it works when the pids limit is exhausted; passes repeat
# until one finds nothing to kill, which catches what a fork bomb spawned during the previous pass.
_REAPER = r"""
__skyrl_reap() {
  local p s n i
  for ((i = 0; i < 1000; i++)); do
    n=0
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      case "$__skyrl_keep" in *" $p "*) continue ;; esac
      [ "$p" = "$$" ] && continue
      read -r s 2> /dev/null < "/proc/$p/stat" || continue
      s=${s##*) }
      set -f -- $s
      set +f
      [ "$1" = Z ] && continue
      if [ -n "$__skyrl_spare" ] && { [ "$p" = "$__skyrl_spare" ] || [ "$2" = "$__skyrl_spare" ]; }; then
        continue
      fi
      kill -KILL "$p" 2> /dev/null && n=$((n + 1))
    done
    [ "$n" -eq 0 ] && return 0
  done
  return 1
}
"""


class ShellDiedError(SandboxError):
    """The persistent shell exited or stopped answering (the sandbox may be gone)."""


@dataclass(frozen=True)
class _Reply:
    body: bytes
    code: int
    complete: bool  # False when the host-side backstop fired or the shell died before the sentinel


class PersistentShell:
    """A bash process reached through pipes; one command at a time.

    Args:
        argv: the command that starts ``bash --noprofile --norc`` inside the sandbox (reading stdin).
        state_path: a file inside the sandbox, writable by the sandbox user, that holds the shell state.
        output_cap: bytes of output kept per command; more sets ``truncated``.
        env: environment of the host-side process (``None``: inherit).

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
    ) -> None:
        self._argv = list(argv)
        self._state = state_path
        self._cap = output_cap
        self._env = env
        self._token = f"__SKYRL_{secrets.token_hex(8)}_"
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._keep = " 1 "

    async def start(self, initial_workdir: str) -> None:
        """Start the shell and write the initial state (its environment, ``initial_workdir``)."""
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._env,
            start_new_session=True,  # a Ctrl-C on the host terminal must not reach the shell first
        )
        state = shlex.quote(self._state)
        init = (
            f"{{ export -p; printf 'cd -- %q\\n' {shlex.quote(initial_workdir)}; }} > {state}.new"
            f" && mv -f {state}.new {state}"
        )
        # Processes present before any command (PID 1, the dead-man ``sleep``) are never reaped.
        keep = 'for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = "$$" ] || printf " %s" "$p"; done'
        reply = await self._exchange(f"{init} && {keep}\n", b"", deadline_s=30.0)
        if reply.complete and reply.code == 0:
            self._keep = " 1 " + " ".join(reply.body.decode().split()) + " "
            reply = await self._exchange(self._setup(), b"", deadline_s=30.0)
        if not reply.complete or reply.code != 0:
            text = reply.body.decode(errors="replace")[-2000:]
            await self._kill()
            raise ShellDiedError(f"the sandbox shell did not start ({' '.join(self._argv[:3])} …): {text}")

    async def run(self, command: str, *, timeout_s: float, workdir: str | None = None) -> CommandResult:
        """Run ``command`` with its timeout enforced inside the sandbox; see the module docstring."""
        seconds = max(timeout_s, 0.001)
        line = (
            f"{{ timeout -k {KILL_AFTER_S:g}s {seconds:.3f}s bash --noprofile --norc -c {shlex.quote(_WRAPPER)} skyrl"
            f" {shlex.quote(command)} {shlex.quote(workdir or '')} {shlex.quote(self._state)}"
            f" < /dev/null; }} > >(head -c {self._cap + 1}; cat > /dev/null) 2>&1; __skyrl_rc=$?; __skyrl_spare=$!\n"
            # Whatever the command left (background jobs, daemons, a fork bomb) would hold the output pipe open
            # and the pids limit: kill it, then wait for the reader to see the end of the output.
            "__skyrl_reap; wait $__skyrl_spare; __skyrl_spare=\n"
        )
        start = time.monotonic()
        async with self._lock:
            reply = await self._exchange(line, b"", deadline_s=seconds + KILL_AFTER_S + BACKSTOP_S, rc="$__skyrl_rc")
            if not reply.complete:
                await self._respawn()
        duration = time.monotonic() - start
        # 124: SIGTERM at the timeout; 137: SIGKILL after KILL_AFTER. A command may exit 124 by itself, so the
        # elapsed time decides.
        timed_out = not reply.complete or (reply.code in (124, 137) and duration >= seconds * 0.95)
        output = reply.body
        truncated = len(output) > self._cap
        return CommandResult(
            output=output[: self._cap].decode("utf-8", errors="replace"),
            exit_code=-1 if timed_out else reply.code,
            timed_out=timed_out,
            truncated=truncated,
            duration_s=duration,
        )

    async def read_file(self, path: str) -> bytes:
        """Bytes of ``path`` as the sandbox user; raises ``FileNotFoundError``/``PermissionError``/…."""
        p = shlex.quote(path)
        script = (
            f"if [ -d {p} ]; then __skyrl_rc=21; elif [ ! -e {p} ]; then __skyrl_rc=2;"
            f" elif [ ! -r {p} ]; then __skyrl_rc=13; else base64 -w0 < {p}; __skyrl_rc=$?; fi\n"
        )
        async with self._lock:
            reply = await self._exchange(script, b"", deadline_s=120.0, rc="$__skyrl_rc")
        self._raise_for_file(reply, path)
        return base64.b64decode(reply.body)

    async def write_file(self, path: str, data: bytes, mode: int) -> None:
        """Create or replace ``path`` with ``data`` (parents created) as the sandbox user."""
        p = shlex.quote(path)
        parent = shlex.quote(os.path.dirname(path) or ".")
        # The payload follows the command on stdin; bash reads a pipe byte by byte, so ``head -c N`` gets exactly
        # the payload. Every branch consumes it, or it would be executed as commands.
        script = (
            f"if [ -d {p} ]; then __skyrl_rc=21; head -c {len(data)} > /dev/null;"
            f" elif mkdir -p -- {parent} 2>/dev/null && : > {p} 2>/dev/null; then"
            f" head -c {len(data)} > {p} && chmod {mode:o} {p}; __skyrl_rc=$?;"
            f" else __skyrl_rc=13; head -c {len(data)} > /dev/null; fi\n"
        )
        async with self._lock:
            reply = await self._exchange(script, data, deadline_s=120.0, rc="$__skyrl_rc")
        self._raise_for_file(reply, path)

    async def close(self) -> None:
        """Kill the host-side shell process; idempotent."""
        await self._kill()

    @property
    def alive(self) -> bool:
        """Whether the host-side shell process is running."""
        return self._proc is not None and self._proc.returncode is None

    def _setup(self) -> str:
        """Define the reaper and the pids it spares in a freshly started shell."""
        return f"{_REAPER}\n__skyrl_keep={shlex.quote(self._keep)}; __skyrl_spare=\n"

    async def _exchange(self, script: str, payload: bytes, *, deadline_s: float, rc: str = "$?") -> _Reply:
        """Send ``script`` (then ``payload``) and read until the sentinel that carries ``rc``."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None or proc.returncode is not None:
            raise ShellDiedError("the sandbox shell is not running")
        marker = f"\n{self._token}:".encode()
        proc.stdin.write(script.encode() + payload + f"printf '\\n{self._token}:%d\\n' {rc}\n".encode())
        try:
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return _Reply(b"", -1, complete=False)
        return await self._read_reply(proc.stdout, marker, time.monotonic() + deadline_s)

    async def _read_reply(self, stdout: asyncio.StreamReader, marker: bytes, deadline: float) -> _Reply:
        buf = bytearray()
        scanned = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _Reply(bytes(buf), -1, complete=False)
            try:
                chunk = await asyncio.wait_for(stdout.read(_READ_CHUNK), remaining)
            except TimeoutError:
                return _Reply(bytes(buf), -1, complete=False)
            if not chunk:
                return _Reply(bytes(buf), -1, complete=False)
            buf += chunk
            idx = buf.find(marker, max(0, scanned - len(marker)))
            scanned = len(buf)
            if idx < 0:
                continue
            end = buf.find(b"\n", idx + len(marker))
            if end < 0:
                scanned = idx  # the code line is incomplete: search again from the marker
                continue
            return _Reply(bytes(buf[:idx]), int(buf[idx + len(marker) : end]), complete=True)

    async def _respawn(self) -> None:
        """Replace a wedged shell; the state file keeps the working directory and environment."""
        await self._kill()
        self._token = f"__SKYRL_{secrets.token_hex(8)}_"
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._env,
            start_new_session=True,
        )
        # The old shell may still run inside the sandbox (killing ``docker exec`` does not kill it): reap it.
        with contextlib.suppress(ShellDiedError):
            await self._exchange(self._setup() + "__skyrl_reap\n", b"", deadline_s=30.0)

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5.0)

    @staticmethod
    def _raise_for_file(reply: _Reply, path: str) -> None:
        if not reply.complete:
            raise ShellDiedError(f"the sandbox shell died while accessing {path}")
        errors: dict[int, type[OSError]] = {2: FileNotFoundError, 13: PermissionError, 21: IsADirectoryError}
        if reply.code in errors:
            raise errors[reply.code](reply.code, os.strerror(reply.code), path)
        if reply.code != 0:
            raise OSError(reply.code, f"file operation failed in the sandbox (exit {reply.code})", path)
