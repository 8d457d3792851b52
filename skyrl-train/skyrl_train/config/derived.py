"""Derived values: :func:`resolve` is the one function that computes a field from others.

A field whose comment says "derived" stays unset (``None``; ``auto`` for ``trainer.device``) until
:func:`resolve` fills it; a value set in the YAML or on the command line is kept. What each becomes:

- ``model.ref_path`` ← ``model.path``
- ``generator.max_input_length`` ← ``data.max_prompt_length`` + ``(max_turns − 1) · max_generate_length``
- ``generator.eval_max_generate_length`` ← ``generator.max_generate_length``
- ``algorithm.max_seq_len`` ← ``generator.max_response_length`` when set, else the longest possible response
- ``trainer.run_name`` ← the last component of ``trainer.run_dir``
- ``trainer.ckpt_path`` ← ``{run_dir}/checkpoints``; ``trainer.export_path`` ← ``{run_dir}/exports``
- ``off_policy.tis_ratio_type`` ← ``token`` when ``trainer.async_mode`` is not ``sync`` and none is chosen
- ``trainer.max_inflight_groups`` ← ``trainer.train_batch_size``
- ``trainer.device`` ``auto`` ← ``cuda`` when this process sees a GPU or fsdp ranks ask Ray for GPUs, else ``cpu``
- ``trainer.num_gpus_per_worker`` ← 1 on ``cuda`` with ``trainer.backend=fsdp``, else 0

``~`` at the start of a path (data files, models, run, checkpoint, export and resume directories) is expanded too.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from skyrl_train.algorithms.off_policy import OffPolicyCorrectionConfig
from skyrl_train.config.schema import Config, TrainerConfig
from skyrl_train.devices import resolve_device

__all__ = ["resolve"]


def resolve(config: Config) -> Config:
    """Fill every derived field (see the module docstring) and expand ``~`` in paths; idempotent.

    This is the only function that computes one field from another. Fields already set are kept.
    """
    data, model, gen, alg, trainer = config.data, config.model, config.generator, config.algorithm, config.trainer
    max_input = gen.max_input_length
    if max_input is None:
        # Later turns see the earlier responses in their context; observations need more (set it explicitly).
        max_input = data.max_prompt_length + (gen.max_turns - 1) * gen.max_generate_length
    max_seq_len = alg.max_seq_len
    if max_seq_len is None and gen.max_response_length is not None:
        max_seq_len = gen.max_response_length
    elif max_seq_len is None:
        max_seq_len = max_input - data.max_prompt_length + gen.max_generate_length
    run_dir = _expand(trainer.run_dir)
    return dataclasses.replace(
        config,
        data=dataclasses.replace(
            data, train_data=[_expand(p) for p in data.train_data], val_data=[_expand(p) for p in data.val_data]
        ),
        model=dataclasses.replace(
            model,
            path=_expand(model.path),
            ref_path=_expand(model.ref_path or model.path),
            critic_path=_expand(model.critic_path) if model.critic_path else None,
        ),
        generator=dataclasses.replace(
            gen,
            max_input_length=max_input,
            eval_max_generate_length=_default(gen.eval_max_generate_length, gen.max_generate_length),
        ),
        algorithm=dataclasses.replace(alg, max_seq_len=max_seq_len),
        off_policy=_async_correction(config),
        trainer=dataclasses.replace(
            trainer,
            run_dir=run_dir,
            run_name=trainer.run_name or Path(run_dir).name,
            ckpt_path=_expand(trainer.ckpt_path or os.path.join(run_dir, "checkpoints")),
            export_path=_expand(trainer.export_path or os.path.join(run_dir, "exports")),
            resume_path=_expand(trainer.resume_path) if trainer.resume_path else None,
            max_inflight_groups=_default(trainer.max_inflight_groups, trainer.train_batch_size),
            **_placed_on(trainer),
        ),
    )


def _placed_on(trainer: TrainerConfig) -> dict[str, Any]:
    """``trainer.device`` and ``trainer.num_gpus_per_worker``, derived together (see their comments)."""
    reserved = trainer.backend == "fsdp" and (trainer.num_gpus_per_worker or 0) > 0
    device = resolve_device(trainer.device, gpus_reserved=reserved)
    gpus = trainer.num_gpus_per_worker
    if gpus is None:
        gpus = 1.0 if trainer.backend == "fsdp" and device == "cuda" else 0.0
    return {"device": device, "num_gpus_per_worker": gpus}


def _default(value: int | None, derived: int) -> int:
    return derived if value is None else value


def _expand(path: str) -> str:
    return os.path.expanduser(path) if path.startswith("~") else path


def _async_correction(config: Config) -> OffPolicyCorrectionConfig:
    """The async modes train on samples of an older policy: token-level TIS unless another correction is chosen."""
    if config.trainer.async_mode == "sync" or config.off_policy.tis_ratio_type is not None:
        return config.off_policy
    return dataclasses.replace(config.off_policy, tis_ratio_type="token")
