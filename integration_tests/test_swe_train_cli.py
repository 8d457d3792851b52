"""``skyrl-train --config skyrl-train/examples/swe_react.yaml``: SWE agent RL from the command line, on CPU.

Exports the prompt rows with ``skyrl-agent tasks export-dataset``, keeps two tasks, and runs the real CLI on the
example config with overrides that shrink it to the tiny model (a 2048-position build: the SWE prompts are ~800
tokens), the local engine, the in-process backend and two steps of 2 tasks × 2 episodes of at most 2 turns in
Docker sandboxes. Then checks that both steps trained with the agent's metrics, and that no container, image or
lease of the run is left. The reaper is off, so only the run itself can have cleaned up: the dispatcher releasing
each episode's sandbox and the generator's ``close`` at the end (``skyrl-agent/tests/integrations/
test_train_factory.py`` checks that ``close`` removes sandboxes still open).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from skyrl_train.models.tiny import TinyModelSpec, build_tiny_model

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "skyrl-train" / "examples" / "swe_react.yaml"
MINI_EXAMPLE = REPO / "skyrl-train" / "examples" / "swe_mini_swe_agent.yaml"
TIMEOUT_S = 600  # the run takes about a minute on 2 cores; this only bounds a hang

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def long_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 2048 positions: an SWE episode's first prompt alone is longer than the default 512."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-2048"), spec=TinyModelSpec(max_position_embeddings=2048))


@pytest.fixture(scope="module")
def longer_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 8192 positions: mini-swe-agent's first prompt is ≈4,100 tokens of the tiny tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-8192"), spec=TinyModelSpec(max_position_embeddings=8192))


def _two_tasks(tmp_path: Path) -> Path:
    """The documented export of the suite, cut to two tasks of different repositories."""
    everything = tmp_path / "all.jsonl"
    command = [sys.executable, "-m", "skyrl_agent.cli", "tasks", "export-dataset", str(everything)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in everything.read_text().splitlines()]
    picked = [rows[0], next(row for row in rows if row["data_source"] != rows[0]["data_source"])]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in picked))
    return train


def _overrides(model: Path, train: Path, run_dir: Path, run_id: str) -> list[str]:
    return [
        f"model.path={model}",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        f"data.train_data=[{train}]",
        "data.max_prompt_length=1024",
        f"generator.factory_kwargs.run_id={run_id}",
        "generator.factory_kwargs.reaper=false",
        "generator.factory_kwargs.max_concurrent_starts=4",
        "generator.n_samples_per_prompt=2",
        "generator.max_turns=2",
        "generator.max_generate_length=32",
        "generator.max_input_length=1536",
        "generator.max_concurrent_trajectories=4",
        "generator.timeout_s=300",
        "inference.engine=local",
        "inference.num_engines=1",
        "inference.num_gpus_per_engine=0",
        "inference.engine_kwargs.max_model_len=2048",
        "trainer.backend=torch",
        "trainer.num_training_workers=1",
        "trainer.num_gpus_per_worker=0",
        "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=2",
        "trainer.micro_train_batch_size=4",
        "trainer.micro_forward_batch_size=4",
        "trainer.remove_padding=false",
        "trainer.max_training_steps=2",
        "trainer.ckpt_interval=0",
        "trainer.logger=[jsonl]",
        f"trainer.run_dir={run_dir}",
    ]


def _leftovers(run_id: str) -> list[str]:
    """Containers, images and lease volumes labelled with the run (what ``docker ps -a --filter label=…`` lists)."""
    import docker

    client = docker.from_env()
    try:
        label = {"label": f"skyrl.run={run_id}"}
        containers = [f"container {c.name}" for c in client.containers.list(all=True, filters=label)]
        images = [f"image {i.short_id}" for i in client.images.list(filters=label)]
        volumes = [f"volume {v.name}" for v in client.volumes.list(filters=label)]
        return containers + images + volumes
    finally:
        client.close()


def _train(tmp_path: Path, example: Path, model: Path, extra: tuple[str, ...] = ()) -> tuple[Path, list[dict]]:
    """Run ``skyrl-train --config example`` shrunk to ``model`` (and ``extra``); the run dir and the steps' metrics."""
    from skyrl_agent.sandbox import reaper

    run_id = f"swe-cli-test-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "skyrl_train", "--config", str(example)]
    command += [*_overrides(model, _two_tasks(tmp_path), run_dir, run_id), *extra]
    try:
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
        left = _leftovers(run_id)
    finally:
        reaper.reap(run_id, dead_only=False)  # whatever happened, leave nothing on the machine
    assert done.returncode == 0, f"skyrl-train failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    assert "done: 2 steps" in done.stdout
    assert left == [], f"the run left Docker resources behind: {left}"
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, [line for line in lines if "reward/mean" in line]


def test_swe_example_trains_two_steps_from_the_cli(tmp_path: Path, long_tiny_model: Path) -> None:
    run_dir, steps = _train(tmp_path, EXAMPLE, long_tiny_model)
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert line["agent/episodes"] == 4  # 2 tasks × 2 samples, each one episode through the dispatcher
        outcomes = {k: v for k, v in line.items() if k.startswith("agent/outcome/") and k.endswith("/count")}
        assert sum(outcomes.values()) == 4, outcomes
        # The sandboxes started and the agent ran: no episode was lost to the infrastructure.
        assert line["agent/stage/acquire/peak"] >= 1
        assert line["agent/outcome/sandbox_error/count"] == 0
        assert line["agent/outcome/agent_error/count"] == 0
        assert line["generate/num_generated_tokens/mean"] > 0
        assert 0.0 <= line["reward/mean"] <= 1.0
    # The run's timeline holds the episodes' phases: sandbox starts and closes, env init, LLM calls on the engine.
    trace = json.loads((run_dir / "trace.json").read_text())
    spans = {(event["cat"], event["name"]) for event in trace["traceEvents"] if event["ph"] == "X"}
    assert {("sandbox", "start"), ("sandbox", "close"), ("env", "init"), ("engine", "generate")} <= spans, spans
    assert 0 < steps[0]["timing/engine_busy_fraction"] <= 1


def test_mini_swe_agent_example_trains_two_steps_from_the_cli(tmp_path: Path, longer_tiny_model: Path) -> None:
    """mini-swe-agent, unmodified, plays the episodes through the run's gateway; its recorded tokens are trained."""
    pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (skyrl-agent[mini-swe-agent])")
    extra = ("generator.max_input_length=7680", "inference.engine_kwargs.max_model_len=8192")
    run_dir, steps = _train(tmp_path, MINI_EXAMPLE, longer_tiny_model, extra)
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert line["agent/episodes"] == 4
        assert line["agent/outcome/sandbox_error/count"] == 0
        assert line["agent/outcome/agent_error/count"] == 0  # the harness ran to its own end in every episode
        assert line["generate/num_generated_tokens/mean"] > 0  # rows hold the tokens the gateway recorded
        assert "harness/commands/mean" in line  # the harness metrics reach the run's log
        assert line["harness/samples_per_episode/mean"] >= 1  # every episode made model calls
        assert 0.0 <= line["reward/mean"] <= 1.0
    trace = json.loads((run_dir / "trace.json").read_text())
    spans = {(event["cat"], event["name"]) for event in trace["traceEvents"] if event["ph"] == "X"}
    assert {("sandbox", "start"), ("sandbox", "close"), ("env", "init")} <= spans, spans
