"""A ``skyrl-agent run`` SIGKILLed mid-episode leaks its containers; ``skyrl-agent reap`` or the next run removes them.

SIGKILL runs no exit handler, so the run's own reaper cannot help: the containers stay until a later process sees
that the lease of their ``skyrl.owner`` has expired (the runs here hold leases of ``LEASE_TTL_S``). The episodes
are held mid-run by a model server that accepts connections and never answers, so the containers are certainly up
when the run is killed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyrl_agent.cli import main
from skyrl_agent.sandbox.docker_backend import containers_of_run
from skyrl_agent.tasks import load_suite, save_tasks

pytestmark = [pytest.mark.docker, pytest.mark.slow]
LEASE_TTL_S = 2.0


@pytest.fixture
def silent_model_server() -> Iterator[str]:
    """The base URL of a server that accepts connections (the kernel's backlog) but never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"


def _start_run(tmp_path: Path, run_id: str, model: str, n_tasks: int) -> subprocess.Popen[bytes]:
    tasks = tmp_path / f"{run_id}.jsonl"
    save_tasks(load_suite()[:n_tasks], tasks)
    argv = [sys.executable, "-m", "skyrl_agent", "run", "--tasks", str(tasks), "--model", model, "--backend", "docker",
            "--concurrency", str(n_tasks), "--run-id", run_id, "--out", str(tmp_path / run_id)]  # fmt: skip
    env = {**os.environ, "SKYRL_LEASE_TTL_S": str(LEASE_TTL_S)}
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def _wait_for_containers(proc: subprocess.Popen[bytes], run_id: str, n: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(containers_of_run(run_id)) < n:
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before its episodes were running"
        assert time.monotonic() < deadline, f"no {n} containers of run {run_id} after {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.parametrize("cleanup", ["reap", "restart"])
def test_sigkilled_run_is_cleaned_up(tmp_path: Path, silent_model_server: str, cleanup: str) -> None:
    run_id = f"skyrl-test-killed-run-{uuid.uuid4().hex[:6]}"
    proc = _start_run(tmp_path, run_id, silent_model_server, n_tasks=2)
    try:
        _wait_for_containers(proc, run_id, 2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    try:
        assert len(containers_of_run(run_id)) == 2  # nothing cleaned up after a SIGKILL
        time.sleep(LEASE_TTL_S + 1.0)  # the killed run's lease expires
        if cleanup == "reap":
            assert main(["reap", "--run", run_id]) == 0  # no --all: the killed owner must be seen as dead
        else:
            # A new run reaps dead runs before it starts (it resolves nothing: the null policy submits at once).
            restart = _start_run(tmp_path, f"{run_id}-next", "scripted:null", n_tasks=1)
            assert restart.wait(timeout=300) == 0
            assert containers_of_run(f"{run_id}-next") == []  # and it cleans up after itself
        assert containers_of_run(run_id) == []
    finally:
        for container in containers_of_run(run_id):
            container.remove(force=True)
