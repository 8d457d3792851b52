from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from skyrl_train import checkpoint
from skyrl_train.checkpoint import (
    CRITIC_DIR,
    MARKER_FILE,
    CheckpointError,
    capture_rng_state,
    cleanup_checkpoints,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    load_models,
    resolve_resume_dir,
    restore_rng_state,
    save_checkpoint,
    save_models,
    step_dir,
)
from skyrl_train.data import PromptLoader


def _backend_save(path: Path) -> None:
    """Stands in for backend.save: writes model and optimizer files."""
    (path / "policy").mkdir()
    torch.save({"w": torch.arange(4.0)}, path / "policy" / "model_state.pt")
    (path / "policy" / "optimizer_state.pt").write_bytes(b"opt")


def _marker(root: Path) -> str:
    return (root / MARKER_FILE).read_text().strip()


def _draw() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_save_layout_and_load(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    path = save_checkpoint(
        root,
        5,
        write_state=_backend_save,
        config={"trainer": {"seed": 1}},
        metrics={"reward/mean": np.float32(0.5), "loss": torch.tensor(0.25)},
        extra={"kl_coef": 0.01},
        loader_state={"epoch": 1, "position": 8, "seed": 3, "dataset_size": 20},
    )
    assert path == step_dir(root, 5) == root / "global_step_5"
    assert sorted(p.name for p in path.iterdir()) == ["data_state.json", "policy", "rng_state.pt", "trainer_state.json"]
    assert _marker(root) == "5"
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []
    saved = json.loads((path / "trainer_state.json").read_text())
    assert saved["global_step"] == 5
    assert saved["metrics"] == {"reward/mean": 0.5, "loss": 0.25}

    loaded_from: list[Path] = []
    state = load_checkpoint(find_latest(root) or Path("missing"), read_state=loaded_from.append)
    assert loaded_from == [path]
    assert state.global_step == 5
    assert state.config == {"trainer": {"seed": 1}}
    assert state.extra == {"kl_coef": 0.01}
    assert state.loader_state == {"epoch": 1, "position": 8, "seed": 3, "dataset_size": 20}


def test_exception_mid_write_keeps_previous_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, write_state=_backend_save)

    def crash(path: Path) -> None:
        (path / "policy").mkdir()
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, 2, write_state=crash)
    assert _marker(tmp_path) == "1"
    assert find_latest(tmp_path) == step_dir(tmp_path, 1)
    assert not step_dir(tmp_path, 2).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", MARKER_FILE]  # the temp dir is gone


def test_hard_crash_leaves_partial_dirs_that_are_ignored(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, write_state=_backend_save)
    # A killed writer leaves its temporary directory, half written.
    partial = tmp_path / ".tmp-global_step_2-99999999"
    partial.mkdir()
    (partial / "policy").mkdir()
    # And a step directory without trainer_state.json is not a checkpoint either.
    (tmp_path / "global_step_3").mkdir()
    assert find_latest(tmp_path) == step_dir(tmp_path, 1)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1]
    assert resolve_resume_dir("latest", tmp_path) == step_dir(tmp_path, 1)
    # The next save clears the dead writer's leftovers.
    save_checkpoint(tmp_path, 2, write_state=_backend_save)
    assert not partial.exists()
    assert find_latest(tmp_path) == step_dir(tmp_path, 2)


def test_crash_between_rename_and_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, 1, write_state=_backend_save)

    def killed(root: Path, global_step: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "_write_marker", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, write_state=_backend_save)
    assert step_dir(tmp_path, 2).is_dir()  # complete, but never committed by the marker
    assert _marker(tmp_path) == "1"
    assert find_latest(tmp_path) == step_dir(tmp_path, 1)


def test_marker_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, 1)

    def fail_replace(src: object, dst: object) -> None:
        raise OSError("crash during replace")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError, match="crash during replace"):
        checkpoint._write_marker(tmp_path, 2)
    assert _marker(tmp_path) == "1"  # readers never see a half-written marker


class _Model:
    """Saves like a training backend: its state replaces the whole directory it is given."""

    def __init__(self, state: dict[str, float]) -> None:
        self.state = state

    def save(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        (path / "state.json").write_text(json.dumps(self.state))

    def load(self, path: Path) -> None:
        self.state = json.loads((path / "state.json").read_text())


def test_policy_and_critic_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    policy, critic = _Model({"w": 1.0}), _Model({"v": 2.0})
    path = save_checkpoint(tmp_path, 3, write_state=lambda p: save_models(p, policy, critic=critic))
    assert (path / "state.json").is_file()  # the policy at the top, where runs without a critic keep it
    assert (path / CRITIC_DIR / "state.json").is_file()
    assert (path / "trainer_state.json").is_file()  # the policy's save did not wipe the trainer's files
    restored_policy, restored_critic = _Model({}), _Model({})
    load_checkpoint(path, read_state=lambda p: load_models(p, restored_policy, critic=restored_critic))
    assert (restored_policy.state, restored_critic.state) == ({"w": 1.0}, {"v": 2.0})


def test_critic_run_refuses_a_checkpoint_without_a_critic(tmp_path: Path) -> None:
    policy = _Model({"w": 1.0})
    path = save_checkpoint(tmp_path, 1, write_state=lambda p: save_models(p, policy))
    assert not (path / CRITIC_DIR).exists()
    with pytest.raises(CheckpointError, match=r"holds no critic .*trainer\.resume_mode=none"):
        load_checkpoint(path, read_state=lambda p: load_models(p, _Model({}), critic=_Model({})))
    load_checkpoint(path, read_state=lambda p: load_models(p, _Model({})))  # no critic in the run: fine


def test_resave_same_step_replaces_it(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 3, metrics={"x": 1.0})
    save_checkpoint(tmp_path, 3, metrics={"x": 2.0})
    assert load_checkpoint(step_dir(tmp_path, 3)).metrics == {"x": 2.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", MARKER_FILE]


def test_cleanup_keeps_newest_and_never_the_latest(tmp_path: Path) -> None:
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, write_state=_backend_save, max_to_keep=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 5]
    assert _marker(tmp_path) == "5"

    # Newer, unmarked checkpoints (crashes before the marker) never push out the marked one.
    (tmp_path / MARKER_FILE).write_text("4\n")
    removed = cleanup_checkpoints(tmp_path, 1)
    assert removed == []
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 5]
    assert cleanup_checkpoints(tmp_path, -1) == []


def test_broken_markers(tmp_path: Path) -> None:
    assert find_latest(tmp_path) is None
    (tmp_path / MARKER_FILE).write_text("7\n")
    with pytest.raises(CheckpointError, match="global_step_7, which is missing or incomplete"):
        find_latest(tmp_path)
    (tmp_path / MARKER_FILE).write_text("seven")
    with pytest.raises(CheckpointError, match="should hold a step number"):
        find_latest(tmp_path)


def test_resolve_resume_dir(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    assert resolve_resume_dir("latest", root) is None  # nothing saved yet: start fresh
    save_checkpoint(root, 2)
    save_checkpoint(root, 4)
    assert resolve_resume_dir("none", root) is None
    assert resolve_resume_dir("latest", root) == step_dir(root, 4)
    assert resolve_resume_dir("from_path", root, step_dir(root, 2)) == step_dir(root, 2)
    with pytest.raises(CheckpointError, match="needs resume_path"):
        resolve_resume_dir("from_path", root)
    with pytest.raises(CheckpointError, match="named global_step_N"):
        resolve_resume_dir("from_path", root, root)
    with pytest.raises(CheckpointError, match="missing or incomplete"):
        resolve_resume_dir("from_path", root, step_dir(root, 9))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(step_dir(root, 9))


def test_rng_round_trip() -> None:
    state = capture_rng_state()
    expected = _draw()
    _draw()
    restore_rng_state(state)
    assert _draw() == expected


def test_rng_restored_by_load_checkpoint(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    save_checkpoint(tmp_path, 1)
    expected = _draw()
    _draw()
    load_checkpoint(step_dir(tmp_path, 1))
    assert _draw() == expected
    load_checkpoint(step_dir(tmp_path, 1), restore_rng=False)
    assert _draw() != expected


def test_loader_state_through_a_checkpoint(tmp_path: Path) -> None:
    data = list(range(10))
    loader = PromptLoader(data, 3, seed=4)
    stream = loader.stream()
    [next(stream) for _ in range(4)]  # into the second epoch
    save_checkpoint(tmp_path, 4, loader_state=loader.state_dict())
    expected = [next(stream) for _ in range(3)]

    resumed = PromptLoader(data, 3, seed=4)
    loader_state = load_checkpoint(step_dir(tmp_path, 4)).loader_state
    assert loader_state is not None
    resumed.load_state_dict(loader_state)
    again = resumed.stream()
    assert [next(again) for _ in range(3)] == expected
