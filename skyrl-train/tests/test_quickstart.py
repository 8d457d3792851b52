from __future__ import annotations

import json
from pathlib import Path

from skyrl_train import quickstart


def test_problems_are_deterministic_and_well_formed() -> None:
    problems = quickstart.make_problems(5, seed=1)
    assert problems == quickstart.make_problems(5, seed=1)
    for question, truth in problems:
        a, b = (int(x) for x in question.removeprefix("What is ").split("?")[0].split(" + "))
        assert int(truth) == a + b


def test_quickstart_runs_end_to_end(tmp_path: Path) -> None:
    assert quickstart.main(["--out-dir", str(tmp_path), "--problems", "2"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["problems"] == 2
    assert 0.0 <= summary["mean_reward"] <= 1.0
    assert (tmp_path / "tiny-model" / "model.safetensors").exists()
