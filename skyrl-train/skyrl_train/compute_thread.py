"""One thread for the torch work of the in-process components (policy, reference and critic backends, local engine).

Why. On a CPU, torch runs its kernels in OpenMP thread teams, one team per thread that calls into torch. As soon as
a second thread runs parallel torch work (the local engine generates on a worker thread, the trainer updates on
its own thread), libgomp manages more threads than there are CPUs and stops letting its idle workers spin between
parallel regions: each region then pays for waking them up. A decoding step of a small model is hundreds of small
regions, so generation on the 2-core benchmark machine took ≈0.65 s instead of ≈0.47 s for the same 64 × 64 tokens
(the update was unaffected). When every component computes on one shared thread there is one team, and its workers
keep spinning between regions.

Ownership: whoever creates a :class:`ComputeThread` closes it (``skyrl_train.run`` creates one per run when the
engine is the local one). Components given one run their work there and never close it; components without one
compute on the calling thread (the backends) or on a thread of their own (the local engine).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class ComputeThread:
    """A single worker thread that runs the calls handed to it, in order."""

    def __init__(self, name: str = "torch-compute") -> None:
        self._ident: int | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=self._remember)

    def _remember(self) -> None:
        self._ident = threading.get_ident()

    @property
    def is_current(self) -> bool:
        """Whether the caller is running on this compute thread."""
        return self._ident is not None and threading.get_ident() == self._ident

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the compute thread and return (or raise) what it did; blocks the caller.

        A call made from the compute thread itself runs inline (a component may call another from there).
        """
        if self.is_current:
            return fn(*args, **kwargs)
        return self._executor.submit(fn, *args, **kwargs).result()

    async def acall(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` on the compute thread without blocking the event loop.

        The event loop must not itself run on the compute thread (the call would wait for its own thread).
        """
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Finish the calls already handed over, then end the thread; idempotent. Later calls raise RuntimeError."""
        self._executor.shutdown(wait=True)
