"""Several inference engines as Ray actors behind one :class:`~skyrl_train.inference.base.InferenceEngine`.

:class:`EngineGroup` starts ``num_engines`` actors, each building an ordinary engine
(:func:`~skyrl_train.inference.factory.create_engine`: the local torch engine or vLLM) in its own process. The
trainer and the generator see one engine:

- ``generate`` sends each prompt to the engine :class:`~skyrl_train.inference.routing.PrefixRouter` picks (the one
  holding the trajectory's earlier turns, unless it is much busier; else the least loaded). Prompt ``i`` of a call
  with ``seed=s`` is sent with seed ``s + i``, as one engine would sample it, so a seeded batch draws the same
  tokens whichever engine answers.
- ``update_weights`` puts the weights into Ray's object store once and loads them into every engine at once.
- ``join_broadcast`` / ``receive_broadcast``: the engines as the receiving ranks of a weight-broadcast group
  (:mod:`skyrl_train.tensor_broadcast`), for :class:`~skyrl_train.inference.broadcast_sync.BroadcastSync`: the
  trainer's rank 0 sends the weights straight to every engine, not through the driver.
- ``load`` (for admission control, which reads it without waiting): the engines' combined load
  (:func:`~skyrl_train.inference.base.combined_load`: requests summed, the fullest KV cache) as of the latest
  refresh. Actor calls are asynchronous, so the first ``load()`` starts a task on the caller's event loop that asks
  every engine each ``load_refresh_s``; until its first answer, ``load()`` is None (nothing known).
- ``pause`` / ``resume`` / ``close`` reach every engine. Engines built with ``pause_at="token"`` pause between two
  tokens (``pauses_at_token_boundary``); :attr:`EngineGroup.policy_version`, set while paused, reaches every engine
  with ``resume``, so each records it on the tokens it samples from then on.

Failures. An engine actor that dies (its process killed, out of memory) is restarted by Ray (up to
``max_restarts`` times). The new incarnation starts from ``model_path``'s weights, so it serves nothing until it
has the latest ones: every request carries the group's weight version, and a restarted actor that holds an older
one refuses it (:class:`EngineRestartedError`). A request refused so, or running on the actor when it died, is
sent again once the actor is back and has been given the latest weights: from the object store, or, when the
weights came by broadcast, by :attr:`EngineGroup.reloader` (which forms the group again and re-sends). Every
update has a version and every engine the version it loaded, so one restart reloads once however many requests
reach the restarted engine. A second failure of the same request raises.

Ray must be initialised first (``skyrl_train.backends.ray_group.ensure_ray`` does it for a run).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import ray
import torch

from skyrl_train.inference.base import (
    EngineLoad,
    GenerationOutput,
    SamplingParams,
    SleepingEngine,
    combined_load,
    load_of,
)
from skyrl_train.inference.concurrency import paused_during
from skyrl_train.inference.factory import EngineKind
from skyrl_train.inference.routing import PrefixRouter, RouterConfig
from skyrl_train.tensor_broadcast import BroadcastGroup, BucketPlan, GroupAddress
from skyrl_train.timeline import Timeline

__all__ = ["EngineGroup", "EngineRestartedError"]

logger = logging.getLogger(__name__)


class EngineRestartedError(RuntimeError):
    """An engine actor that Ray restarted was asked to generate before it had loaded the group's latest weights."""


class _EngineActor:
    """One engine in its own process (an async Ray actor: concurrent calls share its event loop)."""

    def __init__(self, kind: EngineKind, model_path: str, options: dict[str, Any]) -> None:
        from skyrl_train.inference.factory import create_engine

        self.engine = create_engine(kind, model_path, **options)
        self.version = 0  # the weight update this engine holds (0: model_path's weights, as after a restart)
        # A restart runs __init__ again: this incarnation's weights are model_path's, whatever the group sent since.
        self.restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self.broadcast: BroadcastGroup | None = None

    async def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        policy_version: int | None = None,
        weights_version: int | None = None,
    ) -> list[GenerationOutput]:
        """The engine's completions.

        ``policy_version``: the group's, taken by an engine that records per-token versions but has none yet (new,
        or restarted); later ones arrive with :meth:`resume`. ``weights_version``: the group's latest weight update.

        Raises:
            EngineRestartedError: this is a restarted actor holding an older update than ``weights_version``
                (the group loads the latest into it and sends the request again).
        """
        if self.restarted and weights_version is not None and self.version < weights_version:
            # Only a restarted actor refuses: a live one that is behind is loading the update (under the caller's
            # pause), while a restarted one would serve model_path's weights with nothing to correct it.
            raise EngineRestartedError(f"restarted with update {self.version}, the group is at {weights_version}")
        if policy_version is not None and getattr(self.engine, "policy_version", 0) is None:
            await self.set_policy_version(policy_version)
        return await self.engine.generate(prompts, params)

    async def node_id(self) -> str:
        """The Ray node this engine runs on."""
        return str(ray.get_runtime_context().get_node_id())

    async def loaded_version(self) -> int:
        return self.version

    async def load(self) -> EngineLoad | None:
        """The engine's load now, when it reports one (``load_of``); else None."""
        return load_of(self.engine)

    async def update_weights(
        self, weights: list[tuple[str, torch.Tensor]], version: int, policy_version: int | None = None
    ) -> None:
        """Load the weights of group update ``version``.

        An engine that records per-token versions stamps ``policy_version`` (when given) on the tokens it samples
        from then on.
        """
        if policy_version is None or not getattr(self.engine, "pauses_at_token_boundary", False):
            await self.engine.update_weights(weights)
        else:
            # Such engines have a pause state; paused, no token falls between the new weights and their version.
            async with paused_during(self.engine):  # type: ignore[arg-type]
                await self.engine.update_weights(weights)
                await self.set_policy_version(policy_version)
        self.version = version

    async def sleep(self) -> None:
        if isinstance(self.engine, SleepingEngine):
            await self.engine.sleep()

    async def wake_up(self) -> None:
        if isinstance(self.engine, SleepingEngine):
            await self.engine.wake_up()

    async def join_broadcast(self, address: GroupAddress, rank: int) -> None:
        """Join a weight-broadcast group as ``rank`` (in a thread: joining waits for every member)."""
        from skyrl_train.tensor_broadcast import join

        # An earlier group is dropped, not closed: a receive still blocked in it must fail on its own timeout.
        self.broadcast = None
        self.broadcast = await asyncio.to_thread(join, address, rank)

    async def receive_broadcast(self, plan: BucketPlan, version: int, policy_version: int | None = None) -> None:
        """Receive the weights rank 0 sends under ``plan`` and load them as :meth:`update_weights` does."""
        group = self.broadcast
        if group is None:
            raise RuntimeError("receive_broadcast before join_broadcast")
        weights = await asyncio.to_thread(group.receive, plan)
        await self.update_weights(weights, version, policy_version)

    async def pause(self) -> None:
        await self.engine.pause()

    async def resume(self, policy_version: int | None = None) -> None:
        """Resume; engines that record per-token versions take ``policy_version`` for the tokens from now on."""
        if policy_version is not None:
            await self.set_policy_version(policy_version)
        await self.engine.resume()

    async def set_policy_version(self, policy_version: int) -> None:
        if getattr(self.engine, "pauses_at_token_boundary", False):
            self.engine.policy_version = policy_version  # type: ignore[attr-defined]  # such engines have it

    async def close(self) -> None:
        await self.engine.close()


class EngineGroup:
    """``num_engines`` engines of one ``kind`` on Ray actors, routed as one engine (see the module docstring).

    ``actor_options`` (one dict per engine, e.g. a placement group from ``skyrl_train.ray_cluster.Placement``) are
    passed to each actor's ``.options``. ``load_refresh_s``: seconds between two readings of the engines' load, once
    :meth:`load` has been called (the figures it returns are at most this old, plus one actor call).
    """

    def __init__(
        self,
        kind: EngineKind,
        model_path: str,
        num_engines: int,
        *,
        options: dict[str, Any] | None = None,
        num_cpus_per_engine: float = 1.0,
        num_gpus_per_engine: float = 0.0,
        router: RouterConfig | None = None,
        max_restarts: int = 3,
        actor_options: Sequence[dict[str, Any]] | None = None,
        load_refresh_s: float = 1.0,
    ) -> None:
        if kind == "remote":
            raise ValueError("remote engines already run elsewhere: list their URLs instead of num_engines")
        if load_refresh_s <= 0:
            raise ValueError(f"load_refresh_s must be positive (got {load_refresh_s})")
        if not ray.is_initialized():
            raise RuntimeError("EngineGroup needs Ray: call ray.init() (or ray.init(address=...)) first")
        # Actor handles are typed Any: Ray's stubs do not know the remote methods of a class wrapped at run time.
        actor: Any = ray.remote(num_cpus=num_cpus_per_engine, num_gpus=num_gpus_per_engine, max_restarts=max_restarts)(
            _EngineActor
        )
        per_actor = list(actor_options) if actor_options is not None else [{}] * num_engines
        if len(per_actor) != num_engines:
            raise ValueError(f"{len(per_actor)} actor_options for {num_engines} engines: give one per engine")
        self.engines: list[Any] = [
            actor.options(**opts).remote(kind, model_path, dict(options or {})) for opts in per_actor
        ]
        self.pauses_at_token_boundary = (options or {}).get("pause_at") == "token"
        # The version the engines record on their tokens (pause_at="token"); sent to them with resume().
        self.policy_version: int | None = None
        self.router = PrefixRouter(num_engines, router)
        self._weights: Any = None  # the object-store copy of the latest weights, for engines that restart
        self.version = 0  # weight updates so far (each engine knows which one it holds)
        # Set by a sync that sends weights by broadcast: gives every engine the latest weights again.
        self.reloader: Callable[[], Awaitable[None]] | None = None
        self._catching_up = asyncio.Lock()
        self.restarts = 0  # requests sent again after their engine died
        self.timeline: Timeline | None = None  # set by a run: each request is a span on its engine's lane
        self.load_refresh_s = load_refresh_s
        self._load: EngineLoad | None = None  # the engines' combined load as of the latest refresh
        self._load_refresher: asyncio.Task[None] | None = None  # started by the first load() on an event loop

    @property
    def num_engines(self) -> int:
        """Engines in the group (0 once closed)."""
        return len(self.engines)

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        """One completion per prompt, in order; each prompt routed on its own (see the module docstring)."""
        return list(
            await asyncio.gather(*(self._one(list(prompt), params, index) for index, prompt in enumerate(prompts)))
        )

    def load(self) -> EngineLoad | None:
        """The engines' combined load as of the latest refresh; returns at once (see the module docstring).

        Called on an event loop, it keeps a task there refreshing the figures every ``load_refresh_s`` (until
        :meth:`close`). None before the first refresh has answered, or when no engine reports a load.
        """
        self._keep_load_fresh()
        return self._load

    async def refresh_load(self) -> EngineLoad | None:
        """Ask every engine for its load now and keep the combined figure (what :meth:`load` returns until the next).

        An engine that is dead or restarting is left out, as one that reports no load is.
        """
        answers = await asyncio.gather(*(engine.load.remote() for engine in self.engines), return_exceptions=True)
        loads: list[EngineLoad | None] = []
        for answer in answers:
            if isinstance(answer, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError):
                continue
            if isinstance(answer, BaseException):
                raise answer
            loads.append(answer)
        self._load = combined_load(loads)
        return self._load

    def _keep_load_fresh(self) -> None:
        """Start the refreshing task on the running event loop unless one runs there already."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop to refresh on: the latest figures stand
        task = self._load_refresher
        if task is None or task.done() or task.get_loop() is not loop:
            self._load_refresher = loop.create_task(self._refresh_load_every(), name="engine-group-load")

    async def _refresh_load_every(self) -> None:
        while self.engines:
            try:
                await self.refresh_load()
            except Exception:  # the refreshing goes on; meanwhile nothing is known, which holds the admission limit
                logger.exception("reading the engines' load failed")
                self._load = None
            await asyncio.sleep(self.load_refresh_s)

    async def _one(self, prompt: list[int], params: SamplingParams, index: int) -> GenerationOutput:
        if params.seed is not None:
            params = dataclasses.replace(params, seed=params.seed + index)
        engine = self.router.route(prompt)
        output: GenerationOutput | None = None
        start = self.timeline.now() if self.timeline is not None else 0.0
        try:
            try:
                output = await self._sent(engine, prompt, params)
            except (ray.exceptions.RayActorError, EngineRestartedError):
                self.restarts += 1
                await self._restored(engine)
                output = await self._sent(engine, prompt, params)
        finally:
            self.router.finished(engine, prompt + (output.token_ids if output is not None else []))
            if self.timeline is not None:
                self.timeline.record(f"engine {engine}", "generate", start, self.timeline.now())
        return output

    async def _sent(self, engine: int, prompt: list[int], params: SamplingParams) -> GenerationOutput:
        """``prompt``'s completion by engine ``engine``, which must hold the group's latest weights."""
        handle = self.engines[engine]
        (output,) = await handle.generate.remote([prompt], params, self.policy_version, self.version)
        return output  # type: ignore[no-any-return]  # the actor's return type is lost in the remote call

    async def _restored(self, engine: int) -> None:
        """Wait until a dead engine's actor is back (Ray restarts it), then give it the latest weights."""
        await self._alive(self.engines[engine])
        await self.catch_up()

    @staticmethod
    async def _alive(handle: Any) -> int:
        """The update the engine holds, once its actor answers (after a restart, if it is in one)."""
        for _ in range(600):  # the restart runs the actor's __init__ again: a model load
            try:
                return int(await handle.loaded_version.remote())
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                await asyncio.sleep(0.5)
        raise RuntimeError("an engine actor did not come back within 5 minutes of its restart")

    async def wait_alive(self) -> None:
        """Return once every engine actor answers (after Ray has restarted any dead one)."""
        await asyncio.gather(*(self._alive(handle) for handle in self.engines))

    async def catch_up(self) -> None:
        """Give the latest weights to every engine that lacks them (one that restarted); one caller at a time."""
        async with self._catching_up:
            # Another engine may be restarting too (several died at once): wait for it, it needs the weights as well.
            versions = await asyncio.gather(*(self._alive(handle) for handle in self.engines))
            stale = [index for index, version in enumerate(versions) if version != self.version]
            if not stale:
                return
            if self._weights is not None:
                await asyncio.gather(
                    *(self.engines[i].update_weights.remote(self._weights, self.version) for i in stale)
                )
            elif self.reloader is not None:
                await self.reloader()
            else:
                raise RuntimeError("an engine restarted after a broadcast weight update, and nothing can resend it")

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Every engine loads the same weights (one copy in the object store, read by all)."""
        shared = ray.put([(name, tensor.detach().to("cpu")) for name, tensor in weights])
        self._weights = shared
        self.version += 1
        await asyncio.gather(*(engine.update_weights.remote(shared, self.version) for engine in self.engines))

    # --- as the receiving ranks of a weight-broadcast group (skyrl_train.inference.broadcast_sync) ---

    @property
    def num_receivers(self) -> int:
        """Ranks this group takes in a broadcast group: one per engine."""
        return len(self.engines)

    async def join_broadcast(self, address: GroupAddress, first_rank: int) -> None:
        """Engine ``i`` joins the group at ``address`` as rank ``first_rank + i``."""
        await asyncio.gather(
            *(engine.join_broadcast.remote(address, first_rank + i) for i, engine in enumerate(self.engines))
        )

    async def receive_broadcast(self, plan: BucketPlan, policy_version: int | None = None) -> None:
        """Every engine receives the weights sent under ``plan`` and loads them.

        ``policy_version``: those weights' policy version; when the group tracks one (:attr:`policy_version` is
        set), it becomes the group's and each engine records it on the tokens it samples after the load.
        """
        self._weights = None  # the broadcast weights are newer than any object-store copy
        self.version += 1
        stamp = policy_version if self.policy_version is not None else None
        if stamp is not None:
            self.policy_version = stamp
        await asyncio.gather(*(engine.receive_broadcast.remote(plan, self.version, stamp) for engine in self.engines))

    async def pause(self) -> None:
        """Hold new generation on every engine (one that is restarting is paused once it is back)."""
        await asyncio.gather(*(self._call_when_alive(engine, "pause") for engine in self.engines))

    async def resume(self) -> None:
        """Let every engine generate again (with :attr:`policy_version` for the tokens they sample from now on)."""
        version = self.policy_version
        await asyncio.gather(*(self._call_when_alive(engine, "resume", version) for engine in self.engines))

    async def sleep(self) -> None:
        """Every engine hands its accelerator memory over (see ``SleepingEngine``; nothing on CPU)."""
        await asyncio.gather(*(self._call_when_alive(engine, "sleep") for engine in self.engines))

    async def wake_up(self) -> None:
        """Every engine takes its memory back (a restarted engine comes back awake)."""
        await asyncio.gather(*(self._call_when_alive(engine, "wake_up") for engine in self.engines))

    async def _call_when_alive(self, handle: Any, method: str, *args: Any) -> None:
        try:
            await getattr(handle, method).remote(*args)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            await self._alive(handle)
            await getattr(handle, method).remote(*args)

    async def close(self) -> None:
        """Close every engine and stop its actor (idempotent)."""
        engines, self.engines = self.engines, []
        await self._stop_load_refresher()
        if engines:
            await asyncio.gather(*(engine.close.remote() for engine in engines), return_exceptions=True)
            for engine in engines:
                ray.kill(engine)

    async def _stop_load_refresher(self) -> None:
        refresher, self._load_refresher, self._load = self._load_refresher, None, None
        if refresher is not None and not refresher.done() and refresher.get_loop() is asyncio.get_running_loop():
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
