"""The ``vllm.LLM`` arguments a :class:`VLLMEngineConfig` gives, checked without starting vLLM."""

from __future__ import annotations

from skyrl_train.inference.vllm_engine import VLLMEngineConfig, llm_kwargs


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
