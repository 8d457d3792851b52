"""DockerSandbox.close when removing the container fails: idempotent, only a SandboxError, logged, reapable."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import docker
import docker.errors
import pytest
import requests.exceptions

from skyrl_agent.dispatch import Dispatcher, Episode, GradeResult, Outcome, RunContext
from skyrl_agent.sandbox import docker_backend, docker_calls, reaper
from skyrl_agent.sandbox.base import Sandbox, SandboxError, SandboxSpec
from skyrl_agent.sandbox.docker_backend import DockerBackend, DockerSandbox, containers_of_run
from skyrl_agent.testing import ScriptedClient

from .conftest import SPEC


@pytest.fixture(autouse=True)
def no_removal_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_calls, "REMOVE_BACKOFF_S", (0.0, 0.0, 0.0, 0.0))


class FakeContainer:
    """A container whose removal raises ``error`` every time (``None``: removal works)."""

    def __init__(self, error: Exception | None) -> None:
        self.id = "c0ffee" * 10 + "0000"
        self.labels: dict[str, str] = {}
        self.error = error
        self.remove_calls = 0

    def remove(self, force: bool = False) -> None:
        self.remove_calls += 1
        if self.error is not None:
            raise self.error


class FakeShell:
    def __init__(self) -> None:
        self.closes = 0

    async def close(self) -> None:
        self.closes += 1


def _open_sandbox(error: Exception | None) -> tuple[DockerBackend, DockerSandbox, FakeContainer, FakeShell]:
    """A sandbox registered with its backend as ``create`` leaves it, over a fake container and shell."""
    backend = DockerBackend(run_id="skyrl-test-close")
    container, shell = FakeContainer(error), FakeShell()
    sandbox = DockerSandbox(backend, container, SandboxSpec(), shell)  # type: ignore[arg-type]
    backend._open[container.id] = sandbox
    return backend, sandbox, container, shell


DAEMON_ERRORS = [
    pytest.param(docker.errors.APIError("500 Server Error: driver failed to remove root filesystem"), id="api-error"),
    pytest.param(requests.exceptions.ConnectionError("daemon went away"), id="daemon-unreachable"),
]


@pytest.mark.parametrize("error", DAEMON_ERRORS)
def test_failed_removal_raises_only_sandbox_error_once_and_logs(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    backend, sandbox, container, shell = _open_sandbox(error)

    async def main() -> None:
        with pytest.raises(SandboxError, match=r"could not be removed; run `skyrl-agent reap --run skyrl-test-close`"):
            await sandbox.close()
        await sandbox.close()  # idempotent: nothing is retried or raised a second time
        await backend.close()  # the failed sandbox is no longer the backend's to close

    with caplog.at_level(logging.WARNING, logger=docker_backend.__name__):
        asyncio.run(main())
    assert container.remove_calls == 1 + len(docker_calls.REMOVE_BACKOFF_S)
    assert shell.closes == 1
    assert backend.leaked == [container.id]
    assert any("was not removed after 5 attempts" in r.getMessage() for r in caplog.records)


def test_container_removed_behind_its_back_closes_quietly() -> None:
    backend, sandbox, container, _ = _open_sandbox(docker.errors.NotFound("No such container"))
    asyncio.run(sandbox.close())
    asyncio.run(sandbox.close())
    assert container.remove_calls == 1
    assert backend.leaked == []


def test_failed_release_does_not_fail_the_episode() -> None:
    """The dispatcher counts a release that raised and keeps the episode's outcome."""
    _, sandbox, _, _ = _open_sandbox(docker.errors.APIError("boom"))

    async def acquire(episode: Episode) -> Sandbox:
        return sandbox

    async def run_agent(episode: Episode, sb: Sandbox, llm: Any, ctx: RunContext) -> Any:
        class Done:
            finish_reason, truncated = "submitted", False

        return Done()

    async def grade(episode: Episode, sb: Sandbox, trajectory: Any) -> GradeResult:
        return GradeResult(1.0, True)

    async def release(sb: Sandbox) -> None:
        await sb.close()

    dispatcher = Dispatcher(acquire, run_agent, grade, release, ScriptedClient(["x"]))
    out = asyncio.run(dispatcher.run([Episode("e")]))
    assert out.results[0].outcome is Outcome.RESOLVED
    assert out.metrics["release_errors"] == 1.0


def test_a_start_is_removed_by_whoever_holds_it_when_its_caller_left() -> None:
    late = docker_backend._Handoff()
    assert late.deliver(("container", None))  # the thread handed it over...
    assert late.abandon() == ("container", None)  # ...just before the caller was cancelled: the caller removes it
    early = docker_backend._Handoff()
    assert early.abandon() is None  # the caller left first...
    assert early.abandoned
    assert not early.deliver(("container", None))  # ...so the thread keeps, and removes, what it started


# -- against the daemon ----------------------------------------------------------------------------------------


@pytest.mark.docker
def test_a_container_that_survives_close_is_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = "skyrl-test-close-leak"

    async def main() -> None:
        backend = DockerBackend(run_id=run_id)
        sandbox = await backend.create(SPEC)
        try:

            def failing_remove(**kwargs: Any) -> None:
                raise docker.errors.APIError("injected: the daemon could not remove the container")

            monkeypatch.setattr(sandbox.container, "remove", failing_remove)
            with pytest.raises(SandboxError, match="could not be removed"):
                await sandbox.close()
            await sandbox.close()
            assert [c.id for c in containers_of_run(run_id)] == [sandbox.container.id]  # leaked, as reported
            assert backend.leaked == [sandbox.container.id]
        finally:
            await backend.close()

    try:
        asyncio.run(main())
        # The owner (this process) is alive, so only an explicit reap of the run removes it.
        report = reaper.reap(run_id, dead_only=False)
        assert len(report.containers) == 1
        assert containers_of_run(run_id) == []
    finally:
        reaper.reap(run_id, dead_only=False)


@pytest.mark.docker
def test_closing_a_sandbox_whose_container_was_removed_externally() -> None:
    async def main() -> None:
        backend = DockerBackend(run_id="skyrl-test-close-gone")
        try:
            sandbox = await backend.create(SPEC)
            await asyncio.to_thread(sandbox.container.remove, force=True)
            await sandbox.close()
            await sandbox.close()
            assert backend.leaked == []
        finally:
            await backend.close()

    asyncio.run(main())
    assert containers_of_run("skyrl-test-close-gone") == []


class LostCreateResponse:
    """A docker client whose ``containers.create`` reaches the daemon (the container is made) and then fails as a
    connection broken before the answer would (a daemon restarting mid-call); ``api.remove_container`` fails
    ``remove_failures`` times first, as a daemon still down would."""

    def __init__(self, client: Any, remove_failures: int = 0) -> None:
        self._client = client
        self.remove_failures = remove_failures
        self.created: list[str] = []
        self.containers = _Proxy(client.containers, create=self._create)
        self.api = _Proxy(client.api, remove_container=self._remove_container)

    def _create(self, *args: Any, **kwargs: Any) -> Any:
        container = self._client.containers.create(*args, **kwargs)
        self.created.append(container.id)
        raise requests.exceptions.ConnectionError("injected: the connection broke before the answer")

    def _remove_container(self, ref: str, force: bool = False) -> None:
        if self.remove_failures > 0:
            self.remove_failures -= 1
            raise requests.exceptions.ConnectionError("injected: the daemon is still down")
        self._client.api.remove_container(ref, force=force)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _Proxy:
    """``inner`` with some attributes replaced."""

    def __init__(self, inner: Any, **replaced: Any) -> None:
        self._inner = inner
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.docker
@pytest.mark.parametrize("remove_failures", [0, 5], ids=["removed-at-once", "removed-at-close"])
def test_a_container_made_by_a_create_whose_answer_was_lost_is_removed(remove_failures: int) -> None:
    run_id = f"skyrl-test-lost-create-{remove_failures}"

    async def main() -> None:
        backend = DockerBackend(run_id=run_id)
        real = await backend._connect()
        lossy = LostCreateResponse(real, remove_failures)
        backend._client = lossy
        try:
            with pytest.raises(SandboxError, match="stopped answering"):
                await backend.create(SPEC)
            assert len(lossy.created) == 1  # the daemon did make it
            left = [c.id for c in containers_of_run(run_id)]
            assert left == ([] if remove_failures == 0 else lossy.created)
        finally:
            await backend.close()
            backend._client = real
        assert containers_of_run(run_id) == []
        assert backend.leaked == []

    try:
        asyncio.run(main())
    finally:
        reaper.reap(run_id, dead_only=False)
