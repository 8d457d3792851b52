from __future__ import annotations

import json
from pathlib import Path

import pytest

from skyrl_train import quickstart


def test_problems_split_and_format() -> None:
    train, held_out = quickstart.make_problems(seed=1, eval_problems=200)
    assert (len(train), len(held_out)) == (800, 200)
    assert not {p.question for p in train} & {p.question for p in held_out}
    assert quickstart.make_problems(seed=1, eval_problems=200) == (train, held_out)
    for problem in held_out[:20]:
        a, b = (int(x) for x in problem.question.removeprefix("What is ").rstrip("?").split(" + "))
        assert int(problem.answer) == a + b
        assert problem.row()["reward_spec"]["ground_truth"] == problem.answer


@pytest.mark.slow
def test_quickstart_smoke_run_writes_everything(tmp_path: Path) -> None:
    assert quickstart.main(["--smoke", "--run-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"eval_reward_before_rl", "eval_reward_after_rl", "wall_seconds", "paths"} <= summary.keys()
    assert summary["rl_steps"] == 2
    for key in ("sft_model", "export", "plot", "metrics"):
        assert Path(summary["paths"][key]).exists(), key
    assert (tmp_path / "rl" / "config.yaml").exists()
    assert (tmp_path / "rl" / "tensorboard").is_dir()
