"""Routes from a sandbox to a server on the host: which harnesses need one, and the URLs they are given."""

from __future__ import annotations

import asyncio

import pytest

from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.harness import CommandHarness, HarnessPipeline
from skyrl_agent.harness.base import Endpoint, HarnessJob, HarnessResult
from skyrl_agent.harness.routing import routed_url, runs_in_sandbox, sandbox_route
from skyrl_agent.sandbox.base import HostRoute
from skyrl_agent.tasks import load_suite
from skyrl_agent.tasks.process_backend import ProcessBackend

ROUTE = HostRoute("skyrl-host-only", "172.18.0.1")


class BesideHarness:
    """A harness whose own process stays on the host (as mini-swe-agent's does)."""

    name = "beside"

    def __call__(self, job: HarnessJob) -> HarnessResult:
        return HarnessResult("Submitted")


class RoutedProcessBackend(ProcessBackend):
    """The process backend, claiming a host route (as the Docker backend has)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def host_route(self) -> HostRoute:
        self.asked += 1
        return ROUTE


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000/s/ep-1/v1", "http://172.18.0.1:8000/s/ep-1/v1"),
        ("http://localhost/v1", "http://172.18.0.1/v1"),
        ("http://user:key@0.0.0.0:9/v1", "http://user:key@172.18.0.1:9/v1"),
        ("http://[::1]:8000/v1", "http://172.18.0.1:8000/v1"),
        ("https://api.example.com/v1", "https://api.example.com/v1"),  # not on the host: left alone
        ("http://172.18.0.1:8000/v1", "http://172.18.0.1:8000/v1"),  # already the route's address
    ],
)
def test_loopback_hosts_become_the_routes_address(url: str, expected: str) -> None:
    assert routed_url(url, ROUTE) == expected
    assert routed_url(url, None) == url


def test_only_a_harness_inside_its_sandbox_on_a_routed_backend_gets_a_route() -> None:
    command = CommandHarness(["true"])
    assert runs_in_sandbox(command)
    assert not runs_in_sandbox(BesideHarness())
    routed = RoutedProcessBackend()
    assert asyncio.run(sandbox_route(routed, command)) == ROUTE
    assert asyncio.run(sandbox_route(routed, BesideHarness())) is None
    assert routed.asked == 1  # a harness beside its sandbox never creates the network
    assert asyncio.run(sandbox_route(ProcessBackend(), command)) is None  # host processes reach the host as it is


def test_a_routed_pipeline_puts_the_agents_sandbox_on_the_network_and_rewrites_its_url() -> None:
    task = load_suite()[0]
    endpoint = Endpoint("http://127.0.0.1:8000/v1", "key", "policy")
    pipeline = HarnessPipeline(
        ProcessBackend(), AgentConfig(), harness=CommandHarness(["true"]), endpoint=endpoint, route=ROUTE
    )
    assert pipeline._agent_spec(task).network_name == "skyrl-host-only"
    assert pipeline._spec(task, {}).network_name is None  # grading sandboxes stay off every network
    from skyrl_agent.dispatch import Episode

    _, given = pipeline._endpoint(Episode(task.id, {"task": task}))
    assert given == Endpoint("http://172.18.0.1:8000/v1", "key", "policy")
