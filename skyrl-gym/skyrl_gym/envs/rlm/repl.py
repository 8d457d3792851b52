"""``PersistentREPL``: the Python REPL of recursive-language-model (RLM) episodes.

The model writes Python; the REPL runs it in one namespace that persists across :meth:`PersistentREPL.execute`
calls, so a variable defined on one turn is there on the next::

    repl = PersistentREPL(context="a long document ...", lm_callback=my_lm)
    repl.execute("n = len(context)").stdout           # ''
    repl.execute("print(n)").stdout                    # '19' and a newline
    repl.execute("1/0").stderr                         # 'Traceback (most recent call last): ...'
    repl.close()                                       # removes the REPL's temporary directory

What model code sees (the *scaffold*, restored after every run so model code cannot keep it overwritten):

* ``context``: the episode's context (a ``str``, ``dict``, ...).
* ``FINAL_VAR(name)``: marks the variable ``name`` (or, given a non-string, the value itself) as the final
  answer; sets :attr:`PersistentREPL.final_value` and returns the answer's text.
* ``SHOW_VARS()``: a one-line summary of the variables model code defined.
* ``llm_query(prompt) -> str`` and ``llm_query_batched(prompts) -> list[str]``: only when ``lm_callback`` is given.
* ``rlm_query(prompt, context=None)`` and ``rlm_query_batched(prompts, contexts=None)``: when ``subcall_fn`` or
  ``lm_callback`` is given. With ``subcall_fn`` each call runs a sub-episode, and a child's text answer is parsed
  with :func:`ast.literal_eval` when it is a Python literal (``"[1, 2]"`` becomes a list), else returned as the
  string. Without it they fall back to ``llm_query``/``llm_query_batched``, as in skyrl-gym 0.4: the language
  model answers, its text is returned as is, and a ``context`` given is appended to the prompt, after a blank
  line and a ``Context:`` line (0.4 dropped it).

The helpers also take skyrl-gym 0.4's arguments: an optional ``model`` (ignored: the callbacks choose the model)
and ``rlm_query_batched(prompts, context_list=...)``. Their 0.4 private names (``_llm_query``,
``_llm_query_batched``, ``_rlm_query``, ``_rlm_query_batched``) are aliases of the public methods.

The helpers are the methods of :class:`~skyrl_gym.envs.rlm.queries.ModelQueries`, a base class of the REPL.
Helper failures never raise into model code: a failed item reads ``"Error: LM query failed - <why>"`` or
``"Error: RLM query failed - <why>"``, and in batched calls only the failing items do; results keep the order
of the prompts.

Isolation. The default, ``isolation="inline"``, runs model code in the caller's process, as skyrl-gym 0.4 did:
:attr:`PersistentREPL.globals` is the namespace itself, a ``dict`` of this process. Its builtins are restricted:
``__import__``, ``open``, ``eval``, ``exec``, ``compile``, ``input``, ``globals`` and ``locals`` (and the
interactive ``help`` and ``breakpoint``) are ``None``, so ``import re`` fails with a ``TypeError`` unless
``allowed_imports`` names the module. These restrictions are guard rails against accidents, *not* a security
boundary: Python code in the same process can always reach the interpreter's internals. For untrusted models use
``isolation="process"``: the same REPL runs in a child Python process with resource limits that the parent can
kill (see :mod:`skyrl_gym.envs.rlm._process`).

Timeouts (``timeout`` seconds per run, wall clock, helper calls included). On the main thread a ``SIGALRM``
timer interrupts model code, which then sees a :class:`REPLTimeoutError` (a ``BaseException``, so ``except
Exception`` does not catch it; the timer re-fires every 0.1 s while model code still runs). The caller's own
``SIGALRM`` handler and timer are restored afterwards, and an earlier deadline of theirs is honoured. On any other
thread the code runs in a helper thread that is joined with the timeout and then sent asynchronous
:class:`REPLTimeoutError` exceptions for up to a second. REPLs nest (``rlm_query`` may run a child episode's REPL
inside model code): each run catches only its own REPL's timeout, so an enclosing REPL's deadline still ends the
enclosing run. Neither mechanism can stop code blocked inside a C call, nor code that keeps catching
``BaseException`` in a loop: an in-process thread cannot be killed. Such a run is reported as timed out and left
running in the background (:attr:`REPLResult.still_running`); only ``isolation="process"`` guarantees the
timeout.

Output. ``print`` in model code writes to the run's own buffer (``sys.stdout`` is never swapped, so concurrent
REPLs in other threads do not mix output); each of ``stdout`` and ``stderr`` keeps its first
``max_output_chars`` characters (20,000 by default) and then a one-line truncation note.
"""

from __future__ import annotations

import builtins
import itertools
import shutil
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Collection, Sequence
from types import TracebackType
from typing import Any, Final, Literal, Self

from skyrl_gym.envs.rlm._process import ProcessBackend
from skyrl_gym.envs.rlm._timeouts import Limit, Outcome, REPLTimeoutError, own_timeout_type, run_with_timeout, shield
from skyrl_gym.envs.rlm.queries import ModelQueries

# Also importable from this module: the queries' prompt and answer conversions, and the functions that answer them.
from skyrl_gym.envs.rlm.queries import fallback_prompt as fallback_prompt
from skyrl_gym.envs.rlm.queries import parse_child_answer as parse_child_answer
from skyrl_gym.envs.rlm.results import (
    LM_ERROR_PREFIX,
    RLM_ERROR_PREFIX,
    CappedText,
    LMCallback,
    REPLResult,
    REPLStartError,
    SubcallFn,
    cap_text,
)
from skyrl_gym.envs.rlm.results import lm_texts as lm_texts
from skyrl_gym.envs.rlm.results import subcall_value as subcall_value

__all__ = [
    "BLOCKED_BUILTINS",
    "DEFAULT_MAX_OUTPUT_CHARS",
    "DEFAULT_TIMEOUT_S",
    "LM_ERROR_PREFIX",
    "RLM_ERROR_PREFIX",
    "SCAFFOLD_NAMES",
    "LMCallback",
    "PersistentREPL",
    "REPLIsolation",
    "REPLResult",
    "REPLStartError",
    "REPLTimeoutError",
    "SubcallFn",
]

REPLIsolation = Literal["inline", "process"]

DEFAULT_TIMEOUT_S: Final = 180.0
DEFAULT_MAX_OUTPUT_CHARS: Final = 20_000

BLOCKED_BUILTINS: Final = (
    "__import__",
    "open",
    "eval",
    "exec",
    "compile",
    "input",
    "globals",
    "locals",
    # Interactive helpers: they read the terminal or start a pager, which would hang an unattended run.
    "help",
    "breakpoint",
)
"""Builtins that are ``None`` in the REPL (``__import__`` is replaced by a filter when imports are allowed)."""

SCAFFOLD_NAMES: Final = (
    "FINAL_VAR",
    "SHOW_VARS",
    "context",
    "llm_query",
    "llm_query_batched",
    "rlm_query",
    "rlm_query_batched",
)
"""Names the REPL defines for model code and restores after every run (helpers only when a callback backs them)."""

_BLOCKED_HINT: Final = (
    "Note: import statements, open, eval, exec, compile, input, globals and locals are disabled in this REPL."
)


def _make_print(buffer: CappedText) -> Callable[..., None]:
    """A ``print`` that writes to ``buffer`` unless given an explicit ``file``."""

    def repl_print(
        *values: object, sep: str | None = " ", end: str | None = "\n", file: Any = None, flush: bool = False
    ) -> None:
        if file is not None:
            print(*values, sep=sep, end=end, file=file, flush=flush)
            return
        sep = " " if sep is None else sep
        end = "\n" if end is None else end
        buffer.write(sep.join(str(value) for value in values) + end)

    return repl_print


def _make_import_filter(allowed: frozenset[str]) -> Callable[..., Any]:
    """An ``__import__`` that imports only modules whose top-level package is in ``allowed``."""

    def guarded_import(
        name: str,
        globals: dict[str, Any] | None = None,
        locals: dict[str, Any] | None = None,
        fromlist: Sequence[str] = (),
        level: int = 0,
    ) -> Any:
        if level != 0 or name.partition(".")[0] not in allowed:
            shown = "(relative import)" if level else repr(name)
            raise ImportError(f"import of {shown} is not allowed in this REPL; allowed: {sorted(allowed)}")
        return builtins.__import__(name, globals, locals, fromlist, level)

    return guarded_import


def restricted_builtins(allowed_imports: Collection[str] | None = None) -> dict[str, Any]:
    """The builtins of a REPL: every builtin, with :data:`BLOCKED_BUILTINS` set to ``None``.

    Args:
        allowed_imports: Top-level module names ``import`` may load. ``None`` or empty: ``__import__`` is
            ``None`` too, as in skyrl-gym 0.4.
    """
    namespace = dict(vars(builtins))
    for name in BLOCKED_BUILTINS:
        namespace[name] = None
    if allowed_imports:
        namespace["__import__"] = _make_import_filter(frozenset(allowed_imports))
    return namespace


def _format_error(exc: BaseException, sources: dict[str, str]) -> str:
    """A traceback of ``exc`` starting at model code, with source lines of earlier runs filled in."""
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    frames: list[traceback.FrameSummary] = []
    for summary in traceback.extract_tb(exc.__traceback__):
        source = sources.get(summary.filename)
        if source is None:
            if frames:  # frames before the first model frame are the REPL's own
                frames.append(summary)
            continue
        lines = source.splitlines()
        lineno = summary.lineno or 0
        line = lines[lineno - 1] if 0 < lineno <= len(lines) else None
        frames.append(traceback.FrameSummary(summary.filename, lineno, summary.name, line=line))
    text = "".join(traceback.format_exception_only(type(exc), exc))
    if frames:
        text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) + text
    if isinstance(exc, TypeError) and "'NoneType' object is not callable" in str(exc):
        text += _BLOCKED_HINT + "\n"
    return text


def _one_line(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return lines[-1].strip() if lines else type(exc).__name__


class PersistentREPL(ModelQueries):
    """A Python namespace that model code runs in, turn after turn.

    Args:
        context: The value of ``context`` in the REPL. With ``isolation="process"`` it must be JSON-serialisable.
        lm_callback: Answers prompts for ``llm_query``/``llm_query_batched``; without it they are not defined.
        subcall_fn: Runs sub-episodes for ``rlm_query``/``rlm_query_batched``; without it they are not defined.
        timeout: Wall-clock seconds each :meth:`execute` may run (see the module docstring for what is enforced).
        max_output_chars: Characters of ``stdout`` and of ``stderr`` kept per run.
        allowed_imports: Top-level modules ``import`` may load (e.g. ``{"re", "json", "math"}``); ``None``
            keeps ``__import__`` disabled, the skyrl-gym 0.4 behaviour.
        isolation: ``"inline"`` (default): run in this process. ``"process"``: run in a child process that has
            resource limits and is killed if a run outlives its timeout.
        memory_limit_mb: Address-space limit of the child process (``isolation="process"`` only).

    Attributes:
        globals: The REPL namespace (builtins, scaffold and model variables), a ``dict`` of this process. With
            ``isolation="process"`` model variables live in the child and this dict holds only the scaffold.
        locals: The same dict as ``globals``: one namespace, so functions defined in the REPL see top-level names.
        final_value: The text of the answer marked with ``FINAL_VAR`` in model code, or ``None``.
        temp_dir: The REPL's private scratch directory (the child's working directory with
            ``isolation="process"``); :meth:`close` removes it.
        timeout: The per-run timeout in seconds.

    The REPL is owned by one episode: runs are serialised by a lock, and :meth:`close` (idempotent, also called
    by ``with``, and at garbage collection or interpreter exit if forgotten) releases the directory and any
    child process.

    Raises:
        ValueError: An argument is out of range.
        TypeError: ``isolation="process"`` with a context that is not JSON-serialisable.
        REPLStartError: ``isolation="process"`` and the child process did not start.
    """

    def __init__(
        self,
        context: Any = None,
        lm_callback: LMCallback | None = None,
        subcall_fn: SubcallFn | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        allowed_imports: Collection[str] | None = None,
        isolation: REPLIsolation = "inline",
        memory_limit_mb: int = 4096,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_output_chars < 1:
            raise ValueError(f"max_output_chars must be at least 1, got {max_output_chars}")
        if isolation not in ("inline", "process"):
            raise ValueError(f"isolation must be 'inline' or 'process', got {isolation!r}")
        self.timeout = float(timeout)
        self.max_output_chars = max_output_chars
        self.lm_callback = lm_callback
        self.subcall_fn = subcall_fn
        self.isolation: REPLIsolation = isolation
        self.final_value: str | None = None
        self.temp_dir = tempfile.mkdtemp(prefix="skyrl-rlm-repl-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.temp_dir, ignore_errors=True)
        self._lock = threading.Lock()
        self._runs = itertools.count(1)
        self._sources: dict[str, str] = {}
        self._pristine_builtins = restricted_builtins(allowed_imports)
        self._builtins: dict[str, Any] = dict(self._pristine_builtins)
        self._scaffold = self._make_scaffold(context)
        self.globals: dict[str, Any] = {"__name__": "__main__", "__builtins__": self._builtins, **self._scaffold}
        self._limit = Limit(self.globals, self.timeout, own_timeout_type())
        self._backend: ProcessBackend | None = None
        if isolation == "process":
            self._backend = self._start_backend(context, allowed_imports, memory_limit_mb)

    @property
    def locals(self) -> dict[str, Any]:
        """The REPL namespace; the same dict as :attr:`globals`."""
        return self.globals

    @property
    def final_value_set(self) -> bool:
        """Whether model code marked a final answer with ``FINAL_VAR``."""
        return self.final_value is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return not self._cleanup.alive

    def _make_scaffold(self, context: Any) -> dict[str, Any]:
        # Bound methods are created once, so the objects restored after each run are always the same ones.
        scaffold: dict[str, Any] = {"FINAL_VAR": self._final_var, "SHOW_VARS": self._show_vars, "context": context}
        if self.lm_callback is not None:
            scaffold["llm_query"] = self.llm_query
            scaffold["llm_query_batched"] = self.llm_query_batched
        if self.subcall_fn is not None or self.lm_callback is not None:  # without subcall_fn: the LM answers
            scaffold["rlm_query"] = self.rlm_query
            scaffold["rlm_query_batched"] = self.rlm_query_batched
        return scaffold

    def _start_backend(
        self, context: Any, allowed_imports: Collection[str] | None, memory_limit_mb: int
    ) -> ProcessBackend:
        try:
            return ProcessBackend(
                self,
                context=context,
                allowed_imports=sorted(allowed_imports) if allowed_imports else None,
                memory_limit_mb=memory_limit_mb,
            )
        except BaseException:
            self._cleanup()
            raise

    # ----------------------------------------------------------------------------------------------- running code

    def execute(self, code: str) -> REPLResult:
        """Run ``code`` in the REPL namespace and return what it printed and how it ended.

        Never raises for anything model code does (syntax errors, exceptions, ``SystemExit``, timeouts): those
        are reported in the result. Runs are serialised; the scaffold is restored after each.

        Raises:
            TypeError: ``code`` is not a ``str``.
            RuntimeError: The REPL is closed.
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        with self._lock:
            self._check_open()
            if self._backend is not None:
                return self._backend.execute(code)
            return self._execute_inline(code)

    def _execute_inline(self, code: str) -> REPLResult:
        filename = f"<repl cell {next(self._runs)}>"
        stdout = CappedText(self.max_output_chars)
        self._prepare_run(stdout)
        started = time.monotonic()
        try:
            compiled = compile(code, filename, "exec")
        except Exception as exc:  # SyntaxError, or ValueError/RecursionError/MemoryError on hostile source
            return self._result(stdout, Outcome(error=exc), started)
        self._sources[filename] = code
        try:
            outcome = self._run_user(lambda: exec(compiled, self.globals))
        finally:
            self._restore_scaffold()
        return self._result(stdout, outcome, started)

    def _prepare_run(self, stdout: CappedText) -> None:
        # Model code may have edited the builtins dict in place; start every run from the pristine copy.
        self._builtins.clear()
        self._builtins.update(self._pristine_builtins)
        self._builtins["print"] = _make_print(stdout)
        self._restore_scaffold()

    def _restore_scaffold(self) -> None:
        self.globals["__builtins__"] = self._builtins
        self.globals.update(self._scaffold)

    def _run_user(self, run: Callable[[], None]) -> Outcome:
        """Run a callable that executes model code, under the timeout."""
        return run_with_timeout(run, self._limit)

    def _result(self, stdout: CappedText, outcome: Outcome, started: float) -> REPLResult:
        stderr, error = "", None
        if outcome.timed_out:
            error = f"REPLTimeoutError: execution exceeded the {self.timeout:g} s time limit"
            stderr = error + "\n"
            if outcome.still_running:
                stderr += "The code could not be stopped and keeps running in the background.\n"
        elif outcome.error is not None:
            stderr = _format_error(outcome.error, self._sources)
            error = _one_line(outcome.error)
        return REPLResult(
            stdout=stdout.getvalue(),
            stderr=cap_text(stderr, self.max_output_chars),
            error=error,
            timed_out=outcome.timed_out,
            still_running=outcome.still_running,
            execution_time=time.monotonic() - started,
        )

    def lookup_text(self, name: str) -> str | None:
        """``str()`` of the REPL variable ``name`` (quotes and spaces around it are ignored).

        Returns ``None`` when there is no such variable, or when converting it raised or timed out.
        """
        name = name.strip().strip("'\"").strip()
        with self._lock:
            self._check_open()
            if self._backend is not None:
                return self._backend.lookup_text(name)
            if name == "__builtins__" or name not in self.globals:
                return None
            value = self.globals[name]
            texts: list[str] = []
            outcome = self._run_user(lambda: texts.append(str(value)))
            return texts[0] if texts and outcome.error is None and not outcome.timed_out else None

    # ------------------------------------------------------------------------------------ scaffold for model code

    def _final_var(self, variable: Any) -> str:
        """``FINAL_VAR`` in model code: mark a variable (by name) or a value as the final answer."""
        value = variable
        if isinstance(variable, str):
            name = variable.strip().strip("'\"").strip()
            if name.isidentifier():
                if name not in self.globals or name == "__builtins__":
                    raise NameError(
                        f"FINAL_VAR: no variable named {name!r}; assign it first, or answer with FINAL(...) "
                        "in your reply"
                    )
                value = self.globals[name]
        text = str(value)
        self.final_value = text
        return text

    def _show_vars(self) -> str:
        """``SHOW_VARS`` in model code: the names and types of the variables model code defined."""
        shown = [
            f"{name}: {type(value).__name__}"
            for name, value in self.globals.items()
            if not name.startswith("_") and name not in self._scaffold
        ]
        return "Variables: " + ", ".join(shown) if shown else "No variables defined yet."

    # ------------------------------------------------------------------------------------------------- lifecycle

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this PersistentREPL is closed")

    def close(self) -> None:
        """Stop the child process (if any) and remove :attr:`temp_dir`. Idempotent."""
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()
        self._cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"PersistentREPL(isolation={self.isolation!r}, timeout={self.timeout:g}, {state})"


shield(PersistentREPL.close, PersistentREPL._prepare_run, PersistentREPL._restore_scaffold)
