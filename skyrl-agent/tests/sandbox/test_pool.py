"""The warm pool on the in-memory backend: ownership of every sandbox it creates, failures, backoff."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from skyrl_agent.sandbox import InMemoryBackend, SandboxSpec, WarmPool
from skyrl_agent.sandbox.base import SandboxStartError, SandboxUnavailableError
from skyrl_agent.sandbox.memory import InMemorySandbox
from skyrl_agent.sandbox.pool import MAX_BACKOFF_S, backoff_s


class Backend:
    """An in-memory backend whose first ``failures`` creations fail, with hooks into each creation.

    ``before_return`` runs just before a sandbox is handed to the pool (in the same loop turn as its delivery).
    ``at_call[n]`` is set when creation number ``n`` (1-based) begins.
    """

    name = "memory"

    def __init__(self, failures: int = 0) -> None:
        self.inner = InMemoryBackend()
        self.failures = failures
        self.calls = 0
        self.created: list[InMemorySandbox] = []
        self.before_return: Callable[[], None] | None = None
        self.at_call: dict[int, asyncio.Event] = {}

    async def create(self, spec: SandboxSpec) -> InMemorySandbox:
        self.calls += 1
        if self.calls in self.at_call:
            self.at_call[self.calls].set()
        if self.calls <= self.failures:
            raise SandboxStartError(f"creation {self.calls} failed")
        sandbox = await self.inner.create(spec)
        self.created.append(sandbox)
        if self.before_return is not None:
            self.before_return()
        return sandbox

    async def fork(self, snapshot: object, n: int, spec: SandboxSpec) -> list[InMemorySandbox]:
        raise NotImplementedError

    async def close(self) -> None:
        await self.inner.close()


def closed(sandbox: InMemorySandbox) -> bool:
    return not sandbox.root.exists()


class Sleeps:
    """A fake ``asyncio.sleep`` for the refill's backoff: records the waits and returns at once.

    ``entered`` is set on every call; while ``hold`` is set to an event, a call waits for it; call number
    ``fail_at`` (1-based) raises, which kills the refill task.
    """

    def __init__(self, fail_at: int | None = None) -> None:
        self.delays: list[float] = []
        self.fail_at = fail_at
        self.entered = asyncio.Event()
        self.hold: asyncio.Event | None = None

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_at is not None and len(self.delays) >= self.fail_at:
            raise RuntimeError("the refill broke")
        await asyncio.sleep(0)


def test_acquire_release_close_own_every_sandbox() -> None:
    async def main() -> None:
        backend = Backend()
        pool = WarmPool(backend, SandboxSpec(), size=1)
        sandbox = await pool.acquire()
        assert (await sandbox.run("echo pooled")).output == "pooled\n"
        await pool.release(sandbox)
        assert closed(sandbox)
        await pool.close()
        assert backend.created
        assert all(closed(s) for s in backend.created)

    asyncio.run(main())


def test_sandbox_delivered_to_an_acquirer_cancelled_in_the_same_turn_stays_owned() -> None:
    async def main() -> None:
        backend = Backend()
        pool = WarmPool(backend, SandboxSpec(), size=0)  # creates only for waiters
        acquirer = asyncio.create_task(pool.acquire())
        # The cancellation runs after the sandbox is created and before the acquirer resumes with it.
        backend.before_return = lambda: asyncio.get_running_loop().call_soon(acquirer.cancel)
        with pytest.raises(asyncio.CancelledError):
            await acquirer
        (sandbox,) = backend.created
        assert pool.ready == 1  # back in the pool, unused
        backend.before_return = None
        assert await pool.acquire() is sandbox
        await pool.release(sandbox)
        await pool.close()
        assert all(closed(s) for s in backend.created)

    asyncio.run(main())


def test_cancelled_acquirer_after_close_gets_its_sandbox_closed() -> None:
    async def main() -> None:
        backend = Backend()
        pool = WarmPool(backend, SandboxSpec(), size=0)
        acquirer = asyncio.create_task(pool.acquire())
        closing: list[asyncio.Future[None]] = []

        def cancel_and_close() -> None:
            # Both run before the acquirer resumes with its sandbox: it finds the pool closed.
            asyncio.get_running_loop().call_soon(acquirer.cancel)
            closing.append(asyncio.ensure_future(pool.close()))

        backend.before_return = cancel_and_close
        with pytest.raises(asyncio.CancelledError):
            await acquirer
        await closing[0]
        (sandbox,) = backend.created
        assert closed(sandbox)

    asyncio.run(main())


def test_creation_failure_reaches_the_waiting_acquirer() -> None:
    async def main() -> None:
        backend = Backend(failures=1)
        pool = WarmPool(backend, SandboxSpec(), size=0, sleep=Sleeps())
        with pytest.raises(SandboxStartError, match="creation 1"):
            await pool.acquire()
        sandbox = await pool.acquire()
        await pool.release(sandbox)
        await pool.close()

    asyncio.run(main())


def test_backoff_doubles_then_stays_capped_for_any_streak() -> None:
    assert [backoff_s(n) for n in range(7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, MAX_BACKOFF_S]
    assert backoff_s(1024) == backoff_s(10**9) == MAX_BACKOFF_S


def test_refill_survives_a_long_failure_streak_with_capped_backoff() -> None:
    async def main() -> None:
        streak = 1100  # more than 1,024: 0.5 * 2**1024 s does not fit in a float
        backend = Backend(failures=streak)
        backend.at_call[streak + 1] = asyncio.Event()
        sleeps = Sleeps()
        pool = WarmPool(backend, SandboxSpec(), size=1, rate_per_s=1e6, max_concurrent=1, sleep=sleeps)
        pool.start()
        try:
            await asyncio.wait_for(backend.at_call[streak + 1].wait(), timeout=10)  # a guard, not a wait
            sandbox = await asyncio.wait_for(pool.acquire(), timeout=10)
            await pool.release(sandbox)
        finally:
            await pool.close()
        assert len(sleeps.delays) >= streak - 1
        assert max(sleeps.delays) == MAX_BACKOFF_S
        assert sleeps.delays[:3] == [1.0, 2.0, 4.0]
        assert all(closed(s) for s in backend.created)

    asyncio.run(main())


def test_a_dead_refill_fails_acquirers_instead_of_hanging() -> None:
    async def main() -> None:
        backend = Backend(failures=10**6)
        sleeps = Sleeps(fail_at=1)
        sleeps.hold = asyncio.Event()
        pool = WarmPool(backend, SandboxSpec(), size=1, rate_per_s=1e6, sleep=sleeps)
        pool.start()
        await sleeps.entered.wait()  # the first creation failed; the refill is in its backoff
        waiting = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)  # let it register as a waiter: the refill is held, so nothing is created
        sleeps.hold.set()  # now the refill dies
        with pytest.raises(SandboxUnavailableError, match="refill stopped") as info:
            await asyncio.wait_for(waiting, timeout=10)  # a guard against the hang, not a wait
        assert isinstance(info.value.__cause__, RuntimeError)
        with pytest.raises(SandboxUnavailableError, match="refill stopped"):
            await asyncio.wait_for(pool.acquire(), timeout=10)
        await pool.close()  # closing a broken pool still works
        assert backend.calls == 1

    asyncio.run(main())
