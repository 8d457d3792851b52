"""Fewer full garbage collections while a dispatcher holds many live episodes.

CPython's cyclic collector walks every tracked object of the process in a full (oldest-generation) collection.
With 10⁴ live episodes the heap holds millions of objects, and with the interpreter's default thresholds
(700, 10, 10) the collector runs a full collection whenever ten young-generation collections have passed and a
quarter of the heap is new since the last one: thousands of interleaved episodes keep promoting short-lived objects
into the oldest generation, so full collections come often, each walking the whole heap. Measured on the chaos
benchmark's scale part (see ``docs/agent/benchmarks.md``), full collections took 41% of the dispatcher's CPU at 10⁴
episodes and the CPU per episode grew 1.76× from 10² to 10⁴; with the oldest generation's threshold at 100 it grows
≈1.1×.

:func:`fewer_full_collections` raises only that third threshold, only while a run is active, and puts the previous
value back when the last active run ends (runs may nest or overlap on one loop). Young generations are collected as
before, so cyclic garbage that dies young is freed as soon as it would be; garbage that reached the oldest
generation waits up to ten times as many young collections as by default.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["fewer_full_collections"]

_lock = threading.Lock()
_active = 0  # runs inside fewer_full_collections now
_saved: int | None = None  # the oldest generation's threshold before the first of them
_raised_to = 0  # the threshold set while they run (the largest asked for)


@contextmanager
def fewer_full_collections(threshold: int | None) -> Iterator[None]:
    """Run the body with the oldest generation's GC threshold at least ``threshold`` (None: leave it as it is).

    Raises:
        ValueError: ``threshold`` is below 1.
    """
    if threshold is None:
        yield
        return
    if threshold < 1:
        raise ValueError(f"the full-collection threshold must be at least 1 (got {threshold}); use None to keep GC's")
    _enter(threshold)
    try:
        yield
    finally:
        _exit()


def _enter(threshold: int) -> None:
    global _active, _saved, _raised_to
    with _lock:
        young, middle, oldest = gc.get_threshold()
        if _active == 0:
            _saved, _raised_to = oldest, oldest
        _active += 1
        if threshold > _raised_to:
            _raised_to = threshold
            gc.set_threshold(young, middle, threshold)


def _exit() -> None:
    global _active, _saved
    with _lock:
        _active -= 1
        if _active == 0 and _saved is not None:
            young, middle, oldest = gc.get_threshold()
            if oldest == _raised_to:  # someone else changed it meanwhile: theirs wins
                gc.set_threshold(young, middle, _saved)
            _saved = None
