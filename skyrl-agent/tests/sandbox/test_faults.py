"""The fault injector: crashes with the chosen command, hangs the sandbox times out, flaky calls, all seeded."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

import pytest

from skyrl_agent.sandbox import InMemoryBackend, Sandbox, SandboxError, SandboxSpec
from skyrl_agent.sandbox.faults import FaultPlan, FaultyBackend, FaultySandbox, FlakyCalls


def _with_backend(body: Callable[[FaultyBackend, list[str]], Awaitable[None]], plan: FaultPlan) -> list[str]:
    crashed: list[str] = []

    async def crash(sandbox: Sandbox) -> None:
        crashed.append(sandbox.id)
        await sandbox.close()  # the in-memory double's way to die: its shell is gone

    async def main() -> None:
        backend = FaultyBackend(InMemoryBackend(), plan, crash=crash)
        try:
            await body(backend, crashed)
        finally:
            await backend.close()

    asyncio.run(main())
    return crashed


def test_a_hung_command_sleeps_past_its_timeout_and_is_timed_out() -> None:
    async def body(backend: FaultyBackend, crashed: list[str]) -> None:
        sandbox = await backend.create(SandboxSpec(), key="ep")
        try:
            result = await sandbox.run("echo hi", timeout_s=0.5)
            assert result.timed_out
            assert result.exit_code == -1
            assert backend.injected["hang"] == 1
        finally:
            await sandbox.close()

    _with_backend(body, FaultPlan(hang_p=1.0, hang_extra_s=30.0))


def test_a_crashing_sandbox_dies_with_its_chosen_command() -> None:
    async def body(backend: FaultyBackend, crashed: list[str]) -> None:
        sandbox = await backend.create(SandboxSpec(), key="ep")
        try:
            assert sandbox.crash_at == 2
            assert (await sandbox.run("echo one")).output == "one\n"
            assert not crashed
            with contextlib.suppress(SandboxError):  # the crash comes while this runs
                await sandbox.run("sleep 0.2")
            assert crashed == [sandbox.inner.id]
            with pytest.raises(SandboxError):
                await sandbox.run("echo three")
            assert backend.injected["crash"] == 1
        finally:
            await sandbox.close()

    _with_backend(body, FaultPlan(crash_p=1.0, crash_at=(2, 2)))


def test_faults_are_drawn_per_key_and_attempt_whatever_the_order() -> None:
    plan = FaultPlan(seed=7, crash_p=0.5, crash_at=(1, 4))
    keys = [f"ep{i}" for i in range(8)] * 3

    async def decisions(order: list[str]) -> dict[tuple[str, int], int | None]:
        backend = FaultyBackend(_Bare(), plan, crash=lambda sandbox: asyncio.sleep(0))
        seen: dict[tuple[str, int], int | None] = {}
        for key in order:
            sandbox = await backend.create(SandboxSpec(), key=key)
            seen[key, sum(1 for k, _ in seen if k == key) + 1] = sandbox.crash_at
        return seen

    first = asyncio.run(decisions(keys))
    second = asyncio.run(decisions(keys[::-1]))
    assert first == second
    assert any(first[k, 1] != first[k, 2] for k in set(keys))  # a retry draws afresh
    assert {None, 1, 4} <= set(first.values())


class _Bare:
    """A backend whose sandboxes do nothing (for decisions only)."""

    name = "bare"

    async def create(self, spec: SandboxSpec) -> Sandbox:
        sandbox = await InMemoryBackend().create(spec)
        await sandbox.close()
        return sandbox

    async def fork(self, snapshot: object, n: int, spec: SandboxSpec) -> list[Sandbox]:
        raise NotImplementedError

    async def close(self) -> None:
        pass


def test_without_a_crash_function_nothing_crashes() -> None:
    async def main() -> None:
        backend = FaultyBackend(InMemoryBackend(), FaultPlan(crash_p=1.0))
        sandbox = await backend.create(SandboxSpec())
        try:
            assert isinstance(sandbox, FaultySandbox)
            assert sandbox.crash_at is None
            assert (await sandbox.run("echo ok")).output == "ok\n"
        finally:
            await sandbox.close()
            await backend.close()

    asyncio.run(main())


def test_fault_plan_rejects_what_is_not_a_probability() -> None:
    with pytest.raises(ValueError, match="hang_p"):
        FaultPlan(hang_p=1.5)
    with pytest.raises(ValueError, match="crash_at"):
        FaultPlan(crash_at=(3, 2))


class _Model:
    """Stands in for a client's model object (a container)."""

    id = "c1"

    def start(self) -> str:
        return "started"


class _Collection:
    def __call__(self) -> None:  # the docker SDK's collections are callable too
        raise TypeError("not callable")

    def create(self) -> _Model:
        return _Model()


class _Client:
    containers = _Collection()
    base_url = "http+docker://localhost"

    def ping(self) -> bool:
        return True


def _wrap(value: object) -> bool:
    return isinstance(value, _Model | _Collection)


def test_flaky_calls_fail_a_seeded_fraction_and_proxy_what_calls_return() -> None:
    class Boom(Exception):
        pass

    flaky = FlakyCalls(_Client(), p=0.3, error=lambda name: Boom(name), rng=random.Random(1), wrap=_wrap)
    assert flaky.base_url == "http+docker://localhost"  # attributes pass through
    outcomes: list[bool | str] = []
    for _ in range(200):
        try:
            container = flaky.containers.create()
            assert container.id == "c1"
            outcomes.append(container.start() == "started")
        except Boom as exc:
            outcomes.append(str(exc))
    assert {o for o in outcomes if isinstance(o, str)} == {"_Client.containers.create", "_Model.start"}
    assert flaky.injected["calls"] > 200  # the container's own calls are counted too
    assert 0.2 < flaky.injected["daemon_error"] / flaky.injected["calls"] < 0.4
    again = FlakyCalls(_Client(), p=0.3, error=lambda name: Boom(name), rng=random.Random(1), wrap=_wrap)
    replay: list[bool | str] = []
    for _ in range(200):
        try:
            replay.append(again.containers.create().start() == "started")
        except Boom as exc:
            replay.append(str(exc))
    assert replay == outcomes  # the same seed fails the same calls


def test_flaky_calls_with_p_zero_change_nothing() -> None:
    flaky = FlakyCalls(_Client(), p=0.0, error=RuntimeError, rng=random.Random(0), wrap=_wrap)
    assert all(flaky.ping() for _ in range(50))
    assert flaky.injected["daemon_error"] == 0
