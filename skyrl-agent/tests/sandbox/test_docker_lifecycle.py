"""Docker sandboxes at the edges of their life: a cancelled create or close, and the container's log limit."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import docker.models.containers
import pytest

from skyrl_agent.sandbox import docker_backend
from skyrl_agent.sandbox.docker_backend import DockerBackend, containers_of_run

from .conftest import SPEC

pytestmark = pytest.mark.docker


def _remove_run(run_id: str) -> None:
    for container in containers_of_run(run_id):
        container.remove(force=True)


@pytest.mark.parametrize("held_in", ["create", "start"])
def test_create_cancelled_during_the_daemon_call_leaves_no_container(
    held_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task awaiting ``create`` is cancelled while the daemon call runs in its thread; the call then completes."""
    run_id = f"skyrl-test-cancel-{held_in}"
    in_call, go_on = threading.Event(), threading.Event()
    real_create = docker.models.containers.ContainerCollection.create

    def held_create(self: Any, *args: Any, **kwargs: Any) -> Any:
        container = real_create(self, *args, **kwargs)
        if held_in == "create":
            in_call.set()
            go_on.wait(60)
            return container
        real_start = container.start

        def held_start(**start_kwargs: Any) -> None:
            real_start(**start_kwargs)
            in_call.set()
            go_on.wait(60)

        container.start = held_start
        return container

    monkeypatch.setattr(docker.models.containers.ContainerCollection, "create", held_create)

    async def main() -> None:
        backend = DockerBackend(run_id=run_id)
        try:
            creating = asyncio.create_task(backend.create(SPEC))
            assert await asyncio.to_thread(in_call.wait, 60), "the daemon call never started"
            creating.cancel()
            with pytest.raises(asyncio.CancelledError):
                await creating
        finally:
            go_on.set()  # the daemon call returns after its caller has gone
            await backend.close()

    try:
        asyncio.run(main())  # returns once the start thread has finished
        assert containers_of_run(run_id) == []
    finally:
        go_on.set()
        _remove_run(run_id)


def test_close_cancelled_before_removal_is_retried_by_the_next_close() -> None:
    run_id = "skyrl-test-cancel-close"

    async def main() -> None:
        backend = DockerBackend(run_id=run_id)
        try:
            sandbox = await backend.create(SPEC)
            real_close, calls = sandbox._shell.close, []
            in_close = asyncio.Event()

            async def slow_shell_close() -> None:
                calls.append(1)
                await real_close()
                if len(calls) == 1:
                    in_close.set()
                    await asyncio.sleep(3600)  # the first close is cancelled here, before the container is removed

            sandbox._shell.close = slow_shell_close  # type: ignore[method-assign]
            closing = asyncio.create_task(sandbox.close())
            await in_close.wait()
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            await sandbox.close()  # must really remove it this time
            assert await asyncio.to_thread(containers_of_run, run_id) == []
        finally:
            await backend.close()

    try:
        asyncio.run(main())
    finally:
        _remove_run(run_id)


def test_container_logs_are_size_limited() -> None:
    async def main() -> None:
        backend = DockerBackend(run_id="skyrl-test-logs")
        try:
            sandbox = await backend.create(SPEC)
            await asyncio.to_thread(sandbox.container.reload)
            log_config = sandbox.container.attrs["HostConfig"]["LogConfig"]
            assert log_config == {
                "Type": "json-file",
                "Config": {"max-size": docker_backend.LOG_MAX_SIZE, "max-file": str(docker_backend.LOG_MAX_FILES)},
            }
        finally:
            await backend.close()

    asyncio.run(main())


def test_log_limits_are_configurable() -> None:
    async def main() -> None:
        backend = DockerBackend(run_id="skyrl-test-logs", log_max_size="1m", log_max_files=3)
        try:
            sandbox = await backend.create(SPEC)
            await asyncio.to_thread(sandbox.container.reload)
            config = sandbox.container.attrs["HostConfig"]["LogConfig"]["Config"]
            assert config == {"max-size": "1m", "max-file": "3"}
        finally:
            await backend.close()

    asyncio.run(main())
