"""Atomic training checkpoints, resume, cleanup, and RNG state capture.

Layout under the checkpoint root (``trainer.ckpt_path``, by default ``{run_dir}/checkpoints``)::

    latest_ckpt_global_step.txt     "N": the newest COMPLETE checkpoint; written last
    global_step_N/
        ...                         whatever the caller's ``write_state`` wrote: with :func:`save_models`, the
                                    policy backend's model, optimizer and scheduler state
        critic/                     the same for the critic, when the run has one (:func:`save_models`)
        trainer_state.json          {"global_step", "config", "metrics", "extra", "format_version"}
        data_state.json             the prompt loader's state (when given)
        rng_state.pt                python ``random``, numpy and torch (CPU and CUDA) generator states
    .tmp-global_step_N-<pid>/       a checkpoint being written (or left by a crash; never read)

Why it is atomic: a checkpoint is written into a temporary directory, which is renamed to ``global_step_N``
only once complete, and the marker is replaced (write to a temp file, ``os.replace``) only after the rename.
A crash at any point leaves the marker naming the previous complete checkpoint; :func:`find_latest` trusts only
the marker, so a half-written directory is never resumed from. One process writes checkpoints.

Errors::

    ValueError
     └── CheckpointError   a checkpoint to resume from is missing, misnamed or incomplete (the message says which)
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

__all__ = [
    "CRITIC_DIR",
    "MARKER_FILE",
    "CheckpointError",
    "TrainerState",
    "capture_rng_state",
    "cleanup_checkpoints",
    "find_latest",
    "list_checkpoints",
    "load_checkpoint",
    "load_models",
    "resolve_resume_dir",
    "restore_rng_state",
    "save_checkpoint",
    "save_models",
    "step_dir",
]

logger = logging.getLogger(__name__)

MARKER_FILE = "latest_ckpt_global_step.txt"
TRAINER_STATE_FILE = "trainer_state.json"
DATA_STATE_FILE = "data_state.json"
RNG_STATE_FILE = "rng_state.pt"
CRITIC_DIR = "critic"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"global_step_(\d+)")

StateWriter = Callable[[Path], None]
"""``write_state(directory)``: the caller's part of a checkpoint, e.g. ``backend.save``."""


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message names the path and what to do."""


class Stateful(Protocol):
    """A model that writes and restores its own state (``TrainingBackend.save``/``load``)."""

    def save(self, path: Path) -> None:
        """Write the state as the directory ``path`` (replacing it)."""
        ...

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote to ``path``."""
        ...


@dataclass
class TrainerState:
    """What :func:`load_checkpoint` restores besides the caller's own state."""

    global_step: int  # steps completed when the checkpoint was written
    config: dict[str, Any]  # the run's config (``config.to_dict``) at that time
    metrics: dict[str, float] = field(default_factory=dict)  # the metrics of that step
    extra: dict[str, Any] = field(default_factory=dict)  # anything else the trainer stored (JSON-safe)
    loader_state: dict[str, int] | None = None  # the prompt loader's ``state_dict``, if one was saved
    path: Path | None = None  # the directory it was loaded from


def step_dir(ckpt_root: str | Path, global_step: int) -> Path:
    """``{ckpt_root}/global_step_{global_step}``."""
    return Path(ckpt_root) / f"global_step_{global_step}"


# -------------------------------------------------------------------------------------------------- save


def save_checkpoint(
    ckpt_root: str | Path,
    global_step: int,
    *,
    write_state: StateWriter | None = None,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    loader_state: Mapping[str, int] | None = None,
    save_rng: bool = True,
    max_to_keep: int = -1,
) -> Path:
    """Write ``global_step_{global_step}`` atomically, then point the marker at it, then prune old ones.

    Args:
        ckpt_root: the checkpoint root; created if missing.
        global_step: steps completed.
        write_state: writes the caller's state into the (temporary) directory it is given.
        config: the run's config as a dict (stored in ``trainer_state.json``).
        metrics: the step's metrics (numbers, or numpy/torch scalars).
        extra: more JSON-safe trainer state (e.g. the adaptive KL coefficient).
        loader_state: the prompt loader's ``state_dict()``.
        save_rng: store the python/numpy/torch RNG states.
        max_to_keep: keep this many newest checkpoints; -1 keeps all. Leftovers of crashed writers are removed.

    Returns:
        The final checkpoint directory. Re-saving an existing step replaces it.
    """
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, global_step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        if write_state is not None:
            write_state(tmp)
        state = {
            "format_version": FORMAT_VERSION,
            "global_step": global_step,
            "saved_at": time.time(),
            "config": dict(config or {}),
            "metrics": dict(metrics or {}),
            "extra": dict(extra or {}),
        }
        _write_json(tmp / TRAINER_STATE_FILE, state)
        if loader_state is not None:
            _write_json(tmp / DATA_STATE_FILE, dict(loader_state))
        if save_rng:
            torch.save(capture_rng_state(), tmp / RNG_STATE_FILE)
        _replace_dir(tmp, final)
    except BaseException:
        # An exception (even Ctrl-C) leaves no partial directory; a hard crash leaves tmp, which is never read.
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_marker(root, global_step)
    cleanup_checkpoints(root, max_to_keep)
    return final


def save_models(path: Path, policy: Stateful, *, critic: Stateful | None = None) -> None:
    """A ``write_state`` body: the policy's state in ``path`` itself, the critic's (if any) in ``path/critic``.

    The policy goes first because a backend's ``save`` replaces its whole directory; the critic then nests inside.
    """
    policy.save(path)
    if critic is not None:
        critic.save(path / CRITIC_DIR)


def load_models(path: Path, policy: Stateful, *, critic: Stateful | None = None) -> None:
    """A ``read_state`` body restoring what :func:`save_models` wrote.

    Raises:
        CheckpointError: the run has a critic but the checkpoint holds none.
    """
    if critic is not None and not (path / CRITIC_DIR).is_dir():
        raise CheckpointError(
            f"{path} holds no critic ({CRITIC_DIR}/), but this run trains one: it was written by a run without "
            "model.critic_path. Resume with that run's algorithm settings, or start fresh with trainer.resume_mode=none"
        )
    policy.load(path)
    if critic is not None:
        critic.load(path / CRITIC_DIR)


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is moved aside first and deleted after.

    Replacing a directory takes two renames; a crash between them leaves ``dst`` missing, which
    :func:`find_latest` reports instead of resuming from something else.
    """
    if not dst.exists():
        os.replace(src, dst)
        return
    old = dst.with_name(f".old-{dst.name}-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def _write_marker(root: Path, global_step: int) -> None:
    _atomic_write_text(root / MARKER_FILE, f"{global_step}\n")


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=_json_default))


def _json_default(value: object) -> object:
    """numpy/torch scalars in metrics become plain numbers."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old content or the new one, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------- find / resume


def list_checkpoints(ckpt_root: str | Path) -> list[tuple[int, Path]]:
    """Complete ``global_step_N`` directories (``trainer_state.json`` present), oldest first."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match and child.is_dir() and (child / TRAINER_STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def find_latest(ckpt_root: str | Path) -> Path | None:
    """The checkpoint the marker names, or ``None`` when no checkpoint was ever completed.

    Directories the marker does not name (temporary ones, or one renamed just before a crash) are ignored.

    Raises:
        CheckpointError: the marker is unreadable or names a missing or incomplete directory.
    """
    marker = Path(ckpt_root) / MARKER_FILE
    if not marker.is_file():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{marker} should hold a step number, got {text!r}; delete it to start fresh")
    path = step_dir(ckpt_root, int(text))
    if not (path / TRAINER_STATE_FILE).is_file():
        raise CheckpointError(
            f"{marker} names {path}, which is missing or incomplete; resume from an older checkpoint with "
            "trainer.resume_mode=from_path trainer.resume_path=<ckpt_root>/global_step_N, or delete the marker"
        )
    return path


def resolve_resume_dir(
    resume_mode: Literal["none", "latest", "from_path"], ckpt_root: str | Path, resume_path: str | Path | None = None
) -> Path | None:
    """The checkpoint directory to resume from, or ``None`` to start fresh.

    ``none``: never resume. ``latest``: the marker's checkpoint, if any. ``from_path``: ``resume_path``, which
    must be a complete directory named ``global_step_N``.

    Raises:
        CheckpointError: ``from_path`` without a usable path, or a broken marker (``latest``).
    """
    if resume_mode == "none":
        return None
    if resume_mode == "latest":
        latest = find_latest(ckpt_root)
        if latest is None:
            logger.info("no checkpoint in %s; starting from step 0", ckpt_root)
        return latest
    if resume_mode != "from_path":
        raise CheckpointError(f"unknown resume_mode {resume_mode!r}; use none, latest or from_path")
    if resume_path is None:
        raise CheckpointError("resume_mode from_path needs resume_path, a global_step_N checkpoint directory")
    path = Path(resume_path)
    if not _STEP_DIR.fullmatch(path.name):
        raise CheckpointError(f"resume_path {path} must be a checkpoint directory named global_step_N")
    if not (path / TRAINER_STATE_FILE).is_file():
        raise CheckpointError(f"resume_path {path} is missing or incomplete (no {TRAINER_STATE_FILE})")
    return path


def load_checkpoint(
    path: str | Path, *, read_state: StateWriter | None = None, restore_rng: bool = True
) -> TrainerState:
    """Restore a checkpoint directory: the caller's state (``read_state``, e.g. ``backend.load``), the RNGs.

    Returns:
        The trainer state, with the loader state (if saved) for ``PromptLoader.load_state_dict``.

    Raises:
        CheckpointError: ``path`` holds no ``trainer_state.json``.
    """
    path = Path(path)
    state_file = path / TRAINER_STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {TRAINER_STATE_FILE})")
    state = json.loads(state_file.read_text())
    if read_state is not None:
        read_state(path)
    if restore_rng and (path / RNG_STATE_FILE).is_file():
        restore_rng_state(torch.load(path / RNG_STATE_FILE, weights_only=True))
    data_file = path / DATA_STATE_FILE
    return TrainerState(
        global_step=int(state["global_step"]),
        config=state.get("config", {}),
        metrics=state.get("metrics", {}),
        extra=state.get("extra", {}),
        loader_state=json.loads(data_file.read_text()) if data_file.is_file() else None,
        path=path,
    )


# -------------------------------------------------------------------------------------------------- cleanup


def cleanup_checkpoints(ckpt_root: str | Path, max_to_keep: int) -> list[Path]:
    """Delete all but the ``max_to_keep`` newest complete checkpoints, and stale temporary directories.

    The checkpoint the marker names is never deleted, even when newer unmarked ones exist. Returns the removed
    checkpoint directories. ``max_to_keep`` <= 0 keeps every checkpoint.
    """
    root = Path(ckpt_root)
    _remove_stale_temporaries(root)
    if max_to_keep <= 0:
        return []
    try:
        protected = find_latest(root)
    except CheckpointError:
        protected = None  # a broken marker protects nothing, but the cleanup still removes only old ones
    checkpoints = [path for _, path in list_checkpoints(root)]
    removed = []
    for path in checkpoints[: max(0, len(checkpoints) - max_to_keep)]:
        if path == protected:
            continue
        shutil.rmtree(path)
        removed.append(path)
    return removed


def _remove_stale_temporaries(root: Path) -> None:
    """Temporary directories of this process are in use; those of other (dead) writers are leftovers."""
    if not root.is_dir():
        return
    own = f"-{os.getpid()}"
    for child in root.iterdir():
        if child.name.startswith((".tmp-global_step_", ".old-global_step_")) and not child.name.endswith(own):
            shutil.rmtree(child, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------ RNG


def capture_rng_state() -> dict[str, Any]:
    """The python ``random``, numpy global and torch (CPU, and every CUDA device) RNG states, in this process.

    The result holds only tensors, tuples, lists, ints, floats, strings and None, so ``torch.load(...,
    weights_only=True)`` reads it back.
    """
    kind, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (
            kind,
            torch.from_numpy(np.asarray(key, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached_gaussian),
        ),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set the generators captured by :func:`capture_rng_state`.

    CUDA states are restored only when the number of visible devices matches (otherwise a warning is logged).
    """
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, key, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    cuda = list(state.get("cuda", []))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    elif cuda:
        logger.warning("not restoring %d CUDA RNG states: this process sees a different set of devices", len(cuda))
