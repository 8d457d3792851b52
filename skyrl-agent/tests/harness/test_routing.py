"""How a harness inside its sandbox reaches its model: which harnesses get a model socket, their URLs, the check."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.dispatch import Episode
from skyrl_agent.dispatch.outcomes import Outcome, Treatment
from skyrl_agent.harness import CommandHarness, HarnessPipeline
from skyrl_agent.harness.base import Endpoint, HarnessJob, HarnessResult
from skyrl_agent.harness.routing import forwarded_url, relay_target, relays_model, runs_in_sandbox
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.sandbox.base import SandboxSpec
from skyrl_agent.sandbox.process_backend import ProcessBackend, ProcessSandbox
from skyrl_agent.tasks import load_suite


class BesideHarness:
    """A harness whose own process stays on the host (as mini-swe-agent's does)."""

    name = "beside"

    def __call__(self, job: HarnessJob) -> HarnessResult:
        return HarnessResult("Submitted")


class MountingProcessBackend(ProcessBackend):
    """The process backend, claiming to mount model sockets (as the Docker backend does); keeps the specs."""

    mounts_model_socket = True

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[SandboxSpec] = []

    async def create(self, spec: SandboxSpec) -> ProcessSandbox:
        self.specs.append(spec)
        return await super().create(spec)


@pytest.mark.parametrize(
    ("url", "forwarded", "target"),
    [
        ("http://127.0.0.1:8000/s/ep-1/v1", "http://127.0.0.1:17400/s/ep-1/v1", ("127.0.0.1", 8000)),
        ("http://localhost/v1", "http://127.0.0.1:17400/v1", ("localhost", 80)),
        ("http://user:key@0.0.0.0:9/v1", "http://user:key@127.0.0.1:17400/v1", ("0.0.0.0", 9)),
        ("http://[::1]:8000/v1", "http://127.0.0.1:17400/v1", ("::1", 8000)),
        ("http://10.1.2.3:8000/v1", "http://127.0.0.1:17400/v1", ("10.1.2.3", 8000)),  # a server elsewhere
    ],
)
def test_a_sandbox_reaches_any_server_at_its_forwarders_port(url: str, forwarded: str, target: tuple[str, int]) -> None:
    assert forwarded_url(url) == forwarded
    assert relay_target(url) == target


def test_only_a_harness_inside_its_sandbox_on_a_mounting_backend_gets_a_model_socket() -> None:
    command = CommandHarness(["true"])
    assert runs_in_sandbox(command)
    assert not runs_in_sandbox(BesideHarness())
    assert relays_model(MountingProcessBackend(), command)
    assert not relays_model(MountingProcessBackend(), BesideHarness())
    assert not relays_model(ProcessBackend(), command)  # host processes are no isolation boundary: the URL as is


def _pipeline(backend: ProcessBackend, harness: Any, endpoint: Endpoint) -> HarnessPipeline:
    return HarnessPipeline(backend, AgentConfig(), harness=harness, endpoint=endpoint)


def test_the_agents_sandbox_gets_a_model_socket_for_its_life_and_grading_sandboxes_none() -> None:
    task = load_suite()[0]
    backend = MountingProcessBackend()
    pipeline = _pipeline(backend, CommandHarness(["true"]), Endpoint("http://127.0.0.1:8000/v1", "key", "policy"))

    async def main() -> None:
        sandbox = await pipeline.acquire(Episode(task.id, {"task": task}))
        directory = backend.specs[-1].model_socket_dir
        assert directory is not None
        assert (Path(directory) / "forward.py").is_file()
        await pipeline.release(sandbox)
        assert not Path(directory).exists()

    asyncio.run(main())
    (spec,) = backend.specs
    assert not spec.network  # the socket is the one way out: no network
    assert pipeline._spec(task, {}).model_socket_dir is None  # grading sandboxes stay off every network
    assert not pipeline._spec(task, {}).network
    beside = _pipeline(MountingProcessBackend(), BesideHarness(), Endpoint("http://127.0.0.1:8000/v1", "k", "m"))
    _, given = beside._endpoint(Episode(task.id, {"task": task}))
    assert given.base_url == "http://127.0.0.1:8000/v1"  # a harness on the host uses the URL as it is


def test_a_harness_inside_its_sandbox_whose_model_is_unreachable_fails_at_its_start() -> None:
    task = load_suite()[0]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: nothing answers there
        endpoint = Endpoint(f"http://127.0.0.1:{closed.getsockname()[1]}/v1", "key", "gone")
        pipeline = _pipeline(ProcessBackend(), CommandHarness(["sleep", "600"]), endpoint)
        (result,) = asyncio.run(pipeline.dispatcher(null_policy()).run([Episode(task.id, {"task": task})])).results
    assert result.outcome is Outcome.MODEL_ERROR, result.error
    assert result.treatment is Treatment.MASK  # not trained on with reward 0
    assert f"GET {endpoint.base_url}/models failed" in str(result.error)
    assert "Connection refused" in str(result.error)
