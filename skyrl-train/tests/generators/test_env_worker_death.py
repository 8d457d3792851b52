"""A dead env worker (``EnvWorkers``, actors without restarts) takes no new envs; the live ones take them all."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.generators.env_workers import EnvWorkers, EnvWorkersDeadError, RemoteEnv  # noqa: E402

pytestmark = pytest.mark.ray
ENV_CLASS = "gsm8k"  # built in: every worker's registry has it
EXTRAS = {"reward_spec": {"ground_truth": "4"}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


async def _make_many(workers: EnvWorkers, count: int) -> list[RemoteEnv]:
    """``count`` envs made at once, as a generator makes a batch's envs."""
    return list(await asyncio.gather(*(workers.make(ENV_CLASS, None, EXTRAS, 1) for _ in range(count))))


def _kill(workers: EnvWorkers, index: int) -> None:
    """Kill worker ``index`` behind the pool's back; return once Ray reports it dead (not merely unreachable)."""
    ray.kill(workers.workers[index], no_restart=True)
    for _ in range(120):  # the kill takes effect asynchronously; a loaded machine may first answer "unavailable"
        try:
            ray.get(workers.workers[index].pid.remote(), timeout=30)
        except ray.exceptions.ActorDiedError:
            return
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"Ray did not report worker {index} dead within a minute")


def test_new_envs_avoid_a_dead_worker_and_all_succeed(cluster: None) -> None:
    workers = EnvWorkers(2, num_cpus_per_worker=0.5)
    try:
        _kill(workers, 0)
        envs = asyncio.run(_make_many(workers, 12))
        assert [env.worker for env in envs] == [1] * 12
        assert workers.dead == {0}
        assert asyncio.run(envs[0].ainit([{"role": "user", "content": "2 + 2?"}])) is not None
        for env in envs:
            env.close()
        assert workers.live == [0, 0]
        more = asyncio.run(_make_many(workers, 4))  # the dead worker is known now: it is not even tried
        assert [env.worker for env in more] == [1] * 4
    finally:
        workers.close()


def test_a_pool_whose_workers_all_died_refuses_new_envs_clearly(cluster: None) -> None:
    workers = EnvWorkers(2, num_cpus_per_worker=0.5)
    try:
        _kill(workers, 0)
        _kill(workers, 1)
        with pytest.raises(EnvWorkersDeadError, match="all 2 env workers died"):
            asyncio.run(_make_many(workers, 3))
        with pytest.raises(EnvWorkersDeadError, match="all 2 env workers died"):
            asyncio.run(_make_many(workers, 1))
    finally:
        workers.close()


def _broken_setup() -> None:
    raise RuntimeError("the setup broke")


def test_a_worker_that_fails_to_start_fails_the_pool_at_once(cluster: None) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    with pytest.raises(ray.exceptions.ActorDiedError, match="the setup broke"):
        EnvWorkers(2, num_cpus_per_worker=0.5, setup=_broken_setup)


class _Unreachable:
    """Stands in for a worker's handle that Ray cannot reach for now: every ``make`` call is unavailable."""

    class make:
        @staticmethod
        def remote(*args: object, **kwargs: object) -> object:
            async def unavailable() -> int:
                raise ray.exceptions.ActorUnavailableError("the node is overloaded", None)

            return unavailable()


def test_an_unreachable_worker_is_skipped_not_marked_dead(cluster: None) -> None:
    workers = EnvWorkers(2, num_cpus_per_worker=0.5)
    real = list(workers.workers)
    workers.workers[0] = _Unreachable()  # type: ignore[call-overload]
    try:
        envs = asyncio.run(_make_many(workers, 4))
        assert [env.worker for env in envs] == [1] * 4
        assert workers.dead == set()  # unavailable is not dead: later envs may go back to it
        workers.workers[1] = _Unreachable()  # type: ignore[call-overload]
        with pytest.raises(EnvWorkersDeadError, match="no env worker could be reached"):
            asyncio.run(_make_many(workers, 1))
    finally:
        workers.workers[:] = real
        workers.close()
