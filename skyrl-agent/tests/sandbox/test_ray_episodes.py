"""Episodes of the shipped suite on Docker sandboxes placed by Ray: the whole pipeline (agent, env, grading) over
the ``ray`` backend of a ``ray.cluster_utils.Cluster``, against the same episodes on the one Docker daemon.

Every node's host runs its own ``DockerBackend`` (its own lease) on this machine's daemon. The policy is the oracle
for every fourth task of the suite and the null policy (submits nothing) for the others, so "resolves as on one"
compares verdicts that differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.dispatch import DispatcherConfig, Episode, EpisodeResult, Outcome, StageLimits
from skyrl_agent.llm.base import LLMClient
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.pipeline import SWEPipeline
from skyrl_agent.run import make_llm, per_task
from skyrl_agent.sandbox import reaper
from skyrl_agent.sandbox.base import SandboxBackend, SandboxSpec
from skyrl_agent.sandbox.ray_hosts import RayHostBackend, RayHostSettings, RaySandbox
from skyrl_agent.tasks import SUITE_PATH, load_tasks
from skyrl_agent.tasks.format import SWETask

from .conftest import host_cluster

LEASE_TTL_S = 6  # the hosts' leases: a killed host's containers are reapable this long after its last renewal
DOCKER_HOSTS = RayHostSettings(inner="docker", max_sandboxes=8, start_timeout_s=120)
TASKS = load_tasks(SUITE_PATH)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two nodes offering ``sandbox_host``, their processes started with a short lease ttl."""
    with host_cluster(**{reaper.LEASE_TTL_ENV: str(LEASE_TTL_S)}) as nodes:
        yield nodes


class _PlacedHosts(RayHostBackend):
    """The ray backend, noting the node of every sandbox it starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.placed: Counter[str] = Counter()

    async def create(self, spec: SandboxSpec) -> RaySandbox:
        sandbox = await super().create(spec)
        self.placed[sandbox.host.node_id] += 1
        return sandbox


def _oracle_plays(task: SWETask) -> bool:
    return TASKS.index(task) % 4 == 0


def _policy(episode: Episode) -> LLMClient:
    """The oracle for every fourth task of the suite, the null policy for the others."""
    if _oracle_plays(episode.data["task"]):
        oracle = make_llm("scripted:oracle")
        assert callable(oracle)
        client: LLMClient = oracle(episode)
        return client
    return null_policy()


def _run(backend: SandboxBackend, tasks: list[SWETask], run_id: str) -> list[EpisodeResult]:
    """One episode per task through the pipeline and the dispatcher (4 at once); the backend is closed after."""
    pipeline = SWEPipeline(backend, AgentConfig(max_turns=30), labels={"skyrl.run": run_id})
    config = DispatcherConfig(limits=StageLimits(acquire=4, run=4, grade=4, prefetch=4))
    episodes = [Episode(task.id, {"task": task, "task_id": task.id}, task.id) for task in tasks]

    async def go() -> list[EpisodeResult]:
        try:
            return (await pipeline.dispatcher(_policy, config).run(episodes)).results
        finally:
            await backend.close()

    return asyncio.run(go())


def _outcomes(results: list[EpisodeResult]) -> list[tuple[str, str, int, str | None]]:
    """What each episode's result was, for a failing assertion's message."""
    return [(r.episode.id, str(r.outcome), r.attempts, r.error) for r in results]


def _containers_and_leases(run_id: str) -> tuple[list[str], list[str]]:
    from skyrl_agent.sandbox import docker_backend, docker_leases

    client = docker_backend.connect()
    try:
        containers, _ = docker_backend.list_managed(client, run_id)
        return [c.short_id for c in containers], [str(v.name) for v in docker_leases.list_leases(client, run_id)]
    finally:
        client.close()


@pytest.mark.ray
@pytest.mark.docker
def test_shipped_episodes_spread_over_two_hosts_resolve_as_on_one(cluster: Any) -> None:
    from skyrl_agent.sandbox.docker_backend import DockerBackend

    tasks = TASKS[::2]  # every repository of the suite; the oracle plays half of them
    one = _run(DockerBackend(run_id="skyrl-test-one-host"), tasks, "skyrl-test-one-host")
    hosts = _PlacedHosts(DOCKER_HOSTS, run_id="skyrl-test-ray-hosts")
    spread = _run(hosts, tasks, "skyrl-test-ray-hosts")
    assert len(hosts.placed) == 2  # both hosts held sandboxes (episodes' and graders'), evenly
    assert min(hosts.placed.values()) >= len(tasks) // 2
    assert per_task(spread) == per_task(one), _outcomes([*one, *spread])
    resolved = {task_id for task_id, (ok, _) in per_task(one).items() if ok}
    assert resolved == {task.id for task in tasks if _oracle_plays(task)}  # the oracle's tasks, and only those
    assert all(r.outcome in (Outcome.RESOLVED, Outcome.UNRESOLVED) and r.attempts == 1 for r in spread)
    assert _containers_and_leases("skyrl-test-ray-hosts") == ([], [])


@pytest.mark.ray
@pytest.mark.docker
def test_a_host_killed_mid_run_loses_no_episode_and_leaves_nothing(cluster: Any) -> None:
    run_id = "skyrl-test-ray-killed"
    doomed = cluster.add_node(num_cpus=1, resources={"sandbox_host": 1})
    cluster.wait_for_nodes()
    hosts = _PlacedHosts(DOCKER_HOSTS, run_id=run_id)
    assert doomed.node_id in {host.node_id for host in hosts.hosts}
    killed = threading.Event()

    def kill_when_busy() -> None:
        """Remove the node once a sandbox has started on it."""
        deadline = time.monotonic() + 120
        while not hosts.placed[doomed.node_id] and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.remove_node(doomed)
        killed.set()

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    tasks = TASKS[:12]  # three waves of four: some episodes start after the kill
    results = _run(hosts, tasks, run_id)
    killer.join(timeout=150)
    assert killed.is_set()
    assert hosts.placed[doomed.node_id] >= 1
    assert sorted(r.episode.id for r in results) == sorted(task.id for task in tasks)  # each once, none lost
    lost = [r for r in results if r.attempts > 1]
    assert lost, "no episode met the killed host: the kill came too late to test anything"
    # Retried on a live host, every episode ends as it would have without the kill; none got a reward of 0 for it.
    assert per_task(results) == {task.id: (int(_oracle_plays(task)), 1) for task in tasks}
    # The killed host's containers stay until its lease expires; then any reaper removes them and the lease.
    containers, leases = _containers_and_leases(run_id)
    assert len(leases) == 1, (containers, leases)  # the killed host's: the live hosts released theirs on close
    deadline = time.monotonic() + 60
    while _containers_and_leases(run_id) != ([], []) and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            reaper.reap(run_id)
        time.sleep(1)
    assert _containers_and_leases(run_id) == ([], [])
