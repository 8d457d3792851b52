"""Many runs at once, from threads and from asyncio, each with its own result; cancellation cleans up."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from skyrl_gym.sandbox import CodeExecutor, SandboxLimits

SQUARE = "import sys\nn = int(sys.stdin.read())\nprint(n * n)\nprint(n, file=sys.stderr)"


def test_parallel_threads(shared_executor: CodeExecutor) -> None:
    with ThreadPoolExecutor(max_workers=4) as threads:
        results = list(threads.map(lambda n: shared_executor.run(SQUARE, stdin=str(n)), range(12)))
    assert [r.stdout for r in results] == [f"{n * n}\n" for n in range(12)]
    assert [r.stderr for r in results] == [f"{n}\n" for n in range(12)]
    assert all(r.exit_code == 0 for r in results)


def test_parallel_asyncio(shared_executor: CodeExecutor) -> None:
    async def main() -> list[str]:
        results = await asyncio.gather(*(shared_executor.arun(SQUARE, stdin=str(n)) for n in range(12)))
        return [r.stdout for r in results]

    assert asyncio.run(main()) == [f"{n * n}\n" for n in range(12)]


def test_async_timeout_does_not_block_other_runs(shared_executor: CodeExecutor) -> None:
    async def main() -> tuple[bool, list[str]]:
        slow = asyncio.ensure_future(
            shared_executor.arun("import time; time.sleep(60)", limits=SandboxLimits(timeout_s=1.5))
        )
        quick = [await shared_executor.arun(f"print({n})") for n in range(3)]
        return (await slow).timed_out, [r.stdout for r in quick]

    timed_out, outputs = asyncio.run(main())
    assert timed_out
    assert outputs == ["0\n", "1\n", "2\n"]


def test_cancelled_async_run_is_killed(shared_executor: CodeExecutor, host: Any) -> None:
    tag = f"{uuid.uuid4().int % 10**6}.321"  # the sleeping process is found on the host by this argument

    async def main() -> None:
        task = asyncio.ensure_future(shared_executor.arun(f"import os\nos.execvp('sleep', ['sleep', '{tag}'])"))
        assert await asyncio.to_thread(host.wait_until, lambda: bool(host.processes_with_argument(tag)))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert host.wait_until(lambda: not host.processes_with_argument(tag))
    host.assert_healthy(shared_executor)


def test_more_runs_than_the_pool_holds(shared_executor: CodeExecutor) -> None:
    # Runs beyond the pool size start their own interpreter; all still succeed.
    with ThreadPoolExecutor(max_workers=6) as threads:
        results = list(threads.map(lambda n: shared_executor.run(f"print({n})"), range(6)))
    assert sorted(r.stdout for r in results) == sorted(f"{n}\n" for n in range(6))
