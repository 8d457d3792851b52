"""The vLLM engine: vLLM's ``LLM`` driven by one engine thread, token in and token out.

Threads and processes. The engine owns one thread (``vllm-engine``) that builds the ``vllm.LLM`` and then runs
a loop: take commands (new requests, aborts, calls such as weight loads) from a thread-safe queue, and while
requests are unfinished call ``llm.llm_engine.step()``, resolving each request's future when it finishes. So
requests from many asyncio tasks are batched continuously by vLLM's scheduler, the event loop never blocks, and
weight loads run between two engine steps. Where the engine core and its worker run depends on the mode:

- **In-process (default on CPU)**: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; the engine core and the single worker
  live in this process (on the engine thread); start-up takes seconds instead of ~20-40 s on CPU. Weights go to
  the worker as the tensors themselves (transport ``direct``, no copy besides the load itself). Side effect:
  vLLM's CPU worker binds this process's threads and pins torch's intra-op thread count (it turns
  ``torch.set_num_threads`` into a no-op), so a trainer sharing the process computes with vLLM's setting; use
  the multiprocess mode when that matters.
- **Multiprocess (default on GPU)**: vLLM's normal engine, the engine core and workers in child processes
  (spawned: create the engine under ``if __name__ == "__main__":`` in scripts). With ``tensor_parallel_size=N``
  there are N workers, one per GPU this process sees, on vLLM's multiprocessing executor (never its Ray one:
  see :data:`TENSOR_PARALLEL_BACKEND`); a weight update reaches every one of them (``collective_rpc``) by the
  ``file`` or ``bytes`` transport (``cuda_ipc`` needs one GPU and is refused). Set
  ``VLLMEngineConfig(multiprocessing=True)`` to use it on CPU as well. Tensors do not survive the RPC, so
  weights go through a safetensors file under ``/dev/shm`` (transport ``file``), or as bytes (``bytes``), or,
  when the trainer's tensors sit on the same GPU, as CUDA IPC handles (``cuda_ipc``; needs CUDA, so it is not
  exercised by the CPU test suite).

Every transport ends in :class:`~skyrl_train.inference.vllm_worker_ext.WeightUpdateExtension`, installed as
vLLM's ``worker_extension_cls`` and reached through ``llm.collective_rpc``: it calls the worker's
``reload_weights`` and refreshes a tied ``lm_head`` (the CPU backend otherwise keeps a stale copy). Then, before
anything is generated with the new weights, vLLM's prefix cache is reset: every key and value computed by the old
weights is forgotten, so no request reuses them under the new policy version.

Pausing (``VLLMEngineConfig.pause_at``): ``"sequence_end"`` holds new calls and waits for the running ones to finish
before a weight load. ``"token"`` holds the engine between two engine steps instead: running requests keep their
place in vLLM's scheduler, the load runs, and on ``resume`` they continue under the new weights (as vLLM's own
``pause_generation(mode="keep", clear_cache=True)``: the cache reset makes them recompute their keys and values
with the new weights first). Requests then stream their tokens step by step (``RequestOutputKind.DELTA``), so
each token records :attr:`VLLMEngine.policy_version` at the step that delivered it
(``GenerationOutput.token_policy_versions``). A separate engine-core process (multiprocess mode) samples on its
own, ahead of the engine thread, so there the pause also stops the core's scheduler (vLLM's
``pause_scheduler(mode="keep")``) and reads the tokens it sampled before stopping: they are delivered, with the
version of the weights that sampled them, before ``pause`` returns.

Log-probabilities: the engine is created with ``logprobs_mode="processed_logprobs"``, so they are
``log_softmax(logits / temperature)`` (after top-k/top-p/min-p filtering when those are set), as the trainer
recomputes them. On GPU, ``gpu_memory_utilization`` is the fraction of device memory vLLM may take for weights
plus KV cache; on CPU it is a fraction of RAM (≈0.3 here), or set ``kv_cache_memory_bytes`` instead. Sleep
mode is not available on the CPU backend, so this engine never uses it.

vLLM is imported only inside this module's functions: importing ``skyrl_train`` never imports vLLM.

Usage::

    engine = VLLMEngine("path/to/hf-model", VLLMEngineConfig(gpu_memory_utilization=0.5))  # GPU: multiprocess
    outputs = await engine.generate([[1, 2, 3]], SamplingParams(max_tokens=64, seed=0))
    await sync_weights(backend, engine)  # pause, update_weights, resume (skyrl_train.inference.weight_sync)
    await engine.close()

The engine thread's loop and the commands it serves live in :mod:`skyrl_train.inference.vllm_loop`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from skyrl_train.inference.base import EngineLoad, GenerationOutput, SamplingParams
from skyrl_train.inference.concurrency import PauseGate, paused_during
from skyrl_train.inference.vllm_loop import (
    Abort,
    Call,
    Command,
    EngineClosedError,
    Hold,
    Request,
    StepLoop,
    Stop,
    Streamed,
    Submit,
    in_process_core,
    to_generation_output,
)
from skyrl_train.inference.vllm_worker_ext import EXTENSION_CLASS, pack_cuda_ipc
from skyrl_train.inference.weight_sync import save_weights, serialize_weights, transfer_path

if TYPE_CHECKING:
    import torch

__all__ = [
    "TENSOR_PARALLEL_BACKEND",
    "EngineClosedError",
    "PauseAt",
    "VLLMEngine",
    "VLLMEngineConfig",
    "WeightTransport",
    "llm_kwargs",
    "to_generation_output",
    "to_vllm_params",
]

WeightTransport = Literal["auto", "direct", "file", "bytes", "cuda_ipc"]
PauseAt = Literal["sequence_end", "token"]


@dataclass(frozen=True)
class VLLMEngineConfig:
    """Settings of :class:`VLLMEngine`; ``None`` means "pick for the platform" (CPU or GPU)."""

    dtype: str = "auto"  # weights/activations dtype; "auto" keeps the checkpoint's
    max_model_len: int | None = None  # prompt + completion tokens at most; None: the model's limit
    gpu_memory_utilization: float | None = None  # share of device memory (RAM on CPU); None: 0.9 GPU, 0.3 CPU
    kv_cache_memory_bytes: int | None = None  # explicit KV-cache size in bytes; overrides the share above
    tensor_parallel_size: int = 1  # GPUs the model is split over; > 1: one vLLM worker process per GPU ("mp")
    max_num_seqs: int | None = None  # sequences scheduled at once; None: vLLM's default
    max_num_batched_tokens: int | None = None  # tokens per scheduler step; None: vLLM's default
    enable_prefix_caching: bool | None = None  # reuse the KV cache of shared prefixes; None: vLLM's default
    enforce_eager: bool | None = None  # no CUDA graphs; None: True on CPU, False on GPU
    multiprocessing: bool | None = None  # engine core in child processes; None: False on CPU, True on GPU
    weight_transport: WeightTransport = "auto"  # "auto": "direct" in-process, else "file"
    transfer_dir: str | None = None  # where "file" transport writes; None: /dev/shm (or the temp dir)
    seed: int = 0  # engine seed; unseeded requests draw from it
    return_text: bool = True  # detokenize completions into GenerationOutput.text
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)  # passed to vllm.LLM as they are
    sleep_mode: bool = False  # GPU: build with enable_sleep_mode, so sleep()/wake_up() hand memory over
    pause_at: PauseAt = "sequence_end"  # "token": pause() holds running requests between steps (module docstring)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.tensor_parallel_size > 1 and self.weight_transport == "cuda_ipc":
            # Each rank opens the handles on its own GPU, but they point into the trainer's one GPU.
            raise ValueError(
                "weight_transport='cuda_ipc' needs the engine on the trainer's GPU, but tensor_parallel_size="
                f"{self.tensor_parallel_size} spreads it over several: use weight_transport='file' (or 'auto')"
            )


class VLLMEngine:
    """An :class:`~skyrl_train.inference.base.InferenceEngine` backed by ``vllm.LLM``.

    Construction returns at once; the engine thread builds the ``LLM`` in the background. ``await
    wait_ready()`` (or the first ``generate``) waits for it and raises what start-up raised. Prompt ``i`` of a
    call with ``seed=s`` is sampled with seed ``s + i``, as in the local engine.
    """

    def __init__(self, model_path: str | Path, config: VLLMEngineConfig | None = None) -> None:
        self.model_path = str(model_path)
        self.config = config or VLLMEngineConfig()
        self.weight_transport: WeightTransport = self.config.weight_transport
        self.last_update_seconds: float | None = None  # worker-side load time of the latest update
        self.sleeps = False  # whether sleep() releases memory (sleep_mode on a GPU; known once built)
        self.asleep = False
        self._commands: queue.Queue[Command] = queue.Queue()
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._ids = itertools.count()
        self._gate = PauseGate()
        self._held = False  # pause_at="token": whether pause() holds the engine thread (asyncio side)
        self.policy_version: int | None = None  # recorded on each streamed token; set it while paused
        self._loop: StepLoop | None = None  # what the engine thread runs, once the LLM is built
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="vllm-engine", daemon=True)
        self._thread.start()

    @property
    def steps(self) -> int:
        """Engine steps run so far (each samples one token of every running request)."""
        return self._loop.steps if self._loop is not None else 0

    async def wait_ready(self) -> None:
        """Wait until the ``LLM`` is built; re-raises a start-up failure."""
        await asyncio.wrap_future(self._ready)

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Sample one completion per prompt (token ids), in order; waits while paused or starting."""
        self._check_open()
        await self.wait_ready()
        if self.asleep:
            raise RuntimeError("the engine is asleep (its GPU memory lent to training): call wake_up() first")
        if params.max_tokens == 0:  # vLLM requires at least one token; nothing to ask it
            empty: list[float] | None = [] if params.logprobs else None
            return [GenerationOutput([], empty, "length", "" if self._text else None) for _ in prompts]
        gate = contextlib.nullcontext() if self.pauses_at_token_boundary else self._gate.admit()
        async with gate:
            requests = [self._request(prompt, params, i) for i, prompt in enumerate(prompts)]
            self._commands.put(Submit(requests))
            return list(await asyncio.gather(*(asyncio.wrap_future(r.future) for r in requests)))

    @property
    def pauses_at_token_boundary(self) -> bool:
        """Whether :meth:`pause` holds running requests between engine steps (``pause_at="token"``)."""
        return self.config.pause_at == "token"

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` holds the engine's work."""
        return self._held if self.pauses_at_token_boundary else self._gate.paused

    def load(self) -> EngineLoad:
        """The load at the engine thread's latest round (``vllm_loop.scheduler_load``); nothing known before start.

        vLLM's running and waiting requests and KV-cache use: read from the scheduler in process, or, with the
        engine core in its own process (the GPU default), as the core sent them with its latest step.
        """
        loop = self._loop
        return loop.load if loop is not None else EngineLoad(0, None)

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load ``(name, tensor)`` pairs in Hugging Face naming into the running engine.

        Pauses the engine meanwhile unless it is paused already: with ``pause_at="sequence_end"`` running calls
        finish on the old weights first, with ``"token"`` they continue on the new ones. For the ``file`` and
        ``bytes`` transports the weights are serialised before generation is held.
        """
        self._check_open()
        await self.wait_ready()
        transport = self.weight_transport
        if transport == "direct":
            await self._load(lambda llm: llm.collective_rpc("skyrl_load_weights", args=(weights,)))
        elif transport == "file":
            path = await asyncio.to_thread(save_weights, weights, transfer_path(self.config.transfer_dir))
            try:
                await self._load(lambda llm: llm.collective_rpc("skyrl_load_weights_from_file", args=(str(path),)))
            finally:
                path.unlink(missing_ok=True)
        elif transport == "bytes":
            data = await asyncio.to_thread(serialize_weights, weights)
            await self._load(lambda llm: llm.collective_rpc("skyrl_load_weights_from_bytes", args=(data,)))
        else:
            # The worker maps these tensors' memory: keep them referenced until the call has returned.
            shared = [(name, tensor.detach().contiguous()) for name, tensor in weights]
            payload = pack_cuda_ipc(shared)
            await self._load(lambda llm: llm.collective_rpc("skyrl_load_weights_from_cuda_ipc", args=(payload,)))
            del shared

    async def sleep(self) -> None:
        """Release the GPU memory of weights and KV cache (vLLM sleep level 1: weights to host memory).

        Waits for running ``generate`` calls. Does nothing on a CPU or without ``sleep_mode``: vLLM's CPU build
        has no sleep mode, and its memory is the host's, which the trainer shares anyway.
        """
        self._check_open()
        await self.wait_ready()
        if self.sleeps and not self.asleep:
            if self.pauses_at_token_boundary:  # level 1 drops the KV cache that held requests continue from
                raise RuntimeError("sleep() discards held requests' KV cache: use pause_at='sequence_end' to sleep")
            async with self._gate.quiesced():
                await self.call(lambda llm: llm.sleep(level=1))
            self.asleep = True

    async def wake_up(self) -> None:
        """Take the GPU memory back after :meth:`sleep` (the weights come back from host memory)."""
        self._check_open()
        await self.wait_ready()
        if self.asleep:
            await self.call(lambda llm: llm.wake_up())
            self.asleep = False

    async def pause(self) -> None:
        """Hold new work; return once no engine step runs.

        With ``pause_at="sequence_end"`` new calls wait and running ones finish first; with ``"token"`` the engine
        steps no more once this returns (running requests wait in vLLM's scheduler; every token sampled so far has
        been delivered).
        """
        if self.pauses_at_token_boundary:
            await self._hold(True)
        else:
            await self._gate.pause()

    async def resume(self) -> None:
        """Let held work proceed (held requests continue with whatever weights are loaded now)."""
        if self.pauses_at_token_boundary:
            await self._hold(False)
        else:
            await self._gate.resume()

    async def _hold(self, held: bool) -> None:
        self._check_open()
        await self.wait_ready()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._commands.put(Hold(held, future))
        await asyncio.wrap_future(future)
        self._held = held

    async def close(self) -> None:
        """Fail unfinished requests, shut the ``LLM`` down and join the engine thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._commands.put(Stop())
        await asyncio.to_thread(self._thread.join)

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(llm)`` on the engine thread between two engine steps; for what the protocol does not cover."""
        self._check_open()
        await self.wait_ready()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._commands.put(Call(fn, future))
        return await asyncio.wrap_future(future)

    # -- event-loop side helpers ---------------------------------------------------------------------------

    @property
    def _text(self) -> bool:
        return self.config.return_text

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine was closed; create a new one")
        if self._ready.done() and self._ready.exception() is None and not self._thread.is_alive():
            raise EngineClosedError("the engine thread has stopped (see the log for its error); create a new engine")

    def _request(self, prompt: Sequence[int], params: SamplingParams, index: int) -> Request:
        seed = None if params.seed is None else params.seed + index
        future: concurrent.futures.Future[GenerationOutput] = concurrent.futures.Future()
        streamed = self.pauses_at_token_boundary
        vllm_params = to_vllm_params(params, seed, self._text, streamed=streamed)
        request_id = f"skyrl-{next(self._ids)}"
        request = Request(request_id, list(prompt), vllm_params, future, Streamed() if streamed else None)
        future.add_done_callback(lambda f: self._abort_if_cancelled(f, request.request_id))
        return request

    def _abort_if_cancelled(self, future: concurrent.futures.Future[GenerationOutput], request_id: str) -> None:
        # A cancelled caller no longer wants the sequence: free its slot in the batch.
        if future.cancelled() and not self._closed:
            self._commands.put(Abort([request_id]))

    async def _load(self, rpc: Callable[[Any], list[float]]) -> None:
        async with paused_during(self):
            seconds = await self.call(lambda llm: _load_and_reset_cache(llm, rpc))
        self.last_update_seconds = max(seconds) if seconds else None

    # -- engine thread -------------------------------------------------------------------------------------

    def _serve(self) -> None:
        """The engine thread: build the LLM, then step it and serve commands until stopped."""
        try:
            llm = self._build()
        except BaseException as exc:  # surfaced to every caller through wait_ready()
            self._ready.set_exception(exc)
            return
        self._loop = StepLoop(llm, self._commands, lambda: self.policy_version)
        del llm  # the loop owns it now, and drops it when it stops
        self._ready.set_result(None)
        self._loop.run()

    def _build(self) -> Any:
        from vllm import LLM
        from vllm.platforms import current_platform

        on_cpu = bool(current_platform.is_cpu())
        multiprocessing = self.config.multiprocessing
        if multiprocessing is None:
            multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0" if on_cpu else "1") == "1"
        with _environment("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if multiprocessing else "0"):
            llm = LLM(**llm_kwargs(self.model_path, self.config, on_cpu=on_cpu, multiprocessing=multiprocessing))
        if self.weight_transport == "auto":
            self.weight_transport = "direct" if _in_process_worker(llm) else "file"
        self.sleeps = self.config.sleep_mode and not on_cpu
        return llm


TENSOR_PARALLEL_BACKEND = "mp"
"""vLLM's executor for ``tensor_parallel_size > 1``: worker processes on the GPUs this process sees.

Left to itself, vLLM picks its Ray executor inside a Ray placement group, which would ask Ray for
``tensor_parallel_size`` more GPUs while the engine actor already holds them (they could never be placed). An engine
actor that reserved ``tensor_parallel_size`` GPUs sees exactly those (Ray sets ``CUDA_VISIBLE_DEVICES``), so the
multiprocessing executor uses them, one rank each.
"""


def llm_kwargs(
    model_path: str, config: VLLMEngineConfig, *, on_cpu: bool, multiprocessing: bool = False
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``config`` on a CPU (``on_cpu``) or GPU platform.

    Options left ``None`` are not passed, so vLLM picks its own default; ``config.engine_kwargs`` come last and win.
    With ``tensor_parallel_size > 1``, ``distributed_executor_backend`` is :data:`TENSOR_PARALLEL_BACKEND`. With the
    engine core in its own process (``multiprocessing``), log stats are on: only then does the core send its
    scheduler's figures (running, waiting, KV-cache use), which :meth:`VLLMEngine.load` reports.
    """
    kwargs: dict[str, Any] = {
        "model": model_path,
        "dtype": config.dtype,
        "max_model_len": config.max_model_len,
        "tensor_parallel_size": config.tensor_parallel_size,
        "enforce_eager": on_cpu if config.enforce_eager is None else config.enforce_eager,
        "seed": config.seed,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": EXTENSION_CLASS,
    }
    if config.tensor_parallel_size > 1:
        kwargs["distributed_executor_backend"] = TENSOR_PARALLEL_BACKEND
    if multiprocessing:
        kwargs["disable_log_stats"] = False
    if config.sleep_mode and not on_cpu:  # vLLM's sleep mode needs its CUDA memory pool
        kwargs["enable_sleep_mode"] = True
    if config.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
    else:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization or (0.3 if on_cpu else 0.9)
    for name in ("max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching"):
        if getattr(config, name) is not None:
            kwargs[name] = getattr(config, name)
    kwargs.update(config.engine_kwargs)
    return kwargs


def to_vllm_params(params: SamplingParams, seed: int | None, detokenize: bool, *, streamed: bool = False) -> Any:
    """The ``vllm.SamplingParams`` for one prompt, with sampled-token logprobs when asked.

    vLLM reports the final output only, or with ``streamed`` each step's new tokens.
    """
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(
        n=1,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        min_p=params.min_p,
        seed=seed,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        include_stop_str_in_output=True,  # the protocol keeps the stop string in the output
        logprobs=0 if params.logprobs else None,  # 0: only the sampled token's
        detokenize=detokenize or bool(params.stop),  # stop strings are matched on text
        output_kind=RequestOutputKind.DELTA if streamed else RequestOutputKind.FINAL_ONLY,
    )


def _load_and_reset_cache(llm: Any, rpc: Callable[[Any], list[float]]) -> list[float]:
    """Run the weight-loading ``rpc`` (its per-worker seconds are returned), then forget the old weights' KV cache.

    A prompt that shares a cached prefix would otherwise be continued from keys and values of the old weights
    while its tokens carry the new policy version. Requests held at a token boundary lose their cache as well:
    vLLM preempts them, and they recompute it with the new weights when they are next scheduled.
    """
    seconds = rpc(llm)
    if not llm.reset_prefix_cache(reset_running_requests=True):
        raise RuntimeError("vLLM could not reset its prefix cache after loading new weights")
    return seconds


def _in_process_worker(llm: Any) -> bool:
    """Whether the model worker runs in this process (so tensors can be handed over as they are)."""
    if not in_process_core(llm):
        return False
    executor = getattr(llm.llm_engine.engine_core.engine_core, "model_executor", None)
    return executor is not None and hasattr(executor, "driver_worker")


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for a block (vLLM reads this one while building), then restore it."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
