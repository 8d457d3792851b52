"""Build an inference engine by kind; each engine module (and vLLM, aiohttp, transformers) is imported lazily."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from skyrl_train.compute_thread import ComputeThread
from skyrl_train.inference.base import InferenceEngine

EngineKind = Literal["local", "vllm", "remote"]


def create_engine(
    kind: EngineKind, model_path: str | Path | None = None, *, compute: ComputeThread | None = None, **options: Any
) -> InferenceEngine:
    """An engine of ``kind`` serving ``model_path``; ``options`` are fields of that engine's config class.

    - ``"local"``: :class:`~skyrl_train.inference.local.LocalEngine` on the Hugging Face directory
      ``model_path``; options of :class:`~skyrl_train.inference.local.LocalEngineConfig` (``device``, …);
      ``compute``: the :class:`~skyrl_train.compute_thread.ComputeThread` to generate on (local engine only).
    - ``"vllm"``: :class:`~skyrl_train.inference.vllm_engine.VLLMEngine`; options of
      :class:`~skyrl_train.inference.vllm_engine.VLLMEngineConfig`. Start-up continues in the background;
      ``await engine.wait_ready()`` or the first ``generate`` waits for it.
    - ``"remote"``: :class:`~skyrl_train.inference.remote.RemoteEngine`; needs ``base_url=...``;
      ``model_path``, when given, is the served model name; other options of
      :class:`~skyrl_train.inference.remote.RemoteEngineConfig`.

    Raises ``ValueError`` for an unknown kind, a missing argument or ``compute`` for another kind than ``"local"``,
    and ``TypeError`` for an unknown option.
    """
    if kind == "local":
        from skyrl_train.inference.local import LocalEngine, LocalEngineConfig

        _check_options(LocalEngineConfig, options)
        return LocalEngine.from_pretrained(_required_path(kind, model_path), compute=compute, **options)
    if compute is not None:
        raise ValueError(f"compute= is for the local engine, not {kind!r}: it runs its model elsewhere")
    if kind == "vllm":
        from skyrl_train.inference.vllm_engine import VLLMEngine, VLLMEngineConfig

        _check_options(VLLMEngineConfig, options)
        return VLLMEngine(_required_path(kind, model_path), VLLMEngineConfig(**options))
    if kind == "remote":
        from skyrl_train.inference.remote import RemoteEngine, RemoteEngineConfig

        base_url = options.pop("base_url", None)
        if not base_url:
            raise ValueError("create_engine('remote', ...) needs base_url='http://host:port'")
        if model_path is not None:
            options.setdefault("model", str(model_path))
        _check_options(RemoteEngineConfig, options)
        return RemoteEngine(str(base_url), RemoteEngineConfig(**options))
    raise ValueError(f"unknown engine kind {kind!r}; expected 'local', 'vllm' or 'remote'")


def _required_path(kind: str, model_path: str | Path | None) -> Path:
    if model_path is None:
        raise ValueError(f"create_engine({kind!r}, ...) needs a model_path")
    return Path(model_path)


def _check_options(config_class: type[Any], options: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for {config_class.__name__}; known: {sorted(known)}")
