"""Environments in Ray actors: heavy env steps (code execution, SQL, search) away from the trainer's process.

:class:`EnvWorkers` starts ``num_workers`` CPU actors; each holds the envs made on it and runs their calls on up to
``concurrency`` threads at once. ``SkyRLGymGenerator(..., env_workers=EnvWorkers(...))`` then makes every env on
the worker with the fewest live envs and talks to it through a :class:`RemoteEnv`, whose ``ainit`` / ``astep`` /
``aclose`` the generator awaits natively (no thread of the trainer's process waits on a step). The env classes
must be importable in the workers (the registry of the worker process: built-in envs, or envs registered on
import of a package the worker imports, see ``setup``).

Failures stay the generator's: an exception in a worker reaches the generator as an exception of the call (an
``env_error``), and so does a worker's death (``RayActorError``), for every env that lived on it. A timed-out
step keeps running in its worker thread while the generator closes the env.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from typing import Any

import ray

from skyrl_train.generators.envs import make_env

__all__ = ["EnvWorkers", "RemoteEnv"]


class _EnvWorker:
    """One actor: envs by id, each call on one of the actor's threads."""

    def __init__(self, setup: Callable[[], None] | None) -> None:
        if setup is not None:
            setup()  # e.g. register the run's custom envs in this process
        self.envs: dict[int, Any] = {}
        self.ids = itertools.count()
        self.lock = threading.Lock()

    def make(self, env_class: str, env_config: Any, extras: Mapping[str, Any], max_turns: int) -> int:
        env = make_env(env_class, env_config, extras, max_turns)
        with self.lock:
            env_id = next(self.ids)
            self.envs[env_id] = env
        return env_id

    def init(self, env_id: int, prompt: Any) -> Any:
        return self.envs[env_id].init(prompt)

    def step(self, env_id: int, action: Any) -> Any:
        return self.envs[env_id].step(action)

    def get_metrics(self, env_id: int) -> Any:
        get_metrics = getattr(self.envs[env_id], "get_metrics", None)
        return get_metrics() if callable(get_metrics) else {}

    def close(self, env_id: int) -> None:
        with self.lock:
            env = self.envs.pop(env_id, None)
        if env is not None:
            env.close()

    def pid(self) -> int:
        import os

        return os.getpid()


class RemoteEnv:
    """The generator's handle on an env living in a worker: the env API, each call sent to the worker."""

    def __init__(self, pool: EnvWorkers, worker: int, env_id: int) -> None:
        self.pool, self.worker, self.env_id = pool, worker, env_id
        self._actor = pool.workers[worker]

    async def ainit(self, prompt: Any) -> Any:
        """``env.init(prompt)`` in the worker."""
        return await self._actor.init.remote(self.env_id, prompt)

    async def astep(self, action: Any) -> Any:
        """``env.step(action)`` in the worker."""
        return await self._actor.step.remote(self.env_id, action)

    def get_metrics(self) -> Any:
        """``env.get_metrics()`` in the worker (blocking: the generator calls it on a thread)."""
        return ray.get(self._actor.get_metrics.remote(self.env_id))

    async def aclose(self) -> None:
        """``env.close()`` in the worker; the env no longer counts against it."""
        try:
            await self._actor.close.remote(self.env_id)
        finally:
            self.pool.released(self.worker)

    def init(self, prompt: Any) -> Any:
        """Blocking :meth:`ainit`."""
        return ray.get(self._actor.init.remote(self.env_id, prompt))

    def step(self, action: Any) -> Any:
        """Blocking :meth:`astep`."""
        return ray.get(self._actor.step.remote(self.env_id, action))

    def close(self) -> None:
        """Blocking :meth:`aclose`."""
        try:
            ray.get(self._actor.close.remote(self.env_id))
        finally:
            self.pool.released(self.worker)


class EnvWorkers:
    """``num_workers`` env actors; new envs go to the worker with the fewest live ones (see the module docstring).

    Args:
        num_workers: Actors to start.
        num_cpus_per_worker: CPUs each asks Ray for (no placement group: any node with free CPUs takes it).
        concurrency: Env calls one worker runs at once (its threads).
        setup: Called once in each worker before any env is made (picklable; e.g. registers custom envs).
    """

    def __init__(
        self,
        num_workers: int,
        *,
        num_cpus_per_worker: float = 1.0,
        concurrency: int = 32,
        setup: Callable[[], None] | None = None,
    ) -> None:
        if num_workers < 1 or concurrency < 1:
            raise ValueError(f"num_workers and concurrency must be >= 1, got {num_workers} and {concurrency}")
        if not ray.is_initialized():
            raise RuntimeError("EnvWorkers needs Ray: call ray.init() (or ray.init(address=...)) first")
        # Actor handles are typed Any: Ray's stubs do not know the remote methods of a class wrapped at run time.
        remote: Any = ray.remote
        actor: Any = remote(num_cpus=num_cpus_per_worker, max_concurrency=concurrency)(_EnvWorker)
        self.workers: list[Any] = [actor.remote(setup) for _ in range(num_workers)]
        self.live = [0] * num_workers  # envs made on each worker and not yet closed
        self._lock = threading.Lock()

    async def make(self, env_class: str, env_config: Any, extras: Mapping[str, Any], max_turns: int) -> RemoteEnv:
        """Make an env on the least busy worker."""
        with self._lock:
            worker = min(range(len(self.workers)), key=lambda w: (self.live[w], w))
            self.live[worker] += 1
        try:
            env_id = await self.workers[worker].make.remote(env_class, env_config, dict(extras), max_turns)
        except BaseException:
            self.released(worker)
            raise
        return RemoteEnv(self, worker, env_id)

    def released(self, worker: int) -> None:
        """An env of ``worker`` was closed (or never made)."""
        with self._lock:
            self.live[worker] = max(self.live[worker] - 1, 0)

    def close(self) -> None:
        """Stop the workers (idempotent); envs still on them are gone with them."""
        workers, self.workers = self.workers, []
        for worker in workers:
            ray.kill(worker)
