"""The pause gate every engine uses to implement ``pause``/``resume`` and quiet weight updates.

Semantics (shared by all engines so they behave alike):

- ``generate`` enters the gate; while the gate is paused it waits at the door.
- ``pause()`` closes the door and returns once every call already inside has finished, so a weight update that
  follows cannot change the weights under a running sequence.
- ``resume()`` opens the door; waiting calls proceed.

asyncio primitives belong to one event loop. The gate recreates its condition when it is used from a new loop
while idle, so an engine keeps working across successive ``asyncio.run`` calls (a synchronous training loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol


class Pausable(Protocol):
    """Anything with a pause state: :class:`PauseGate`, and the engines built on it."""

    @property
    def paused(self) -> bool:
        """Whether new work is held."""
        ...

    async def pause(self) -> None:
        """Hold new work; return once the target is quiet."""
        ...

    async def resume(self) -> None:
        """Let held work proceed."""
        ...


@asynccontextmanager
async def paused_during(target: Pausable) -> AsyncIterator[None]:
    """Run a block with ``target`` paused; restore its previous pause state afterwards (also on error)."""
    was_paused = target.paused
    await target.pause()
    try:
        yield
    finally:
        if not was_paused:
            await target.resume()


class PauseGate:
    """Admits work unless paused; :meth:`pause` waits until admitted work has left."""

    def __init__(self) -> None:
        self._paused = False
        self._active = 0
        self._condition: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def paused(self) -> bool:
        """Whether new work is held at the door."""
        return self._paused

    @property
    def active(self) -> int:
        """How many admitted units of work have not finished yet."""
        return self._active

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Wait while paused, then hold a place inside until the block exits (also on error or cancellation)."""
        condition = self._bound_condition()
        async with condition:
            await condition.wait_for(lambda: not self._paused)
            self._active += 1
        try:
            yield
        finally:
            async with condition:
                self._active -= 1
                condition.notify_all()

    async def pause(self) -> None:
        """Hold new work; return once all admitted work has finished. Pausing twice is harmless."""
        condition = self._bound_condition()
        async with condition:
            self._paused = True
            await condition.wait_for(lambda: self._active == 0)

    async def resume(self) -> None:
        """Admit work again."""
        condition = self._bound_condition()
        async with condition:
            self._paused = False
            condition.notify_all()

    @asynccontextmanager
    async def quiesced(self) -> AsyncIterator[None]:
        """Run a block with no work inside and new work held; restores the previous pause state afterwards."""
        async with paused_during(self):
            yield

    def _bound_condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._condition is None or self._loop is not loop:
            if self._condition is not None and self._active:
                raise RuntimeError("an engine is in use from two event loops at once; use it from one loop")
            self._condition = asyncio.Condition()
            self._loop = loop
        return self._condition
