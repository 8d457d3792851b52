"""Chunked log-probs and entropy: equal to the full-logit computation, in a fraction of its memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.algorithms.entropy import entropy_from_logits
from skyrl_train.backends.config import BackendConfig
from skyrl_train.backends.token_stats import supports_chunked_head, token_stats
from skyrl_train.backends.torch_backend import TorchBackend, token_log_probs


def _inputs(k: int = 37, h: int = 16, v: int = 101, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(k, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    bias = torch.randn(v, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (k,), generator=g)
    return hidden, weight, bias, targets


def _full(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor, t: float) -> Any:
    logits = (hidden @ weight.T + bias).float() / t
    return token_log_probs(logits, targets), entropy_from_logits(logits)


@pytest.mark.parametrize("chunk", [1, 5, 37, 64, 0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_full_computation(chunk: int, temperature: float) -> None:
    hidden, weight, bias, targets = _inputs()
    stats = token_stats(hidden, weight, bias, targets, temperature=temperature, with_entropy=True, chunk_size=chunk)
    log_probs, entropy = _full(hidden, weight, bias, targets, temperature)
    torch.testing.assert_close(stats[:, 0], log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats[:, 1], entropy, rtol=1e-5, atol=1e-5)
    # any upstream gradient: a weighted sum of both outputs
    g = torch.Generator().manual_seed(1)
    up = torch.randn(stats.shape, generator=g)
    chunked = torch.autograd.grad((stats * up).sum(), (hidden, weight, bias))
    full = torch.autograd.grad((log_probs * up[:, 0] + entropy * up[:, 1]).sum(), (hidden, weight, bias))
    for a, b in zip(chunked, full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_log_probs_alone_and_empty_input() -> None:
    hidden, weight, bias, targets = _inputs()
    assert token_stats(hidden, weight, bias, targets, chunk_size=8).shape == (37, 1)
    empty = token_stats(hidden[:0], weight, bias, targets[:0], with_entropy=True, chunk_size=8)
    assert empty.shape == (0, 2)
    assert empty.dtype == torch.float32


def _saved_bytes(chunk: int) -> int:
    """Bytes autograd keeps for backward (what stays alive between forward and backward)."""
    hidden, weight, bias, targets = _inputs(k=512, h=32, v=4096)
    storages: dict[int, int] = {}  # a tensor saved by several chunks (the weight) is held once

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_stats(hidden, weight, bias, targets, with_entropy=True, chunk_size=chunk)
    return sum(storages.values())


def test_chunks_keep_no_vocabulary_sized_tensor_for_backward() -> None:
    logits_bytes = 512 * 4096 * 4
    assert _saved_bytes(0) >= logits_bytes  # the full computation keeps at least its float32 logits
    assert _saved_bytes(64) < logits_bytes / 8  # chunks keep their inputs, not their logits


_PEAK = textwrap.dedent(
    """
    import sys, torch
    from skyrl_train.backends.token_stats import token_stats
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2048, 64, generator=g, requires_grad=True)
    w = torch.randn(8192, 64, generator=g, requires_grad=True)
    t = torch.randint(0, 8192, (2048,), generator=g)
    chunk = int(sys.argv[1])
    token_stats(h[:8], w, None, t[:8], with_entropy=True, chunk_size=chunk).sum().backward()  # warm up
    h.grad = w.grad = None

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])  # KiB

    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset the peak resident size (VmHWM) to the current one
    base = status("VmRSS")
    token_stats(h, w, None, t, with_entropy=True, chunk_size=chunk).sum().backward()
    print(status("VmHWM") - base)
    """
)


def _peak_kib(chunk: int) -> int:
    # Large blocks straight from mmap, so freed memory leaves the process and the peak RSS is the peak in use.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PEAK, str(chunk)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_memory_of_a_step_is_below_the_full_computation() -> None:
    full, chunked = _peak_kib(0), _peak_kib(256)
    logits_kib = 2048 * 8192 * 4 // 1024
    assert full >= logits_kib  # 64 MiB of float32 logits at least
    assert chunked < full / 3, (full, chunked)


def _backend(model_dir: Path, chunk: int) -> TorchBackend:
    return TorchBackend(BackendConfig(model_path=str(model_dir), micro_train_batch_size=2, logprob_chunk_size=chunk))


def test_backend_chunked_and_full_paths_agree(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> None:
    batch = make_batch([3, 5, 2], [6, 4, 7])
    chunked, full = _backend(small_model_dir, 5), _backend(small_model_dir, 0)
    assert chunked._chunked
    assert not full._chunked
    a = chunked.forward(batch, temperature=0.8, with_entropy=True)
    b = full.forward(batch, temperature=0.8, with_entropy=True)
    torch.testing.assert_close(a.log_probs, b.log_probs, rtol=1e-5, atol=1e-5)
    assert a.entropy is not None
    assert b.entropy is not None
    torch.testing.assert_close(a.entropy, b.entropy, rtol=1e-5, atol=1e-5)
    chunked.forward_backward(batch, sft_loss)
    full.forward_backward(batch, sft_loss)
    for (name, p), q in zip(chunked.model.named_parameters(), full.model.parameters(), strict=True):
        assert p.grad is not None, name
        assert q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_head_is_restored_after_the_call(small_model_dir: Path, make_batch: Any) -> None:
    b = _backend(small_model_dir, 5)
    b.forward(make_batch([3], [4]))
    head = b.model.get_output_embeddings()
    assert "forward" not in vars(head)  # the class's forward again
    assert head(torch.zeros(1, head.in_features)).shape == (1, head.out_features)


def test_models_with_transformed_logits_keep_the_full_path(small_model_dir: Path) -> None:
    b = _backend(small_model_dir, 5)
    assert supports_chunked_head(b.model)
    b.model.config.final_logit_softcapping = 30.0
    assert not supports_chunked_head(b.model)
