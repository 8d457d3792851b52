"""Async entry points that keep the event loop responsive while envs block.

``await ainit(env, prompt)``, ``await astep(env, action)`` and ``await aclose(env)`` run the env's blocking
``init``/``step``/``close`` in a bounded thread pool, so thousands of rollouts can share one event loop without
one slow step (a subprocess, an HTTP call, a SQL query) stalling the others.

Native async protocol: an env that can do its work without blocking defines ``async def ainit(self, prompt)``,
``async def astep(self, action)`` and/or ``async def aclose(self)``. When the method exists it is awaited on the
event loop instead of running the blocking one in a thread. Each of the three is optional and independent. Such
a method must be a coroutine function (or return an awaitable); anything else raises ``TypeError``.

Threads: calls for one env are never overlapped by these functions as long as the caller awaits each before the
next (the normal rollout loop), so envs need no locking. Context variables are copied into the worker thread.
Cancelling the awaiting task does not stop a step already running in a thread: it finishes in the background.

Pool size: by default ``min(32, os.cpu_count() + 4)`` threads, created on first use. Change it with
:func:`configure` or pass your own :class:`EnvRunner` as ``runner=``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

__all__ = ["EnvRunner", "aclose", "ainit", "astep", "configure", "default_runner"]

R = TypeVar("R")
ActT_contra = TypeVar("ActT_contra", contravariant=True)
OutT_co = TypeVar("OutT_co", covariant=True)


class SupportsInit(Protocol[OutT_co]):
    """An env with a blocking ``init(prompt)``."""

    def init(self, prompt: Any, /) -> OutT_co:
        """Start the episode."""
        ...


class SupportsStep(Protocol[ActT_contra, OutT_co]):
    """An env with a blocking ``step(action)``."""

    def step(self, action: ActT_contra, /) -> OutT_co:
        """Take one step."""
        ...


class SupportsClose(Protocol):
    """An env with a blocking ``close()``."""

    def close(self) -> None:
        """Release resources."""
        ...


def _default_max_workers() -> int:
    # The same default as ThreadPoolExecutor: env work is mostly waiting on subprocesses and sockets.
    return min(32, (os.cpu_count() or 1) + 4)


class EnvRunner:
    """A bounded thread pool for blocking env calls, with async ``ainit``/``astep``/``aclose``.

    The pool is created on first use. Use one runner per process (the module-level functions share a default
    one) or one per component that needs its own concurrency limit.

    Args:
        max_workers: Most env calls running at once; further calls queue. Default ``min(32, cpu_count + 4)``.
        thread_name_prefix: Name prefix of the worker threads (visible in stack dumps).
    """

    def __init__(self, max_workers: int | None = None, *, thread_name_prefix: str = "skyrl-gym-env") -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.max_workers = max_workers if max_workers is not None else _default_max_workers()
        self._thread_name_prefix = thread_name_prefix
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.max_workers, thread_name_prefix=self._thread_name_prefix
                )
            return self._executor

    async def run(self, func: Callable[..., R], *args: Any) -> R:
        """Run ``func(*args)`` in the pool with the caller's context variables and await its result."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        call = functools.partial(context.run, func, *args)
        return await loop.run_in_executor(self._get_executor(), call)

    async def ainit(self, env: SupportsInit[R], prompt: Any) -> R:
        """``env.init(prompt)``, awaited natively if the env defines ``async def ainit``."""
        native = getattr(env, "ainit", None)
        if native is not None:
            result: R = await _await_native(env, "ainit", native(prompt))
            return result
        return await self.run(env.init, prompt)

    async def astep(self, env: SupportsStep[ActT_contra, R], action: ActT_contra) -> R:
        """``env.step(action)``, awaited natively if the env defines ``async def astep``."""
        native = getattr(env, "astep", None)
        if native is not None:
            result: R = await _await_native(env, "astep", native(action))
            return result
        return await self.run(env.step, action)

    async def aclose(self, env: SupportsClose) -> None:
        """``env.close()``, awaited natively if the env defines ``async def aclose``."""
        native = getattr(env, "aclose", None)
        if native is not None:
            await _await_native(env, "aclose", native())
            return
        await self.run(env.close)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the worker threads (after queued calls finish when ``wait``). The runner can be used again."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=wait)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Joining threads blocks, so do it off the event loop.
        await asyncio.to_thread(self.shutdown, True)


async def _await_native(env: object, method: str, result: object) -> Any:
    if not inspect.isawaitable(result):
        raise TypeError(
            f"{type(env).__name__}.{method} must be an async method (async def); "
            f"calling it returned {type(result).__name__}, not an awaitable."
        )
    return await result


_default_runner: EnvRunner | None = None
_default_lock = threading.Lock()


def default_runner() -> EnvRunner:
    """The runner the module-level ``ainit``/``astep``/``aclose`` use (created on first call)."""
    global _default_runner
    with _default_lock:
        if _default_runner is None:
            _default_runner = EnvRunner()
        return _default_runner


def configure(max_workers: int | None = None) -> EnvRunner:
    """Replace the default runner with one of ``max_workers`` threads; calls already running finish.

    Returns:
        The new default runner.
    """
    global _default_runner
    new_runner = EnvRunner(max_workers)
    with _default_lock:
        old_runner, _default_runner = _default_runner, new_runner
    if old_runner is not None:
        old_runner.shutdown(wait=False)
    return new_runner


async def ainit(env: SupportsInit[R], prompt: Any, *, runner: EnvRunner | None = None) -> R:
    """Await ``env.init(prompt)`` without blocking the event loop (see the module docstring)."""
    return await (runner or default_runner()).ainit(env, prompt)


async def astep(env: SupportsStep[ActT_contra, R], action: ActT_contra, *, runner: EnvRunner | None = None) -> R:
    """Await ``env.step(action)`` without blocking the event loop (see the module docstring)."""
    return await (runner or default_runner()).astep(env, action)


async def aclose(env: SupportsClose, *, runner: EnvRunner | None = None) -> None:
    """Await ``env.close()`` without blocking the event loop (see the module docstring)."""
    await (runner or default_runner()).aclose(env)
