"""Weight sync by broadcast: the trainer's rank 0 sends the policy's weights straight to the engines.

The default sync (``engine.update_weights(policy.get_weights())``) moves the gathered weights from rank 0 to the
driver and from the driver to every engine, through Ray's object store: two serialisations and several copies.
:class:`BroadcastSync` forms a process group of its own (:mod:`skyrl_train.tensor_broadcast`) whose rank 0 is the
policy's rank 0 and whose other ranks are the engines, then, on each sync::

    policy ranks     gather each weight in turn (FSDP all-gathers), rank 0 packs them into buckets
    rank 0 ──────►   broadcast bucket by bucket (gloo on CPU, NCCL on GPU)
    engines          receive the buckets, cut them into tensors, load them (generation held by the caller)

The receivers are an :class:`~skyrl_train.inference.ray_engines.EngineGroup` (one rank per engine actor) or an
engine in the driver's own process (:class:`LocalReceiver`, one rank). The bucket plan is made once, from the
weights' names, shapes and dtypes. The sender belongs to one group at a time: a sync whose sender has joined
another sync's group since forms its own again before sending.

Failures. A member that dies breaks the group. The driver learns of a dead actor at once (its call fails) and
aborts the group (:func:`skyrl_train.tensor_broadcast.abort`), so the members still waiting in a collective give
up then, not on a timeout. A sync that fails waits for the engines to be back (Ray restarts a dead engine actor),
forms the group again and sends once more; a second failure raises. An engine that restarted between syncs is
caught up the same way, through the group's ``reloader``.

Updates. A push reads the sender's weights on every rank, so it must not run while the trainer changes them (in
``one_step_off`` and ``fully_async`` the engines generate, and may die, during the update): the trainer holds
:meth:`BroadcastSync.updating` around the work it gives the policy's ranks, and a push waits for it to end (and an
update for a push to end). A reload asked for meanwhile then sends the updated weights, stamped with the update's
policy version on engines that record one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Literal, Protocol

import ray

from skyrl_train.inference.base import InferenceEngine
from skyrl_train.tensor_broadcast import DEFAULT_BUCKET_BYTES, BroadcastGroup, BucketPlan, GroupAddress, TensorSpec

__all__ = ["BroadcastReceiver", "BroadcastSender", "BroadcastSync", "LocalReceiver"]

logger = logging.getLogger(__name__)


class BroadcastSender(Protocol):
    """The policy side (``skyrl_train.backends.ray_group.FSDPBackend``)."""

    def weight_specs(self) -> list[TensorSpec]:
        """Name, full shape and dtype of every weight, in the order they are sent."""
        ...

    def broadcast_address(self, world_size: int, backend: Literal["gloo", "nccl"] = "gloo") -> GroupAddress:
        """A fresh address, on the sending rank's node, for a group of ``world_size`` members."""
        ...

    async def join_broadcast(self, address: GroupAddress) -> None:
        """Join the group at ``address`` as rank 0 (returns once every member has joined)."""
        ...

    async def in_broadcast_group(self, address: GroupAddress) -> bool:
        """Whether the sender is still in the group formed at ``address`` (it may have joined another since)."""
        ...

    async def broadcast_weights(self, plan: BucketPlan, address: GroupAddress) -> int:
        """Send the weights under ``plan`` to the group formed at ``address``; the bytes sent."""
        ...


class BroadcastReceiver(Protocol):
    """The engine side: ranks ``first_rank`` to ``first_rank + num_receivers - 1`` of the group."""

    @property
    def num_receivers(self) -> int:
        """Ranks this side takes in the group."""
        ...

    async def join_broadcast(self, address: GroupAddress, first_rank: int) -> None:
        """Join the group at ``address`` as ranks ``first_rank`` onwards."""
        ...

    async def receive_broadcast(self, plan: BucketPlan, policy_version: int | None = None) -> None:
        """Receive the weights sent under ``plan`` and load them.

        ``policy_version``: the policy version of those weights (None: not known here), for engines that stamp it
        on the tokens they sample.
        """
        ...


class LocalReceiver:
    """An engine in this process as one receiving rank (the group's calls block, so they run in threads)."""

    num_receivers = 1

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine
        self.group: BroadcastGroup | None = None

    async def join_broadcast(self, address: GroupAddress, first_rank: int) -> None:
        """Join the group at ``address`` as rank ``first_rank`` (an earlier group is dropped)."""
        from skyrl_train.tensor_broadcast import join

        self.group = None
        self.group = await asyncio.to_thread(join, address, first_rank)

    async def receive_broadcast(self, plan: BucketPlan, policy_version: int | None = None) -> None:
        """Receive the weights sent under ``plan`` and load them into the engine.

        ``policy_version`` is not used: only the trainer's sync pushes to an engine in its process, and it sets the
        version itself.
        """
        if self.group is None:
            raise RuntimeError("receive_broadcast before join_broadcast")
        weights = await asyncio.to_thread(self.group.receive, plan)
        await self.engine.update_weights(weights)


class BroadcastSync:
    """Sends ``sender``'s weights to ``receiver`` over a broadcast group (see the module docstring).

    ``backend`` ``"gloo"`` (CPU buffers; rank 0 copies GPU tensors to the host) or ``"nccl"`` (every member on a
    GPU). ``bucket_bytes`` bounds one collective's buffer.
    """

    def __init__(
        self,
        sender: BroadcastSender,
        receiver: BroadcastReceiver,
        *,
        backend: Literal["gloo", "nccl"] = "gloo",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        self.sender, self.receiver, self.backend, self.bucket_bytes = sender, receiver, backend, bucket_bytes
        self.plan: BucketPlan | None = None
        self.address: GroupAddress | None = None  # where the group was last formed (None: form it first)
        # Held by a push and by the trainer's update: the sender's weights are read, or changed, by one at a time.
        self._weights_in_use = asyncio.Lock()
        self.policy_version: int | None = None  # of the sender's weights, once an update has said (updating)
        self.reforms = 0  # times the group was formed again after a failure
        if hasattr(receiver, "reloader"):
            receiver.reloader = self._reload  # an engine that restarted between syncs is caught up by a new push

    @asynccontextmanager
    async def updating(self, policy_version: int) -> AsyncIterator[None]:
        """Hold around work that changes the sender's weights into ``policy_version`` (the trainer's update).

        Waits for a running push to end; a push asked for inside (a reload) waits for the block to end, then sends
        the new weights as ``policy_version``. An update that raises leaves the version as it was.
        """
        async with self._weights_in_use:
            yield
            self.policy_version = policy_version

    async def push(self) -> int:
        """Send the current weights to every receiver; the bytes sent. Retries once after a failure.

        Waits while an update holds :meth:`updating`.
        """
        async with self._weights_in_use:
            return await self._push_retrying()

    async def _reload(self) -> None:
        """Send again after an engine restarted (waits while an update holds :meth:`updating`)."""
        self.reforms += 1  # counted when asked for: an update may hold the reload back a while
        async with self._weights_in_use:
            self.address = None  # the old incarnation's membership went with it
            await self._push_retrying()

    async def _push_retrying(self) -> int:
        """One push; after a Ray failure (a member died), one more once the engines are back."""
        try:
            return await self._push_or_abort()
        except ray.exceptions.RayError as error:
            logger.warning("weight broadcast failed (%s); forming the group again", type(error).__name__)
        self.reforms += 1
        wait_alive = getattr(self.receiver, "wait_alive", None)
        if wait_alive is not None:
            await wait_alive()
        return await self._push_or_abort()

    async def _push_or_abort(self) -> int:
        """One push; on a failure, the members still waiting in the group are released and the group is dropped."""
        try:
            return await self._push()
        except Exception:
            address, self.address = self.address, None
            if address is not None:
                from skyrl_train.tensor_broadcast import abort

                await asyncio.to_thread(abort, address)
            raise

    async def _push(self) -> int:
        if self.plan is None:
            self.plan = plan_of(self.sender, self.bucket_bytes)
        if self.address is not None and not await self.sender.in_broadcast_group(self.address):
            self.address = None  # another sync took the sender over since: its receivers are no longer ours
        if self.address is None:
            self.address = self.sender.broadcast_address(1 + self.receiver.num_receivers, self.backend)
            await _first_failure(
                self.sender.join_broadcast(self.address), self.receiver.join_broadcast(self.address, 1)
            )
        sent, _ = await _first_failure(
            self.sender.broadcast_weights(self.plan, self.address),
            self.receiver.receive_broadcast(self.plan, self.policy_version),
        )
        assert isinstance(sent, int)
        return sent

    @property
    def nbytes(self) -> int:
        """Bytes one sync moves (0 before the first)."""
        return self.plan.nbytes if self.plan is not None else 0


def plan_of(sender: BroadcastSender, bucket_bytes: int) -> BucketPlan:
    from skyrl_train.tensor_broadcast import plan_buckets

    return plan_buckets(sender.weight_specs(), bucket_bytes)


async def _first_failure(*calls: Awaitable[object]) -> list[object]:
    """Await ``calls`` together; on the first failure stop waiting for the rest and raise it.

    A member left waiting in a broken group only fails on the group's timeout; waiting for it would stall the
    sync that long, so the survivors' calls are abandoned (they fail on their own, unobserved).
    """
    tasks = [asyncio.ensure_future(call) for call in calls]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    failed = [task for task in done if task.exception() is not None]
    if failed:
        for task in pending:
            task.cancel()
        error = failed[0].exception()
        assert error is not None
        raise error
    return [task.result() for task in tasks]
