"""Environments in Ray actors: heavy env steps (code execution, SQL, search) away from the trainer's process.

:class:`EnvWorkers` starts ``num_workers`` CPU actors; each holds the envs made on it and runs their calls on up to
``concurrency`` threads at once. ``SkyRLGymGenerator(..., env_workers=EnvWorkers(...))`` then makes every env on
the live worker with the fewest live envs and talks to it through a :class:`RemoteEnv`, whose ``ainit`` / ``astep``
/ ``aclose`` the generator awaits natively (no thread of the trainer's process waits on a step). The env classes
must be importable in the workers (the registry of the worker process: built-in envs, or envs registered on
import of a package the worker imports, see ``setup``).

Failures stay the generator's: an exception in a worker reaches the generator as an exception of the call (an
``env_error``), and so does a worker's death (``ActorDiedError``), for every env that lived on it. A timed-out
step keeps running in its worker thread while the generator closes the env.

Dead workers. Ray does not restart these actors, so a worker that a call saw die (``ActorDiedError``) is dead for
good: the pool marks it and never places an env on it again. A new env whose worker turns out to be dead is made on
another live one; when every worker has died, :meth:`EnvWorkers.make` raises :class:`EnvWorkersDeadError`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

from skyrl_train.generators.envs import make_env

__all__ = ["EnvWorkers", "EnvWorkersDeadError", "RemoteEnv"]


class EnvWorkersDeadError(RuntimeError):
    """Every worker of an :class:`EnvWorkers` pool has died: no env can be made on it."""


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
    """The generator's handle on an env living in a worker: the env API, each call sent to the worker.

    A call that finds the worker dead raises its ``ActorDiedError`` and tells the pool, which then makes no more envs
    on that worker.
    """

    def __init__(self, pool: EnvWorkers, worker: int, env_id: int) -> None:
        self.pool, self.worker, self.env_id = pool, worker, env_id
        self._actor = pool.workers[worker]

    async def ainit(self, prompt: Any) -> Any:
        """``env.init(prompt)`` in the worker."""
        with self._watched():
            return await self._actor.init.remote(self.env_id, prompt)

    async def astep(self, action: Any) -> Any:
        """``env.step(action)`` in the worker."""
        with self._watched():
            return await self._actor.step.remote(self.env_id, action)

    def get_metrics(self) -> Any:
        """``env.get_metrics()`` in the worker (blocking: the generator calls it on a thread)."""
        with self._watched():
            return ray.get(self._actor.get_metrics.remote(self.env_id))

    async def aclose(self) -> None:
        """``env.close()`` in the worker; the env no longer counts against it."""
        try:
            with self._watched():
                await self._actor.close.remote(self.env_id)
        finally:
            self.pool.released(self.worker)

    def init(self, prompt: Any) -> Any:
        """Blocking :meth:`ainit`."""
        with self._watched():
            return ray.get(self._actor.init.remote(self.env_id, prompt))

    def step(self, action: Any) -> Any:
        """Blocking :meth:`astep`."""
        with self._watched():
            return ray.get(self._actor.step.remote(self.env_id, action))

    def close(self) -> None:
        """Blocking :meth:`aclose`."""
        try:
            with self._watched():
                ray.get(self._actor.close.remote(self.env_id))
        finally:
            self.pool.released(self.worker)

    @contextmanager
    def _watched(self) -> Iterator[None]:
        """Report the worker's death to the pool (the error itself goes on to the caller)."""
        try:
            yield
        except ActorDiedError:
            self.pool.died(self.worker)
            raise


class EnvWorkers:
    """``num_workers`` env actors; new envs go to the live worker with the fewest live envs (see the module docstring).

    The constructor returns once every worker has started (and run ``setup``).

    Args:
        num_workers: Actors to start.
        num_cpus_per_worker: CPUs each asks Ray for (no placement group: any node with free CPUs takes it).
        concurrency: Env calls one worker runs at once (its threads).
        setup: Called once in each worker before any env is made (picklable; e.g. registers custom envs).

    Raises:
        ray.exceptions.ActorDiedError: a worker failed to start (e.g. ``setup`` raised); the others are stopped.
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
        self.dead: set[int] = set()  # workers a call saw die; they take no new env
        self._lock = threading.Lock()
        try:
            # Every worker runs before the first env is made: a ``setup`` that raises fails here, once, instead of
            # failing every env made on its worker.
            ray.get([worker.pid.remote() for worker in self.workers])
        except BaseException:
            self.close()
            raise

    async def make(self, env_class: str, env_config: Any, extras: Mapping[str, Any], max_turns: int) -> RemoteEnv:
        """Make an env on the least busy live worker; one found dead meanwhile is marked and another one tried.

        Raises:
            EnvWorkersDeadError: every worker has died (the last death is the cause).
            RuntimeError: the pool is closed.
        """
        death: ActorDiedError | None = None
        unreachable: set[int] = set()  # this call's workers that Ray could not reach for now (not known dead)
        while (worker := self._reserve(unreachable)) is not None:
            try:
                env_id = await self.workers[worker].make.remote(env_class, env_config, dict(extras), max_turns)
            except ActorDiedError as error:
                self.released(worker)
                self.died(worker)
                death = error
                continue
            except ActorUnavailableError:
                # Ray cannot tell yet whether the actor is gone (a loaded node, a death not yet confirmed): try
                # another worker for this env, without marking this one dead.
                self.released(worker)
                unreachable.add(worker)
                continue
            except BaseException:
                self.released(worker)
                raise
            return RemoteEnv(self, worker, env_id)
        if unreachable and len(self.dead | unreachable) == len(self.workers) and len(self.dead) < len(self.workers):
            raise EnvWorkersDeadError(
                f"no env worker could be reached: {len(unreachable)} unreachable, {len(self.dead)} dead; Ray could "
                "not reach the live ones (look for overloaded nodes in the workers' logs)"
            )
        raise EnvWorkersDeadError(
            f"all {len(self.workers)} env workers died, and Ray does not restart them: no env can be made. "
            "Look for the cause in the workers' logs (e.g. out of memory), then start the run again"
        ) from death

    def _reserve(self, skip: set[int]) -> int | None:
        """Count a new env against the live worker (not in ``skip``) with the fewest envs; None when there is none."""
        with self._lock:
            if not self.workers:
                raise RuntimeError("the env workers are closed: make envs before EnvWorkers.close()")
            alive = [w for w in range(len(self.workers)) if w not in self.dead and w not in skip]
            if not alive:
                return None
            worker = min(alive, key=lambda w: (self.live[w], w))
            self.live[worker] += 1
            return worker

    def released(self, worker: int) -> None:
        """An env of ``worker`` was closed (or never made)."""
        with self._lock:
            self.live[worker] = max(self.live[worker] - 1, 0)

    def died(self, worker: int) -> None:
        """A call saw ``worker``'s actor die: no new env goes to it."""
        with self._lock:
            self.dead.add(worker)

    def close(self) -> None:
        """Stop the workers (idempotent); envs still on them are gone with them."""
        workers, self.workers = self.workers, []
        for worker in workers:
            ray.kill(worker)
