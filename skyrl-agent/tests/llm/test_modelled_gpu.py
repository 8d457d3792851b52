"""The shared modelled GPU: FIFO queueing on its slots and its busy-time accounting, on a virtual clock."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from skyrl_agent.llm.base import SamplingParams, Usage
from skyrl_agent.llm.scripted import LatencyClient, ModelledGPU, ScriptedClient


class VirtualTime:
    """A clock and a ``sleep`` that jumps time forward once every task is blocked, so tests take no real time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._order), wake))
        await wake

    def run(self, main: Callable[[], Awaitable[Any]]) -> Any:
        async def drive() -> Any:
            task = asyncio.ensure_future(main())
            while not task.done():
                for _ in range(20):  # let every runnable task reach its next sleep
                    await asyncio.sleep(0)
                if self._sleepers and not task.done():
                    self.now, _, wake = heapq.heappop(self._sleepers)
                    if not wake.done():  # a cancelled sleeper's future is already done
                        wake.set_result(None)
            return task.result()

        return asyncio.run(drive())


def _gpu(vt: VirtualTime, capacity: int) -> ModelledGPU:
    # One token decodes in one second, nothing else costs time: a call's duration is its completion tokens.
    return ModelledGPU(
        capacity=capacity, decode_s_per_token=1.0, overhead_s=0.0, jitter=0.0, sleep=vt.sleep, clock=vt.clock
    )


def test_duration_is_overhead_plus_prefill_plus_decode() -> None:
    gpu = ModelledGPU(decode_s_per_token=0.01, prefill_s_per_token=0.001, overhead_s=0.5, jitter=0.0)
    assert gpu.duration_s(Usage(prompt_tokens=1000, completion_tokens=100)) == pytest.approx(0.5 + 1.0 + 1.0)


def test_calls_beyond_capacity_queue_fifo_and_are_accounted() -> None:
    vt = VirtualTime()
    gpu = _gpu(vt, capacity=2)
    finished: list[tuple[int, float]] = []

    async def call(index: int) -> None:
        await gpu.generate(Usage(completion_tokens=1))
        finished.append((index, vt.now))

    async def main() -> None:
        await asyncio.gather(*(call(i) for i in range(5)))

    vt.run(main)
    assert finished == [(0, 1.0), (1, 1.0), (2, 2.0), (3, 2.0), (4, 3.0)]
    stats = gpu.stats()
    assert stats.calls == 5
    assert stats.peak_active == 2
    assert stats.work_s == pytest.approx(5.0)
    assert stats.slot_s == pytest.approx(5.0)
    assert stats.busy_s == pytest.approx(3.0)
    assert stats.wait_s == pytest.approx(0 + 0 + 1 + 1 + 2)
    assert gpu.utilisation(3.0) == pytest.approx(5.0 / (2 * 3.0))


def test_idle_gaps_are_not_busy_time() -> None:
    vt = VirtualTime()
    gpu = _gpu(vt, capacity=4)

    async def main() -> None:
        await gpu.generate(Usage(completion_tokens=1))
        await vt.sleep(2.0)  # the agent runs a tool; the GPU idles
        await gpu.generate(Usage(completion_tokens=1))

    vt.run(main)
    assert vt.now == pytest.approx(4.0)
    assert gpu.stats().busy_s == pytest.approx(2.0)
    assert gpu.utilisation(vt.now) == pytest.approx(2.0 / (4 * 4.0))


def test_busy_time_counts_a_call_still_running() -> None:
    vt = VirtualTime()
    gpu = _gpu(vt, capacity=1)
    seen: list[float] = []

    async def main() -> None:
        call = asyncio.ensure_future(gpu.generate(Usage(completion_tokens=10)))
        await vt.sleep(4.0)
        seen.append(gpu.stats().busy_s)
        await call

    vt.run(main)
    assert seen == [pytest.approx(4.0)]
    assert gpu.stats().busy_s == pytest.approx(10.0)


def test_a_cancelled_call_frees_its_slot() -> None:
    vt = VirtualTime()
    gpu = _gpu(vt, capacity=1)

    async def main() -> float:
        first = asyncio.ensure_future(gpu.generate(Usage(completion_tokens=10)))
        await vt.sleep(1.0)
        first.cancel()
        await vt.sleep(0.0)
        await gpu.generate(Usage(completion_tokens=1))
        return vt.now

    assert vt.run(main) == pytest.approx(2.0)
    stats = gpu.stats()
    assert (stats.calls, gpu.active) == (1, 0)
    assert stats.work_s == pytest.approx(1.0)  # only finished calls count as work
    assert stats.slot_s == pytest.approx(2.0)  # the cancelled call held its slot for a second


def test_clients_sharing_a_gpu_compete_for_its_slots() -> None:
    vt = VirtualTime()
    gpu = _gpu(vt, capacity=2)
    clients = [LatencyClient(ScriptedClient(["abc"]), gpu=gpu, seed=i) for i in range(4)]  # 3 tokens: 3 s per call

    async def main() -> None:
        await asyncio.gather(*(client.complete([], SamplingParams()) for client in clients))

    vt.run(main)
    assert vt.now == pytest.approx(6.0)  # two waves of two
    assert all(client.peak_active == 2 for client in clients)
    assert gpu.stats().work_s == pytest.approx(12.0)


def test_private_gpus_do_not_wait_for_each_other() -> None:
    vt = VirtualTime()
    clients = [
        LatencyClient(ScriptedClient(["abc"]), base_s=0.0, per_token_s=1.0, jitter=0.0, sleep=vt.sleep)
        for _ in range(4)
    ]

    async def main() -> None:
        await asyncio.gather(*(client.complete([], SamplingParams()) for client in clients))

    vt.run(main)
    assert vt.now == pytest.approx(3.0)


def test_noise_follows_the_client_seed_not_the_call_order() -> None:
    gpu = ModelledGPU(jitter=0.5)
    usage = Usage(100, 100)
    first = [LatencyClient(ScriptedClient(["x"]), gpu=gpu, seed=s).duration_s(usage) for s in (1, 2)]
    second = [LatencyClient(ScriptedClient(["x"]), gpu=gpu, seed=s).duration_s(usage) for s in (2, 1)]
    assert first == second[::-1]
    assert first[0] != first[1]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ModelledGPU(capacity=0)
