"""``skyrl-agent run --harness command:ARGV --backend docker``: a command-line agent inside its container.

The agent program runs in the task's Docker sandbox, which has no network, and talks to the gateway through the
socket mounted into it (``skyrl_agent.harness.routing``): the scripted oracle plays each task's gold fix, the
program runs the reply's command, the hidden tests grade the diff. The program also tries the internet, which it
must not reach.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from skyrl_agent.tasks import load_suite
from skyrl_agent.tasks.format import save_tasks

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TIMEOUT_S = 600  # under a minute on 2 cores; this only bounds a hang
TASKS = 3

# Standard library only: the task images have Python but no openai SDK. One model call, run its bash block.
AGENT = r"""
import json, os, re, subprocess, urllib.request
def post(path, body):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + path, json.dumps(body).encode(), {
        "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    return json.load(urllib.request.urlopen(request, timeout=60))
reply = post("/chat/completions", {"model": os.environ["OPENAI_MODEL"],
             "messages": [{"role": "user", "content": os.environ["SKYRL_TASK"]}]})["choices"][0]["message"]["content"]
(command,) = re.findall(r"```mswea_bash_command\n(.*?)\n```", reply, re.S)
print("command exit", subprocess.run(["bash", "-c", command]).returncode)
try:
    urllib.request.urlopen("http://1.1.1.1/", timeout=3)
    print("internet reachable")
except OSError:
    print("internet unreachable")
"""


def test_a_command_line_agent_in_a_container_reaches_the_gateway_and_nothing_else(tmp_path: Path) -> None:
    import docker

    from skyrl_agent.sandbox import reaper

    run_id = f"command-docker-{uuid.uuid4().hex[:8]}"
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out"
    save_tasks(load_suite()[:TASKS], tasks)
    harness = "command:python3 -c " + shlex.quote(AGENT)
    command = [sys.executable, "-m", "skyrl_agent.cli", "run", "--harness", harness, "--model", "scripted:oracle",
               "--backend", "docker", "--tasks", str(tasks), "--out", str(out), "--run-id", run_id]  # fmt: skip
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
    assert summary["episodes"] == len(records) == TASKS
    assert summary["resolved_rate"] == 1.0, summary["outcomes"]
    for record in records:
        output = record["messages"][0]["content"]
        assert "command exit 0" in output, output
        assert "internet unreachable" in output, output  # the model socket leads nowhere else
        (turn,) = record["turns"]  # the gateway recorded the one call, token ids and all
        assert turn["token_ids"]
        assert record["harness"]["model_calls"] == 1  # counted by the session: the program does not say
