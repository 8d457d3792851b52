import asyncio
import contextvars
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from skyrl_gym import async_env
from skyrl_gym.async_env import EnvRunner, aclose, ainit, astep
from skyrl_gym.envs import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")
PROMPT: ConversationType = [{"role": "user", "content": "hi"}]


class BlockingEnv(BaseTextEnv):
    """Every call sleeps (blocking) and records which thread ran it."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.threads: list[str] = []
        self.closed = False
        self.context_values: list[str] = []

    def _record(self) -> None:
        self.threads.append(threading.current_thread().name)
        self.context_values.append(REQUEST_ID.get())
        time.sleep(self.delay)

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        self._record()
        return prompt, {"started": True}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self._record()
        return {"observations": [], "reward": float(len(action)), "done": True, "metadata": {}}

    def close(self) -> None:
        self._record()
        self.closed = True


class ConcurrencyProbe(BaseTextEnv):
    """Tracks how many steps of all instances run at the same time."""

    lock = threading.Lock()
    running = 0
    peak = 0

    def step(self, action: str) -> BaseTextEnvStepOutput:
        cls = type(self)
        with cls.lock:
            cls.running += 1
            cls.peak = max(cls.peak, cls.running)
        time.sleep(0.05)
        with cls.lock:
            cls.running -= 1
        return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}


class NativeAsyncEnv(BlockingEnv):
    def __init__(self) -> None:
        super().__init__()
        self.native_calls: list[str] = []

    async def ainit(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        await asyncio.sleep(0)
        self.native_calls.append("ainit")
        return prompt, {"native": True}

    async def astep(self, action: str) -> BaseTextEnvStepOutput:
        await asyncio.sleep(0)
        self.native_calls.append("astep")
        return {"observations": [], "reward": 7.0, "done": True, "metadata": {}}

    async def aclose(self) -> None:
        self.native_calls.append("aclose")


class SyncAstepEnv(BlockingEnv):
    def astep(self, action: str) -> BaseTextEnvStepOutput:
        return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}


class FailingEnv(BlockingEnv):
    def step(self, action: str) -> BaseTextEnvStepOutput:
        raise RuntimeError(f"bad action {action!r}")


@pytest.fixture(autouse=True)
def _fresh_default_runner() -> Iterator[None]:
    yield
    async_env.configure()


def test_calls_run_in_worker_threads() -> None:
    env = BlockingEnv()

    async def episode() -> tuple[Any, Any]:
        init_result = await ainit(env, PROMPT)
        out = await astep(env, "abc")
        await aclose(env)
        return init_result, out

    init_result, out = asyncio.run(episode())
    assert init_result == (PROMPT, {"started": True})
    assert out["reward"] == 3.0
    assert env.closed
    assert len(env.threads) == 3
    assert all(name.startswith("skyrl-gym-env") for name in env.threads)
    assert threading.main_thread().name not in env.threads


def test_event_loop_keeps_running_during_a_blocking_step() -> None:
    env = BlockingEnv(delay=0.3)
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        await astep(env, "x")
        stop.set()
        await task

    asyncio.run(main())
    assert ticks >= 10  # ~30 expected; a blocked loop would tick once


def test_pool_is_bounded() -> None:
    ConcurrencyProbe.running = ConcurrencyProbe.peak = 0
    envs = [ConcurrencyProbe() for _ in range(8)]

    async def main() -> None:
        async with EnvRunner(max_workers=2) as runner:
            await asyncio.gather(*(runner.astep(env, "a") for env in envs))

    asyncio.run(main())
    assert ConcurrencyProbe.peak == 2


def test_many_envs_run_concurrently_up_to_the_bound() -> None:
    envs = [BlockingEnv(delay=0.2) for _ in range(4)]

    async def main() -> float:
        runner = EnvRunner(max_workers=4)
        start = time.monotonic()
        await asyncio.gather(*(runner.astep(env, "a") for env in envs))
        elapsed = time.monotonic() - start
        runner.shutdown()
        return elapsed

    assert asyncio.run(main()) < 0.6  # serial would take 0.8 s


def test_configure_replaces_the_default_runner() -> None:
    runner = async_env.configure(max_workers=3)
    assert async_env.default_runner() is runner
    assert runner.max_workers == 3
    env = BlockingEnv()
    asyncio.run(astep(env, "a"))
    assert env.threads


def test_explicit_runner_argument() -> None:
    env = BlockingEnv()
    runner = EnvRunner(max_workers=1, thread_name_prefix="custom-pool")
    asyncio.run(astep(env, "a", runner=runner))
    runner.shutdown()
    assert env.threads[0].startswith("custom-pool")


def test_runner_is_usable_after_shutdown() -> None:
    runner = EnvRunner(max_workers=1)
    env = BlockingEnv()
    asyncio.run(runner.astep(env, "a"))
    runner.shutdown()
    asyncio.run(runner.astep(env, "b"))
    runner.shutdown()
    assert len(env.threads) == 2


def test_invalid_pool_size() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        EnvRunner(max_workers=0)


def test_default_pool_size() -> None:
    assert 1 <= EnvRunner().max_workers <= 32


def test_native_async_methods_are_awaited_instead_of_threads() -> None:
    env = NativeAsyncEnv()

    async def episode() -> tuple[Any, Any]:
        init_result = await ainit(env, PROMPT)
        out = await astep(env, "a")
        await aclose(env)
        return init_result, out

    init_result, out = asyncio.run(episode())
    assert init_result == (PROMPT, {"native": True})
    assert out["reward"] == 7.0
    assert env.native_calls == ["ainit", "astep", "aclose"]
    assert env.threads == []  # the blocking methods never ran
    assert not env.closed


def test_native_methods_are_independent() -> None:
    class OnlyAsyncStep(BlockingEnv):
        async def astep(self, action: str) -> BaseTextEnvStepOutput:
            return {"observations": [], "reward": -1.0, "done": True, "metadata": {}}

    env = OnlyAsyncStep()

    async def episode() -> Any:
        await ainit(env, PROMPT)
        return await astep(env, "a")

    assert asyncio.run(episode())["reward"] == -1.0
    assert len(env.threads) == 1  # init ran in the pool, step natively


def test_sync_astep_is_rejected() -> None:
    with pytest.raises(TypeError, match="async def"):
        asyncio.run(astep(SyncAstepEnv(), "a"))


def test_step_exceptions_propagate() -> None:
    with pytest.raises(RuntimeError, match="bad action 'zz'"):
        asyncio.run(astep(FailingEnv(), "zz"))


def test_context_variables_reach_the_worker_thread() -> None:
    env = BlockingEnv()

    async def main() -> None:
        REQUEST_ID.set("rollout-17")
        await astep(env, "a")

    asyncio.run(main())
    assert env.context_values == ["rollout-17"]


def test_runner_run_helper_returns_the_result() -> None:
    async def main() -> int:
        async with EnvRunner(max_workers=1) as runner:
            return await runner.run(lambda a, b: a * b, 6, 7)

    assert asyncio.run(main()) == 42
