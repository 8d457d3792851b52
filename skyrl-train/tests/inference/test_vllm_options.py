"""The ``vllm.LLM`` arguments a :class:`VLLMEngineConfig` gives, checked without starting vLLM."""

from __future__ import annotations

import pytest

from skyrl_train.config import load_config
from skyrl_train.inference.vllm_engine import TENSOR_PARALLEL_BACKEND, VLLMEngineConfig, llm_kwargs
from skyrl_train.wiring import engine_settings


def test_scheduler_options_are_passed_when_set() -> None:
    config = VLLMEngineConfig(max_num_seqs=8, max_num_batched_tokens=512, enable_prefix_caching=False)
    kwargs = llm_kwargs("m", config, on_cpu=False)
    assert (kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"], kwargs["enable_prefix_caching"]) == (
        8,
        512,
        False,
    )
    assert kwargs["model"] == "m"
    assert kwargs["logprobs_mode"] == "processed_logprobs"


def test_unset_options_leave_vllm_its_defaults() -> None:
    kwargs = llm_kwargs("m", VLLMEngineConfig(), on_cpu=True)
    assert not {"max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching"} & set(kwargs)
    assert kwargs["enforce_eager"] is True  # the CPU default
    assert kwargs["gpu_memory_utilization"] == 0.3
    gpu = llm_kwargs("m", VLLMEngineConfig(kv_cache_memory_bytes=2**20, engine_kwargs={"seed": 9}), on_cpu=False)
    assert "gpu_memory_utilization" not in gpu
    assert gpu["kv_cache_memory_bytes"] == 2**20
    assert gpu["seed"] == 9  # engine_kwargs go to vllm.LLM as they are, last


def test_tensor_parallelism_runs_on_vllms_multiprocessing_executor() -> None:
    kwargs = llm_kwargs("m", VLLMEngineConfig(tensor_parallel_size=4), on_cpu=False)
    assert kwargs["tensor_parallel_size"] == 4
    assert kwargs["distributed_executor_backend"] == TENSOR_PARALLEL_BACKEND == "mp"  # never Ray's, in an actor
    single = llm_kwargs("m", VLLMEngineConfig(), on_cpu=False)
    assert single["tensor_parallel_size"] == 1
    assert "distributed_executor_backend" not in single  # one GPU: vLLM's own choice (its in-process executor)
    chosen = VLLMEngineConfig(tensor_parallel_size=2, engine_kwargs={"distributed_executor_backend": "ray"})
    assert llm_kwargs("m", chosen, on_cpu=False)["distributed_executor_backend"] == "ray"  # engine_kwargs win


def test_tensor_parallel_engines_refuse_what_cannot_reach_every_rank() -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel_size must be >= 1, got 0"):
        VLLMEngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match=r"cuda_ipc.*tensor_parallel_size=2 .* use weight_transport='file'"):
        VLLMEngineConfig(tensor_parallel_size=2, weight_transport="cuda_ipc")
    VLLMEngineConfig(tensor_parallel_size=2, weight_transport="file")


def test_the_run_configs_tensor_parallel_size_reaches_vllm() -> None:
    keys = ["inference.engine=vllm", "inference.tensor_parallel_size=2", "inference.num_gpus_per_engine=2"]
    config = load_config(None, [*keys, "inference.num_engines=3", "inference.gpu_memory_utilization=0.6"])
    settings = engine_settings(config)
    assert (settings.replicas, settings.gpus_per_replica) == (3, 2.0)  # what Ray reserves for each engine actor
    # The engine actors have GPUs even where the driver has none: the memory share goes to them.
    assert settings.options["gpu_memory_utilization"] == 0.6
    kwargs = llm_kwargs("m", VLLMEngineConfig(**settings.options), on_cpu=False)
    assert (kwargs["tensor_parallel_size"], kwargs["distributed_executor_backend"]) == (2, "mp")
    assert kwargs["gpu_memory_utilization"] == 0.6


def test_sleep_mode_is_asked_of_vllm_on_a_gpu_only() -> None:
    assert llm_kwargs("m", VLLMEngineConfig(sleep_mode=True), on_cpu=False)["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in llm_kwargs("m", VLLMEngineConfig(sleep_mode=True), on_cpu=True)  # no CPU pool
    assert "enable_sleep_mode" not in llm_kwargs("m", VLLMEngineConfig(), on_cpu=False)


def test_colocated_runs_build_their_vllm_engines_to_sleep() -> None:
    keys = ["inference.engine=vllm", "inference.num_engines=2", "trainer.backend=fsdp"]
    colocated = engine_settings(load_config(None, [*keys, "trainer.placement=colocate"]))
    assert colocated.options["sleep_mode"] is True
    assert "sleep_mode" not in engine_settings(load_config(None, [*keys, "trainer.placement=disaggregate"])).options


def test_a_core_in_its_own_process_sends_its_schedulers_figures() -> None:
    # Log stats on: only then does the core's process send running, waiting and KV-cache use (the engine's load).
    assert llm_kwargs("m", VLLMEngineConfig(), on_cpu=False, multiprocessing=True)["disable_log_stats"] is False
    assert "disable_log_stats" not in llm_kwargs("m", VLLMEngineConfig(), on_cpu=True)  # in process: read directly
