"""How a REPL run is timed out in this process: ``SIGALRM`` on the main thread, asynchronous exceptions elsewhere.

:func:`run_with_timeout` runs a callable that executes model code under a :class:`Limit` and reports how it
ended (:class:`Outcome`); the mechanisms and their limits are described in :mod:`skyrl_gym.envs.rlm.repl`'s
docstring. A timeout is raised only while model code of the limit's namespace is on the stack, and never while
a function registered with :func:`shield` runs above it: REPL bookkeeping (restoring the scaffold, closing a
nested REPL, killing a child process) must not be cut in half.

This module imports nothing from the rest of the package, so the REPL and its child-process backend can both
register their bookkeeping here.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, Final, NamedTuple, Self

__all__ = ["Limit", "Outcome", "REPLTimeoutError", "own_timeout_type", "run_with_timeout", "shield"]

_ALARM_RETRY_S: Final = 0.1  # after the deadline, how often SIGALRM re-fires while model code still runs
_THREAD_STOP_GRACE_S: Final = 1.0  # how long a timed-out helper thread is sent timeouts before it is given up
_SHIELDED_CODE: set[CodeType] = set()  # code objects a timeout must not interrupt (see shield)


class REPLTimeoutError(BaseException):
    """Raised inside model code when its run exceeds the REPL's timeout.

    A ``BaseException`` so that ``except Exception`` in model code does not swallow it. It never escapes
    :meth:`PersistentREPL.execute`: the run is reported with ``timed_out=True``.
    """


@dataclasses.dataclass
class Outcome:
    """How a run of model code ended."""

    error: BaseException | None = None
    timed_out: bool = False
    still_running: bool = False


def shield(*functions: Callable[..., Any]) -> None:
    """Never raise a timeout while one of ``functions`` runs; it is retried 0.1 s later instead."""
    _SHIELDED_CODE.update(function.__code__ for function in functions)


def run_with_timeout(run: Callable[[], None], limit: Limit) -> Outcome:
    """Run a callable that executes model code under ``limit``: by ``SIGALRM`` where possible, else in a thread."""
    if _alarm_usable():
        return _run_with_alarm(run, limit)
    return _run_in_thread(run, limit)


def _interruptible(frame: FrameType | None, namespace: dict[str, Any]) -> bool:
    """Whether a timeout may be raised in the stack that ends at ``frame``.

    True when model code of ``namespace`` is on the stack and no shielded REPL bookkeeping (e.g. a nested REPL's
    ``close``) runs above it. A timeout that is not raised now is retried 0.1 s later.
    """
    while frame is not None:
        if frame.f_code in _SHIELDED_CODE:
            return False
        if frame.f_globals is namespace:
            return True
        frame = frame.f_back
    return False


class Limit(NamedTuple):
    """The timeout of one REPL: whose code it interrupts, after how long, and with which exception type."""

    namespace: dict[str, Any]
    seconds: float
    error: type[REPLTimeoutError]  # a subclass of the REPL's own, so nested REPLs never catch each other's

    def exceeded(self) -> REPLTimeoutError:
        return self.error(f"execution exceeded the {self.seconds:g} s time limit")


def own_timeout_type() -> type[REPLTimeoutError]:
    class OwnREPLTimeoutError(REPLTimeoutError):
        pass

    return OwnREPLTimeoutError


class _AlarmGuard:
    """Arms ``SIGALRM`` for one run on the main thread and restores the previous handler and timer after it.

    The handler raises the limit's timeout only where :func:`_interruptible` allows, so the REPL's own bookkeeping
    is never interrupted. An earlier deadline armed by someone else is honoured: an enclosing REPL's handler is
    called at its deadline (raising that REPL's timeout, which this run does not catch); any other timer (e.g. a
    test timeout) ends this run at its deadline and fires right after it.
    """

    def __init__(self, limit: Limit) -> None:
        self._limit = limit
        self._started = 0.0
        self._old_handler: Any = None
        self._old_timer = (0.0, 0.0)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        outer = self._old_handler
        own_deadline_passed = time.monotonic() - self._started >= self._limit.seconds
        if not own_deadline_passed and isinstance(getattr(outer, "__self__", None), _AlarmGuard):
            outer(signum, frame)
        elif _interruptible(frame, self._limit.namespace):
            raise self._limit.exceeded()

    def __enter__(self) -> Self:
        self._started = time.monotonic()
        self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
        self._old_timer = signal.getitimer(signal.ITIMER_REAL)
        first = self._limit.seconds if self._old_timer[0] <= 0 else min(self._limit.seconds, self._old_timer[0])
        signal.setitimer(signal.ITIMER_REAL, first, _ALARM_RETRY_S)
        return self

    def __exit__(self, *exc_info: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if self._old_handler is None else self._old_handler)
        old_delay, old_interval = self._old_timer
        if old_delay > 0:
            left = old_delay - (time.monotonic() - self._started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-4), old_interval)


def _alarm_usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _run_with_alarm(run: Callable[[], None], limit: Limit) -> Outcome:
    try:
        with _AlarmGuard(limit):
            run()
    except limit.error:
        return Outcome(timed_out=True)
    except (KeyboardInterrupt, REPLTimeoutError):
        raise  # an enclosing REPL's timeout must reach that REPL
    except BaseException as exc:  # model code may raise anything, SystemExit included
        return Outcome(error=exc)
    return Outcome()


def _raise_in_thread(thread_id: int, exc_type: type[BaseException] | None) -> None:
    """Ask CPython to raise ``exc_type`` in thread ``thread_id`` at its next bytecode (``None`` cancels)."""
    exc = ctypes.py_object(exc_type) if exc_type is not None else None
    with contextlib.suppress(AttributeError):  # not CPython: the thread cannot be interrupted
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc)


def _run_in_thread(run: Callable[[], None], limit: Limit) -> Outcome:
    """Run ``run`` in a helper thread; after the limit, send it timeouts for a grace period, then give up."""
    outcome = Outcome()
    finished = threading.Event()

    def target() -> None:
        try:
            try:
                run()
            except limit.error:
                outcome.timed_out = True
            except BaseException as exc:  # model code may raise anything, SystemExit included
                outcome.error = exc
            finally:
                finished.set()
        except limit.error:  # a late asynchronous timeout landed in the handlers above
            outcome.timed_out = True
            finished.set()

    thread = threading.Thread(target=target, name="rlm-repl-run", daemon=True)
    thread.start()
    if finished.wait(limit.seconds):
        return outcome
    stop_by = time.monotonic() + _THREAD_STOP_GRACE_S
    while not finished.is_set() and time.monotonic() < stop_by and thread.ident is not None:
        if _interruptible(sys._current_frames().get(thread.ident), limit.namespace):
            _raise_in_thread(thread.ident, limit.error)
        finished.wait(0.05)
    if finished.is_set():
        if thread.ident is not None:
            _raise_in_thread(thread.ident, None)  # cancel a timeout still pending after the thread finished
        return Outcome(timed_out=True)
    return Outcome(timed_out=True, still_running=True)
