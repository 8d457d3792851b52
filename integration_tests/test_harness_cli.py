"""``skyrl-agent run --harness mini-swe-agent --model scripted:oracle --backend docker``: the documented command.

mini-swe-agent from PyPI, unmodified, solves the shipped suite in Docker sandboxes against the gateway, where the
scripted oracle engine plays each task's gold fix in mini-swe-agent's own action format. Checks the resolved rate,
that every model call's token ids were recorded, and that the run left no container behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from skyrl_agent.tasks import load_suite

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TIMEOUT_S = 900  # about two minutes on 2 cores; this only bounds a hang


def test_mini_swe_agent_resolves_the_suite_in_docker_through_the_gateway(tmp_path: Path) -> None:
    pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (skyrl-agent[mini-swe-agent])")
    import docker

    from skyrl_agent.sandbox import reaper

    run_id = f"harness-cli-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    command = [sys.executable, "-m", "skyrl_agent.cli", "run", "--harness", "mini-swe-agent", "--model",
               "scripted:oracle", "--backend", "docker", "--out", str(out), "--run-id", run_id]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
        client = docker.from_env()
        left = client.containers.list(all=True, filters={"label": f"skyrl.run={run_id}"})
        client.close()
    finally:
        reaper.reap(run_id, dead_only=False)
    assert done.returncode == 0, f"skyrl-agent run failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    assert left == [], f"the run left containers behind: {left}"
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert summary["harness"] == "mini-swe-agent"
    assert summary["episodes"] == len(records) == len(load_suite())
    assert summary["resolved_rate"] >= 0.9, summary["outcomes"]
    for record in records:
        assert record["harness"]["model_calls"] == len(record["turns"]) >= 1
        assert all(turn["token_ids"] for turn in record["turns"]), record["task_id"]
        assert record["grade"] is not None
