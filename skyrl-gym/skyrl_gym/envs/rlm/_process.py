"""The parent side of ``PersistentREPL(isolation="process")``: starting, feeding and killing its child process.

::

    parent process                                   child process (python -I, own session, rlimits)
    PersistentREPL ── ProcessBackend ── JSON lines ──> child_main: an inline PersistentREPL
                                      <── JSON lines ── (llm_query / rlm_query call back to the parent)

The child (its program is :mod:`skyrl_gym.envs.rlm._child`) is a long-lived ``python -I`` started in its own
session, with a clean environment, the REPL's ``temp_dir`` as working directory and ``HOME``/``TMPDIR``, and
rlimits on address space (``memory_limit_mb``), file size (64 MiB) and core dumps. Inside it an ordinary inline
:class:`~skyrl_gym.envs.rlm.repl.PersistentREPL` runs model code on its main thread, so its ``SIGALRM`` timeout
keeps the namespace intact in the usual case.
Only when the child has not reported back ``timeout + 5`` seconds after a run started (a C call that never
returns, ``except BaseException`` in a loop) does the parent kill its whole process group; the next run starts a
fresh child, and that run's result says the variables were lost. A child that dies (e.g. over its memory limit)
is handled the same way. So, unlike the inline mode, a timeout always ends the run.

What this mode does *not* give: namespaces. The child can read the files its uid can read and open network
connections if model code escapes the restricted builtins; run the whole trainer under a container or the
bubblewrap sandbox for that.

Helper calls: the child's ``llm_query``/``rlm_query`` send ``{"op": "call"}`` messages; the parent runs its own
``lm_callback``/``subcall_fn`` (several at once in a small thread pool) and replies. Arguments and results cross
the pipe as JSON: a context that is not JSON arrives as its ``str()``, and tuples arrive as lists.

Protocol, one JSON object per line. Messages from the child are untrusted: only ever JSON-decoded, size-capped
and validated; anything unexpected kills the child.

* parent → child: ``init`` (settings and context), ``exec`` (``code``), ``lookup`` (``name``), ``reply``
  (``id``, ``ok``, ``value`` or ``error``).
* child → parent: ``ready``, ``call`` (``id``, ``name``: ``"lm"`` or ``"subcall"``, ``args``), ``result``
  (the :class:`~skyrl_gym.envs.rlm.repl.REPLResult` fields and ``final_value``), ``lookup_result`` (``text``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from skyrl_gym.envs.rlm._timeouts import shield
from skyrl_gym.envs.rlm.results import REPLResult, REPLStartError, cap_text, lm_texts, subcall_value

if TYPE_CHECKING:
    from skyrl_gym.envs.rlm.repl import PersistentREPL

__all__ = ["ProcessBackend", "encode_message", "write_all"]

_START_TIMEOUT_S: Final = 60.0  # how long a new child may take to import and report ready
_KILL_GRACE_S: Final = 5.0  # after a run's timeout, how long the child gets to report it before it is killed
_POLL_S: Final = 0.05  # how often the parent checks finished helper calls while waiting
_MAX_MESSAGE_BYTES: Final = 64 << 20  # a longer line from the child is a protocol violation
_HELPER_WORKERS: Final = 4  # helper calls the parent serves at once
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[3])  # the directory that holds skyrl_gym/
_BOOTSTRAP: Final = (
    "import sys; sys.path.insert(0, sys.argv[4]); "
    "from skyrl_gym.envs.rlm._child import child_main; "
    "child_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
)


class _ChildGone(Exception):
    """The child exited, closed its pipe or broke the protocol."""


class _LineReader:
    """Reads the child's JSON lines from a pipe, with a deadline and a size cap."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or ``None`` if none arrived within ``timeout`` seconds.

        Raises:
            _ChildGone: End of file, an oversized line, or a line that is not a JSON object with an ``op``.
        """
        deadline = time.monotonic() + timeout
        while (newline := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > _MAX_MESSAGE_BYTES:
                raise _ChildGone("the REPL process sent an oversized message")
            ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                raise _ChildGone("the REPL process exited")
            self._buffer += chunk
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        return _decode(line)


def _decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise _ChildGone("the REPL process sent a malformed message") from exc
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise _ChildGone("the REPL process sent a malformed message")
    return message


def encode_message(message: dict[str, Any]) -> bytes:
    """One protocol line: ``message`` as JSON and a newline (both sides frame their messages so)."""
    return json.dumps(message, default=str).encode() + b"\n"


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, however many ``os.write`` calls it takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _kill_child(process: subprocess.Popen[bytes], fds: tuple[int, ...]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the child leads its own session: this kills all it started
    process.wait()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


shield(_kill_child)  # a timeout landing mid-kill would leave an unreaped child


class _Child:
    """One running child process and the parent's ends of its two pipes."""

    def __init__(self, workdir: str, memory_limit_mb: int) -> None:
        to_child_read, self._to_child = os.pipe()
        self._from_child, from_child_write = os.pipe()
        try:
            with open(os.path.join(workdir, "child-stderr.log"), "ab") as log:
                self.process = subprocess.Popen(
                    [
                        *(sys.executable or "python3", "-I", "-c", _BOOTSTRAP),
                        *(str(to_child_read), str(from_child_write), str(memory_limit_mb), _PACKAGE_ROOT),
                    ],
                    pass_fds=(to_child_read, from_child_write),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    cwd=workdir,
                    env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"},
                    start_new_session=True,
                )
        except BaseException:
            os.close(self._to_child)
            os.close(self._from_child)
            raise
        finally:
            os.close(to_child_read)
            os.close(from_child_write)
        self.reader = _LineReader(self._from_child)
        self._finalizer = weakref.finalize(self, _kill_child, self.process, (self._to_child, self._from_child))

    def send(self, message: dict[str, Any]) -> None:
        """Write one message. Raises :class:`_ChildGone` if the child has exited."""
        try:
            write_all(self._to_child, encode_message(message))
        except OSError as exc:  # BrokenPipeError, or the fd was closed by kill()
            raise _ChildGone("the REPL process exited") from exc

    def kill(self) -> None:
        """Kill the child's process group, reap it and close the pipes. Idempotent."""
        self._finalizer()


class ProcessBackend:
    """Runs a :class:`PersistentREPL`'s code in a child process (see the module docstring).

    Args:
        repl: The parent REPL: its callbacks serve helper calls, its settings configure the child, and its
            ``final_value`` is updated from the child's.
        context: The ``context`` of the child REPL; must be JSON-serialisable.
        allowed_imports: Passed to the child REPL.
        memory_limit_mb: The child's address-space limit; 0 or less: no limit.

    Raises:
        TypeError: ``context`` is not JSON-serialisable.
        REPLStartError: The child did not start.
    """

    def __init__(
        self, repl: PersistentREPL, *, context: Any, allowed_imports: list[str] | None, memory_limit_mb: int
    ) -> None:
        try:
            json.dumps(context)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"isolation='process' needs a JSON-serialisable context: {exc}") from exc
        self._repl = repl
        self._memory_limit_mb = memory_limit_mb
        self._init_message = {
            "op": "init",
            "context": context,
            "timeout": repl.timeout,
            "max_output_chars": repl.max_output_chars,
            "allowed_imports": allowed_imports,
            "lm": repl.lm_callback is not None,
            "subcall": repl.subcall_fn is not None,
        }
        self._pool: ThreadPoolExecutor | None = None
        self._child: _Child | None = self._spawn()

    def _spawn(self) -> _Child:
        child = _Child(self._repl.temp_dir, self._memory_limit_mb)
        try:
            child.send(self._init_message)
            ready = child.reader.read(_START_TIMEOUT_S)
            if ready is None or ready.get("op") != "ready":
                raise _ChildGone(f"no ready message within {_START_TIMEOUT_S:g} s")
        except _ChildGone as exc:
            child.kill()
            raise REPLStartError(f"the REPL process did not start: {exc}{self._log_tail()}") from exc
        return child

    def _log_tail(self) -> str:
        try:
            text = Path(self._repl.temp_dir, "child-stderr.log").read_text(errors="replace")
        except OSError:
            return ""
        return f"; its stderr ends with:\n{text[-2000:]}" if text.strip() else ""

    def execute(self, code: str) -> REPLResult:
        """Run ``code`` in the child; kill and forget the child if it overruns or dies."""
        started = time.monotonic()
        try:
            child = self._child or self._new_child()
            reply = self._exchange(child, {"op": "exec", "code": code}, "result", started + self._budget())
        except REPLStartError as exc:
            return self._failure(started, "REPLStartError", str(exc))
        except _ChildGone as exc:
            self._discard()
            return self._failure(started, "REPLProcessError", f"{exc}; {_LOST}")
        except BaseException:
            self._discard()  # interrupted mid-exchange (e.g. by an enclosing REPL's timeout): the child is out of step
            raise
        if reply is None:
            self._discard()
            limit = f"execution exceeded the {self._repl.timeout:g} s time limit"
            return self._failure(started, "REPLTimeoutError", f"{limit}; the REPL process was killed. {_LOST}", True)
        return self._to_result(reply, started)

    def lookup_text(self, name: str) -> str | None:
        """``str()`` of a variable of the child's namespace, or ``None`` (missing, failed, or child lost)."""
        if self._child is None:
            return None
        deadline = time.monotonic() + self._budget()
        try:
            reply = self._exchange(self._child, {"op": "lookup", "name": name}, "lookup_result", deadline)
        except _ChildGone:
            reply = None
        except BaseException:
            self._discard()  # interrupted mid-exchange: the child is out of step
            raise
        if reply is None:
            self._discard()
            return None
        text = reply.get("text")
        return text if isinstance(text, str) else None

    def _budget(self) -> float:
        return self._repl.timeout + _KILL_GRACE_S

    def _new_child(self) -> _Child:
        self._child = self._spawn()
        return self._child

    def _exchange(self, child: _Child, request: dict[str, Any], expect: str, deadline: float) -> dict[str, Any] | None:
        """Send ``request`` and serve helper calls until the ``expect`` reply (``None`` once past ``deadline``)."""
        child.send(request)
        pending: list[Future[dict[str, Any]]] = []
        while True:
            pending = self._reply_finished(child, pending)
            remaining = deadline - time.monotonic()
            message = child.reader.read(max(0.0, min(remaining, _POLL_S) if pending else remaining))
            if message is None:
                if time.monotonic() >= deadline:
                    return None
                continue
            if message["op"] == expect:
                return message
            if message["op"] != "call":
                raise _ChildGone(f"the REPL process sent an unexpected {message['op']!r} message")
            pending.append(self._helper_pool().submit(self._serve, message))

    def _reply_finished(self, child: _Child, pending: list[Future[dict[str, Any]]]) -> list[Future[dict[str, Any]]]:
        finished = [future for future in pending if future.done()]  # one snapshot: a reply is never skipped
        for future in finished:
            child.send(future.result())
        return [future for future in pending if future not in finished]

    def _helper_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=_HELPER_WORKERS, thread_name_prefix="rlm-helper")
        return self._pool

    def _serve(self, message: dict[str, Any]) -> dict[str, Any]:
        """Run one helper call of the child; the reply carries the value or the failure text."""
        reply: dict[str, Any] = {"op": "reply", "id": message.get("id")}
        try:
            reply["value"] = self._call_helper(message.get("name"), message.get("args"))
        except Exception as exc:  # a malformed call is answered, not fatal: the child turns it into error text
            reply.update(ok=False, error=str(exc))
        else:
            reply["ok"] = True
        return reply

    def _call_helper(self, name: object, args: object) -> Any:
        repl = self._repl
        if name == "lm" and repl.lm_callback is not None and isinstance(args, list) and len(args) == 1:
            prompts = args[0]
            if isinstance(prompts, list):
                return lm_texts(repl.lm_callback, [str(prompt) for prompt in prompts])
        if name == "subcall" and repl.subcall_fn is not None and isinstance(args, list) and len(args) in (1, 2):
            return subcall_value(repl.subcall_fn, str(args[0]), args[1] if len(args) == 2 else None)
        raise ValueError(f"malformed helper call {name!r}")

    def _to_result(self, reply: dict[str, Any], started: float) -> REPLResult:
        final_value = reply.get("final_value")
        if isinstance(final_value, str):
            self._repl.final_value = final_value
        error = reply.get("error")
        limit = self._repl.max_output_chars
        return REPLResult(
            stdout=cap_text(str(reply.get("stdout", "")), limit),
            stderr=cap_text(str(reply.get("stderr", "")), limit),
            error=str(error) if error is not None else None,
            timed_out=reply.get("timed_out") is True,
            execution_time=time.monotonic() - started,
        )

    def _failure(self, started: float, kind: str, detail: str, timed_out: bool = False) -> REPLResult:
        error = f"{kind}: {detail}"
        return REPLResult(
            stdout="",
            stderr=error + "\n",
            error=error,
            timed_out=timed_out,
            execution_time=time.monotonic() - started,
        )

    def _discard(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()

    def close(self) -> None:
        """Kill the child and drop the helper pool (helper calls still running finish unobserved)."""
        self._discard()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_LOST: Final = "The REPL restarts on the next run: variables defined so far are lost."


# ------------------------------------------------------------------------------------------------------ child side
