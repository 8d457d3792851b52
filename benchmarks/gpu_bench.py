"""FSDP2 training step, weight extraction and local-engine decoding of a Qwen2-0.5B-shaped model on one GPU.

    PYTHONPATH=skyrl-train python benchmarks/gpu_bench.py --output "$OUT/gpu_bench.json"   # lent GPU, ≤ 8 min
    .venv/bin/python benchmarks/gpu_bench.py --small --output /tmp/gpu_bench.json          # CPU smoke, seconds

Needs torch, transformers and ``skyrl_train`` only: no Ray, no vLLM, nothing downloaded (a lent GPU machine has
PyTorch with CUDA and transformers, and the project's packages on ``PYTHONPATH``).

Model: Qwen2-0.5B's shape (hidden 896, 24 layers, 14 query / 2 key-value heads, MLP 4,864, vocabulary 151,936,
tied embeddings; ≈494 M parameters), randomly initialised from ``--seed`` with transformers' ``Qwen2Config`` and
saved to a temporary directory, in bf16. ``--small``: a 2-layer, 64-wide model of the same architecture in fp32 on
the CPU, with gloo, and small batches, so that a test runs the whole script in seconds.

Rows (candidate and baseline in this process, alternating call by call, so drift hits both):

- Training step: ``skyrl_train.backends.fsdp.FSDPWorker`` (``fully_shard`` per decoder layer and at the root, in a
  ``torch.distributed`` group of world size 1 over NCCL: one process, one GPU) against the in-process
  ``TorchBackend`` on the same GPU. One step is ``forward_backward`` over ``--rows`` rows × ``--seq-len`` random
  tokens (the last ``seq_len − 32`` positions are the response the loss sees; cross-entropy), in micro-batches of
  ``--micro-batch`` rows, then ``optim_step`` (AdamW on the bf16 parameters, gradient clipping); CUDA is
  synchronised at both ends. Tokens/s counts every position of every row. MFU = 6 × parameters × tokens / step
  seconds / ``--peak-tflops`` (default 989: H200 dense bf16); it leaves out attention's own FLOPs (about +9 % at
  1,024 tokens) and counts the output head on prompt positions too (3 % of the rows' positions).
- Weight extraction: full tensors on the CPU, as a weight sync into another process needs them:
  ``FSDPWorker.gathered_weights()`` against ``TorchBackend.get_weights()`` copied to the CPU.
- Weight load: those CPU tensors into the local engine (``sync_weights``: pause, load, resume).
- Colocated hand-over (``skyrl_train.handover``): the in-process backend's AdamW moments to host memory and back
  (``offload_optimizer`` / ``reload_optimizer``), and the local engine's model to host memory and back
  (``sleep`` / ``wake_up``), with seconds and the device memory allocated before, between and after.
- Decoding: ``LocalEngine.generate`` of ``--prompts`` random prompts × ``--prompt-len`` tokens, ``--new-tokens``
  tokens each at temperature 1 (the random model never samples an end token: it has none) against transformers'
  ``model.generate`` of the same batch (sampling, no top-k / top-p, exactly ``--new-tokens`` tokens).

Budget: the whole run stops within ``--budget-s`` (default 420 s, so the command, its interpreter start and the
model build stay under 8 minutes): the timed loops stop early when the next round would not leave room for the
phases after them (noted in ``budget.stopped_early``), later phases are skipped with a note when no time is left,
the JSON is rewritten after every phase, and a watchdog dumps the stacks and exits 3 at ``budget + 60`` seconds.

Output: the table on stdout and ``--output`` (default ``benchmarks/results/gpu_bench.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import faulthandler
import functools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "benchmarks") not in sys.path:  # _plain_loop beside this file, also when run through runpy
    sys.path.insert(0, str(REPO / "benchmarks"))
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "gpu_bench.json"
PROMPT_TOKENS = 32  # leading positions of each training row outside the loss (the "prompt")

QWEN2_05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
QWEN2_15B = {
    **QWEN2_05B,
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "intermediate_size": 8960,
}
SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
TINY = {  # the project's tiny test model (skyrl_train.models.tiny): the CPU comparison's shape
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1024,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
SHAPES = {"0.5b": QWEN2_05B, "1.5b": QWEN2_15B, "small": SMALL, "tiny": TINY}
# Micro-batch sizes timed for each shape (the 1.5B shape's plain loop keeps full logits: 16 rows would not fit).
MICRO_BATCHES = {"0.5b": (4, 16), "1.5b": (4, 8), "small": (2,), "tiny": (4,)}
SIDES = ("plain", "torch", "torch_mixed", "fsdp2")  # see the module docstring


@dataclass(frozen=True)
class Workload:
    """What one run measures; ``--small`` and the full run differ only in these values."""

    shapes: tuple[str, ...]  # keys of SHAPES: the training phase runs each; the later phases use the first
    device: str  # "cuda" or "cpu"
    dtype: str  # "bfloat16" or "float32"
    dist_backend: str  # "nccl" or "gloo"
    rows: int = 32  # training rows per step
    seq_len: int = 1024  # tokens per training row
    micro_batch: int = 0  # rows per forward/backward micro-batch; 0: each shape's MICRO_BATCHES
    warmup: int = 2  # untimed rounds first (each loop)
    steps: int = 10  # timed training rounds at most (each round: one step of each backend)
    repeats: int = 3  # timed extraction and decoding rounds at most
    prompts: int = 64  # decoding batch
    prompt_len: int = 128  # tokens per decoding prompt
    new_tokens: int = 256  # tokens generated per prompt
    peak_tflops: float = 989.0  # dense bf16 peak of the GPU (H200), the MFU denominator
    budget_s: float = 420.0  # the whole run, model build included
    seed: int = 0
    sides: tuple[str, ...] = SIDES  # which of SIDES the training phase times


def workload_of(args: argparse.Namespace) -> Workload:
    if args.small:
        base = Workload(("small",), "cpu", "float32", "gloo", rows=4, seq_len=48, warmup=1, steps=2)
        base = Workload(**{**asdict(base), "repeats": 1, "prompts": 4, "prompt_len": 8, "new_tokens": 8})
    else:
        base = Workload(("0.5b", "1.5b"), "cuda", "bfloat16", "nccl")
    given = {k: v for k, v in vars(args).items() if k in Workload.__dataclass_fields__ and v is not None}
    if "shapes" in given:
        given["shapes"] = tuple(given["shapes"].split(","))
    return Workload(**{**asdict(base), **given})


def micro_batches(work: Workload, shape: str) -> tuple[int, ...]:
    return (work.micro_batch,) if work.micro_batch > 0 else MICRO_BATCHES[shape]


# --- the clock ----------------------------------------------------------------------------------------------------


@dataclass
class Budget:
    """Seconds left of the run's budget, and the notes of what it cut short."""

    seconds: float
    started: float = field(default_factory=time.perf_counter)
    stopped_early: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.started)

    def allows(self, round_s: float, reserve_s: float) -> bool:
        """Whether one more round of ``round_s`` seconds still leaves ``reserve_s`` for the phases after it."""
        return self.left() - reserve_s > 1.5 * round_s


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    """Seconds of ``fn()`` with the device synchronised before and after, and what it returned."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - start, out


def alternate(
    calls: dict[str, Callable[[], float]], warmup: int, rounds: int, budget: Budget, reserve_s: float, what: str
) -> dict[str, list[float]]:
    """Timed rounds of every call (the order alternating per round), as many as ``budget`` allows, at most ``rounds``.

    Each call returns its own measured seconds. Warm-up rounds are run but not kept.
    """
    names = list(calls)
    kept: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + rounds):
        started = time.perf_counter()
        for name in names if index % 2 == 0 else names[::-1]:
            seconds = calls[name]()
            if index >= warmup:
                kept[name].append(seconds)
        last = time.perf_counter() - started
        if index + 1 < warmup + rounds and not budget.allows(last, reserve_s):
            budget.stopped_early.append(f"{what}: {max(index + 1 - warmup, 0)} of {rounds} timed rounds")
            break
    return kept


# --- model and process group --------------------------------------------------------------------------------------


def build_model(work: Workload, shape: str, path: Path) -> tuple[Path, int]:
    """The randomly initialised ``shape`` model saved under ``path`` (safetensors, ``work.dtype``); its parameters."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(work.seed)
    with torch.device(work.device):  # initialising on the GPU is much faster than on its host's CPU
        model = Qwen2ForCausalLM(config).to(getattr(torch, work.dtype))
    model.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def init_process_group(work: Workload) -> None:
    """A ``torch.distributed`` group of world size 1 (one process: this one) for the FSDP2 worker."""
    import torch
    import torch.distributed as dist

    if work.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(work.device).index or 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group(work.dist_backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


# --- phases -------------------------------------------------------------------------------------------------------


def training_batch(work: Workload, vocab: int) -> Any:
    import torch

    from skyrl_train.backends import TrainingBatch

    generator = torch.Generator().manual_seed(work.seed)
    input_ids = torch.randint(0, vocab, (work.rows, work.seq_len), generator=generator)
    response = work.seq_len - PROMPT_TOKENS
    return TrainingBatch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        response_mask=torch.ones(work.rows, response),
    )


def cross_entropy(output: Any, micro: Any) -> tuple[Any, dict[str, float]]:
    """The SFT loss through the RL loss signature (``old_log_probs`` and ``advantages`` are ignored by it)."""
    from skyrl_train.algorithms import PolicyLossConfig, get_policy_loss

    ignored = output.log_probs.detach()
    return get_policy_loss("cross_entropy")(output.log_probs, ignored, ignored, micro.response_mask, PolicyLossConfig())


def backend_config(work: Workload, model: Path, micro_batch: int, *, mixed: bool = False) -> Any:
    """Settings of the framework's sides; ``mixed``: float32 master weights, bfloat16 matmuls (the stated policy)."""
    from skyrl_train.backends import BackendConfig, OptimizerConfig

    return BackendConfig(
        model_path=str(model),
        device=work.device,
        dtype="float32" if mixed else work.dtype,  # type: ignore[arg-type]
        compute_dtype="bfloat16" if mixed else "auto",
        micro_train_batch_size=micro_batch,
        micro_forward_batch_size=micro_batch,
        remove_padding=False,  # every row is full length: nothing to pack
        gradient_checkpointing=False,
        seed=work.seed,
        optimizer=OptimizerConfig(lr=1e-6, scheduler="constant"),
    )


def build_side(work: Workload, side: str, model: Path, micro_batch: int) -> Any:
    """One side of the training comparison (see the module docstring), on ``work.device``."""
    from _plain_loop import PlainLoop

    from skyrl_train.backends import TorchBackend
    from skyrl_train.backends.fsdp import FSDPWorker

    if side == "plain":
        return PlainLoop(model, device=work.device, dtype=work.dtype, micro_batch=micro_batch)
    if side == "torch_mixed":
        return TorchBackend(backend_config(work, model, micro_batch, mixed=True))
    if side == "fsdp2":
        return FSDPWorker(backend_config(work, model, micro_batch))
    return TorchBackend(backend_config(work, model, micro_batch))


def backends(work: Workload, model: Path) -> dict[str, Any]:
    """The FSDP2 worker and the in-process backend on the same device, same settings (weights and hand-over)."""
    micro = micro_batches(work, work.shapes[0])[0]
    return {side: build_side(work, side, model, micro) for side in ("fsdp2", "torch")}


def step_call(side: Any, batch: Any, response_length: int) -> Callable[[], Any]:
    """One optimizer step of a side over ``batch``."""
    from _plain_loop import PlainLoop

    if isinstance(side, PlainLoop):
        return lambda: side.step(batch.input_ids, response_length)
    return lambda: (side.forward_backward(batch, cross_entropy), side.optim_step())


def measure_hand_over(work: Workload, model: Path, result: dict[str, Any], budget: Budget) -> Any:
    """Weight extraction and the optimizer's offload (into ``result``); returns the extracted CPU weights."""
    seconds, models = timed(lambda: backends(work, model), work.device)
    result["setup_s"] = seconds
    result["weights"], weights = measure_extraction(work, models, budget)
    result["offload"] = measure_offload(work, models["torch"])
    del models
    _free(work)
    return weights


def measure_training(
    work: Workload, shape: str, model: Path, params: int, budget: Budget, later_shapes: int = 0
) -> dict[str, Any]:
    """Each side's step at each micro-batch size of ``shape``, side by side; peak memory per side.

    ``later_shapes`` are still to be measured after this one: the budget keeps room for them.
    """
    import torch

    vocab = int(SHAPES[shape]["vocab_size"])
    batch = training_batch(work, vocab)
    response = work.seq_len - PROMPT_TOKENS
    tokens = work.rows * work.seq_len
    out: dict[str, Any] = {"tokens_per_step": tokens, "parameters": params, "micro_batches": {}}
    for micro in micro_batches(work, shape):
        sides, calls, errors = {}, {}, {}
        for name in work.sides:
            try:
                sides[name] = build_side(work, name, model, micro)
            except torch.cuda.OutOfMemoryError as exc:
                errors[name] = f"out of memory building it: {str(exc)[:200]}"
                continue
            calls[name] = _peak_tracked(step_call(sides[name], batch, response), work.device, name, errors)
        reserve = (0.25 + 0.3 * later_shapes) * work.budget_s  # other shapes, extraction and decoding after
        steps = alternate(calls, work.warmup, work.steps, budget, reserve, f"training {shape} mb{micro}")
        out["micro_batches"][str(micro)] = _step_stats(work, steps, tokens, params, errors)
        del sides, calls
        _free(work)
    return out


def _peak_tracked(call: Callable[[], Any], device: str, name: str, errors: dict[str, str]) -> Callable[[], float]:
    """``call`` timed; its device memory peak goes to ``_PEAKS[name]``, an out-of-memory error to ``errors[name]``."""
    import torch

    def run() -> float:
        if name in errors:
            return float("nan")
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        try:
            seconds, _ = timed(call, device)
        except torch.cuda.OutOfMemoryError as exc:
            errors[name] = f"out of memory in a step: {str(exc)[:200]}"
            return float("nan")
        if device.startswith("cuda"):
            _PEAKS[name] = max(_PEAKS.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**30)
        return float(seconds)

    return run


_PEAKS: dict[str, float] = {}  # GiB, per side, of the micro-batch size being measured


def _step_stats(
    work: Workload, steps: dict[str, list[float]], tokens: int, params: int, errors: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in work.sides:
        seconds = [s for s in steps.get(name, []) if s == s]  # NaN: the side failed
        median = statistics.median(seconds) if seconds else None
        out[name] = {
            "step_s": seconds,
            "median_step_s": median,
            "tokens_per_s": tokens / median if median else None,
            "mfu": 6 * params * tokens / median / (work.peak_tflops * 1e12) if median else None,
            "peak_memory_gib": _PEAKS.pop(name, None),
            "error": errors.get(name),
        }
    return out


def _free(work: Workload) -> None:
    import gc

    import torch

    gc.collect()
    if work.device.startswith("cuda"):
        torch.cuda.empty_cache()


def measure_extraction(work: Workload, models: dict[str, Any], budget: Budget) -> tuple[dict[str, Any], Any]:
    """Seconds to get full CPU tensors from each backend; returns them too (the engine loads them next)."""
    latest: dict[str, Any] = {}

    def fsdp2() -> float:
        seconds, latest["weights"] = timed(models["fsdp2"].gathered_weights, work.device)
        return float(seconds)

    def torch_backend() -> float:
        copy = lambda: [(n, t.to("cpu", copy=True)) for n, t in models["torch"].get_weights()]  # noqa: E731
        return float(timed(copy, work.device)[0])

    calls = {"fsdp2": fsdp2, "torch": torch_backend}
    seconds = alternate(calls, 1, work.repeats, budget, 0.2 * work.budget_s, "weight extraction")
    nbytes = sum(t.numel() * t.element_size() for _, t in latest["weights"])
    out: dict[str, Any] = {"bytes": nbytes, "tensors": len(latest["weights"])}
    for name, values in seconds.items():
        median = statistics.median(values) if values else None
        out[name] = {"s": values, "median_s": median, "gb_per_s": nbytes / median / 1e9 if median else None}
    return out, latest["weights"]


def memory_gb(device: str) -> float | None:
    """Device memory allocated by this process, in GB (None on CPU)."""
    import torch

    return round(torch.cuda.memory_allocated() / 1e9, 3) if device.startswith("cuda") else None


def measure_offload(work: Workload, backend: Any) -> dict[str, Any]:
    """A colocated trainer's hand-over: its AdamW moments to host memory and back (seconds, memory freed)."""
    state = [t for s in backend.optimizer.state.values() for t in s.values() if t.dim() > 0]
    nbytes = sum(t.numel() * t.element_size() for t in state)
    out: dict[str, Any] = {"allocated_gb": memory_gb(work.device), "bytes": nbytes}
    for round_ in range(2):  # the first offload allocates the pinned host buffers; the second reuses them
        suffix = "" if round_ else "_first"
        out[f"offload{suffix}_s"], _ = timed(backend.offload_optimizer, work.device)
        out["offloaded_allocated_gb"] = memory_gb(work.device)
        out[f"reload{suffix}_s"], _ = timed(backend.reload_optimizer, work.device)
        out["reloaded_allocated_gb"] = memory_gb(work.device)
    moved = work.device.startswith("cuda")  # on a CPU the moments stay where they are: no rate to report
    out["offload_gb_per_s"] = nbytes / out["offload_s"] / 1e9 if moved else None
    out["reload_gb_per_s"] = nbytes / out["reload_s"] / 1e9 if moved else None
    return out


async def measure_sleep(work: Workload, engine: Any) -> dict[str, Any]:
    """A colocated engine's hand-over: the local engine's model to host memory and back."""
    out: dict[str, Any] = {"allocated_gb": memory_gb(work.device)}
    start = time.perf_counter()
    await engine.sleep()
    out["sleep_s"], out["asleep_allocated_gb"] = time.perf_counter() - start, memory_gb(work.device)
    start = time.perf_counter()
    await engine.wake_up()
    out["wake_up_s"], out["awake_allocated_gb"] = time.perf_counter() - start, memory_gb(work.device)
    return out


def measure_decoding(work: Workload, model: Path, weights: Any, budget: Budget) -> dict[str, Any]:
    """Weight load into the local engine, then the engine's decoding against transformers' ``generate``."""
    import torch
    from transformers import AutoModelForCausalLM

    from skyrl_train.inference.base import SamplingParams
    from skyrl_train.inference.local import LocalEngine
    from skyrl_train.inference.weight_sync import sync_weights

    engine = LocalEngine.from_pretrained(
        model, device=work.device, dtype=work.dtype, max_batch_size=work.prompts, seed=work.seed, return_text=False
    )
    # Any: transformers' stubs type `generate`'s keyword arguments more narrowly than it accepts them.
    reference: Any = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, work.dtype))
    reference.to(work.device).eval()
    generator = torch.Generator().manual_seed(work.seed + 1)
    vocab = int(SHAPES[work.shapes[0]]["vocab_size"])
    prompts = torch.randint(1, vocab, (work.prompts, work.prompt_len), generator=generator)
    loop = asyncio.new_event_loop()
    out: dict[str, Any] = {"tokens_per_call": work.prompts * work.new_tokens}
    try:
        out["engine_load_s"] = loop.run_until_complete(sync_weights(weights, engine))
        rounds = [0]

        def local() -> float:
            params = SamplingParams(max_tokens=work.new_tokens, temperature=1.0, seed=rounds[0])
            rounds[0] += 1
            seconds, outputs = timed(lambda: loop.run_until_complete(engine.generate(prompts.tolist(), params)), "cpu")
            out["local_tokens"] = sum(len(o.token_ids) for o in outputs)
            return float(seconds)

        def hf() -> float:
            ids = prompts.to(work.device)
            kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "pad_token_id": 0}
            with torch.inference_mode():
                seconds, sequences = timed(
                    lambda: reference.generate(
                        input_ids=ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=work.new_tokens,
                        min_new_tokens=work.new_tokens,
                        **kwargs,
                    ),
                    work.device,
                )
            out["hf_tokens"] = int(sequences[:, work.prompt_len :].numel())
            return float(seconds)

        seconds = alternate({"local": local, "hf": hf}, 1, work.repeats, budget, 0.0, "decoding")
        out["sleep"] = loop.run_until_complete(measure_sleep(work, engine))
    finally:
        loop.run_until_complete(engine.close())
        loop.close()
    for name, values in seconds.items():
        median = statistics.median(values) if values else None
        tokens = out.get(f"{name}_tokens", 0)
        out[name] = {"s": values, "median_s": median, "tokens_per_s": tokens / median if median else None}
    return out


# --- report -------------------------------------------------------------------------------------------------------


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows (candidate, baseline, candidate/baseline) from whatever phases completed."""
    rows: list[dict[str, Any]] = []

    def add(label: str, unit: str, ours: float | None, base: float | None, baseline: str) -> None:
        ratio = ours / base if ours is not None and base else None
        rows.append({"label": label, "unit": unit, "ours": ours, "baseline": base, "ratio": ratio, "vs": baseline})

    work = result["workload"]
    for shape, train in result.get("training", {}).items():
        for micro, sides in train["micro_batches"].items():
            size = f"{shape}, {work['rows']}×{work['seq_len']} tok, mb {micro}"
            plain = sides["plain"]
            for name, label in (("torch", "TorchBackend"), ("torch_mixed", "  fp32 master + bf16"), ("fsdp2", "FSDP2")):
                side = sides[name]
                add(f"{label} step ({size})", "tokens/s", side["tokens_per_s"], plain["tokens_per_s"], "plain loop")
            mfu = {n: sides[n]["mfu"] * 100 if sides[n]["mfu"] is not None else None for n in ("fsdp2", "torch")}
            add(f"  FSDP2 vs TorchBackend MFU ({size})", "%", mfu["fsdp2"], mfu["torch"], "TorchBackend")
    offload = result.get("offload")
    if offload and offload.get("offload_gb_per_s") is not None:
        add("optimizer offload (pinned)", "GB/s", offload["offload_gb_per_s"], None, "")
        add("optimizer reload", "GB/s", offload["reload_gb_per_s"], None, "")
    weights = result.get("weights")
    if weights:
        fsdp, local = weights["fsdp2"], weights["torch"]
        add("weight extraction to CPU", "s (median)", fsdp["median_s"], local["median_s"], "TorchBackend copy")
        add("  extraction rate", "GB/s", fsdp["gb_per_s"], local["gb_per_s"], "TorchBackend copy")
    decode = result.get("decoding")
    if decode:
        add("weight load into local engine", "s", decode["engine_load_s"], None, "")
        label = f"decode {work['prompts']}×{work['new_tokens']} tok"
        local_rate, hf_rate = decode["local"]["tokens_per_s"], decode["hf"]["tokens_per_s"]
        add(label, "tokens/s", local_rate, hf_rate, "HF generate")
    return rows


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["row", "unit", "skyrl", "baseline", "ratio", "baseline is"]
    lines = [header]
    for row in rows:
        ratio = f"{row['ratio']:.2f}×" if row["ratio"] is not None else "—"
        lines.append([row["label"], row["unit"], _num(row["ours"]), _num(row["baseline"]), ratio, row["vs"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        aligned = (
            c.rjust(w) if i in (2, 3, 4) else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return " | ".join(aligned)

    return "\n".join([fmt(header), "-|-".join("-" * w for w in widths), *(fmt(line) for line in lines[1:])])


def environment(work: Workload) -> dict[str, Any]:
    import platform

    import torch
    import transformers

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
    if work.device.startswith("cuda"):
        properties = torch.cuda.get_device_properties(torch.device(work.device))
        info.update(gpu=properties.name, gpu_memory_gb=round(properties.total_memory / 1e9, 1))
    return info


def write(result: dict[str, Any], path: Path) -> None:
    """Rewrite the JSON (after every phase, so a run cut short still leaves what it measured)."""
    result["rows"] = rows_of(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


# --- main ---------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny model on the CPU with gloo (smoke test)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the GPU (default 989: H200)")
    parser.add_argument("--budget-s", type=float, help="seconds for the whole run (default 420)")
    parser.add_argument("--rows", type=int, help="training rows per step (default 32)")
    parser.add_argument("--seq-len", type=int, help="tokens per training row (default 1024)")
    parser.add_argument("--micro-batch", type=int, help="rows per micro-batch (default: 4 and 16; 1.5b: 4 and 8)")
    parser.add_argument("--shapes", help="comma list of model shapes: 0.5b, 1.5b (default both)")
    parser.add_argument("--steps", type=int, help="timed training rounds at most (default 10)")
    parser.add_argument("--repeats", type=int, help="timed extraction and decoding rounds at most (default 3)")
    parser.add_argument("--prompts", type=int, help="decoding batch (default 64)")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per prompt (default 256)")
    parser.add_argument("--seed", type=int)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work = workload_of(args)
    if args.small:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # FSDP2 puts its mesh on CUDA whenever it sees a GPU
    budget = Budget(work.budget_s)
    faulthandler.dump_traceback_later(work.budget_s + 60, exit=True)  # a hung collective must not eat the lease
    import torch
    import torch.distributed as dist

    result: dict[str, Any] = {
        "benchmark": "gpu_bench",
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "small": args.small,
        "workload": asdict(work),
        "environment": environment(work),
        "budget": {"seconds": work.budget_s, "stopped_early": budget.stopped_early},
        "partial": True,
    }
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        init_process_group(work)
        try:
            first, weights = None, None
            for index, shape in enumerate(work.shapes):
                build = functools.partial(build_model, work, shape, Path(tmp) / shape)
                seconds, (model, params) = timed(build, work.device)
                result.setdefault("models", {})[shape] = {"parameters": params, "build_s": seconds}
                later = len(work.shapes) - index - 1
                result.setdefault("training", {})[shape] = measure_training(work, shape, model, params, budget, later)
                write(result, args.output)
                if index == 0:
                    first = model
                    weights = measure_hand_over(work, model, result, budget)
                    write(result, args.output)
            if work.device.startswith("cuda"):
                result["max_memory_allocated_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
            if first is not None and budget.left() > 0.1 * work.budget_s:
                result["decoding"] = measure_decoding(work, first, weights, budget)
            else:
                budget.stopped_early.append(f"decoding skipped: {budget.left():.0f} s of the budget left")
        finally:
            dist.destroy_process_group()
    result["wall_s"] = time.perf_counter() - budget.started
    result["partial"] = False
    write(result, args.output)
    faulthandler.cancel_dump_traceback_later()

    env = result["environment"]
    print(f"torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, {env.get('gpu', 'CPU')}")
    sizes = ", ".join(f"{shape} {m['parameters'] / 1e6:.1f} M" for shape, m in result.get("models", {}).items())
    print(f"models: {sizes} parameters, {work.dtype}; run {result['wall_s']:.0f} s of {work.budget_s:g}\n")
    print(table(result["rows"]))
    for note in budget.stopped_early:
        print(f"budget: {note}")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
