"""``within``: results that finish as the caller gives up are handed to ``discard``, never dropped."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from skyrl_agent.dispatch import Deadline, DeadlineExceeded, PausableClock, within


def test_result_finished_in_the_turn_the_caller_is_cancelled_is_discarded() -> None:
    async def main() -> list[str]:
        discarded: list[str] = []
        caller: asyncio.Task[str] | None = None

        async def create() -> str:
            assert caller is not None
            # The cancellation runs after this result is set and before ``within`` sees it.
            asyncio.get_running_loop().call_soon(caller.cancel)
            return "sandbox"

        caller = asyncio.create_task(within(create(), discard=discarded.append))
        with pytest.raises(asyncio.CancelledError):
            await caller
        return discarded

    assert asyncio.run(main()) == ["sandbox"]


def test_result_of_work_that_outlives_its_deadline_is_discarded() -> None:
    async def main() -> list[str]:
        discarded: list[str] = []
        started = asyncio.Event()

        async def stubborn() -> str:
            started.set()
            # e.g. a create that finishes its work before it notices the cancellation
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
            return "late sandbox"

        deadline = Deadline(PausableClock(), 0.01, "sandbox_start")
        with pytest.raises(DeadlineExceeded):
            await within(stubborn(), deadline, discard=discarded.append)
        assert started.is_set()
        return discarded

    assert asyncio.run(main()) == ["late sandbox"]


def test_returned_and_failed_results_are_not_discarded() -> None:
    async def main() -> None:
        discarded: list[str] = []

        async def ok() -> str:
            return "mine"

        async def broken() -> str:
            raise ValueError("no result")

        assert await within(ok(), discard=discarded.append) == "mine"
        with pytest.raises(ValueError, match="no result"):
            await within(broken(), discard=discarded.append)
        assert discarded == []

    asyncio.run(main())
