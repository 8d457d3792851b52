"""A local inference engine on plain PyTorch + transformers: batched, KV-cached, token in and token out.

For tests, CPU runs and small models where starting vLLM costs more than it saves. Contract and threading:

- :meth:`LocalEngine.generate` may be awaited from many asyncio tasks at once. Each prompt becomes a request
  on a queue; a background *batching loop* (an asyncio task on the caller's event loop) waits
  ``batch_window_s`` after the first request arrives, takes up to ``max_batch_size`` requests and runs them as
  one left-padded batch. Requests that arrive while a batch runs form the next one.
- All model work (generation and weight loads) runs on one worker thread, so the event loop never blocks and
  weights never change in the middle of a batch: a thread of the engine's own, or a
  :class:`~skyrl_train.compute_thread.ComputeThread` shared with the training backends (one thread for all torch
  work of a process keeps CPU generation fast; see that module).
- Decoding keeps the KV cache in preallocated buffers and, for grouped-query attention under ``sdpa``, switches the
  model to an attention function that does not copy the cache's key/value heads at every step
  (:mod:`skyrl_train.inference.decoding`); logits are unchanged.
- Sampling follows vLLM: temperature, then min-p, top-k and top-p filtering, then a draw from the filtered
  distribution (Gumbel-max: ``argmax(log p − log E)``, ``E ~ Exp(1)`` drawn as ``−log U``). Reported
  log-probabilities are those of that distribution (vLLM's ``processed_logprobs``): ``log_softmax(logits /
  temperature)`` when no filter is active. Greedy (``temperature == 0``) takes the argmax and reports
  ``log_softmax(logits)``.
- Seeds: prompt ``i`` of a call with ``seed=s`` draws from its own generator seeded with ``s + i``, so a seeded
  call reproduces its output regardless of what else shares the batch (up to floating-point differences
  between batch shapes). Unseeded prompts share a generator seeded once from ``LocalEngineConfig.seed``.
- Pausing (``LocalEngineConfig.pause_at``): ``"sequence_end"`` holds new calls and waits for the running ones to
  finish, so weights never change under a sequence. ``"token"`` pauses at the next token boundary instead: the
  running batch leaves the worker thread with its state (KV cache, sampled tokens), weight loads run meanwhile, and
  on :meth:`LocalEngine.resume` the batch continues where it stopped, so an in-flight update aborts nothing. The KV
  cache of the tokens before the pause stays as the old weights computed it (as in PipelineRL); every later token
  is sampled from logits of the new weights. Each sampled token records :attr:`LocalEngine.policy_version` at the
  moment it was sampled (``GenerationOutput.token_policy_versions``); whoever loads weights sets it while paused.
- A sequence stops at the tokenizer's/model's EOS or a ``stop_token_ids`` token (kept in the output), at a
  stop string (needs a tokenizer; the token that completes it is kept and ``text`` ends with the string), or
  after ``max_tokens`` tokens or at the context limit (``"length"``).
- Sleeping (:meth:`LocalEngine.sleep`, CUDA only): the weights move to page-locked host buffers allocated at the
  first sleep and reused by every later one (:class:`~skyrl_train.inference.model_weights.HostOffload`), and the
  device's cached blocks go back to the driver; :meth:`LocalEngine.wake_up` copies them back.

The batch being decoded lives in :mod:`skyrl_train.inference.local_batch`, sampling and stopping in
:mod:`skyrl_train.inference.sampling`; this module holds the asyncio side.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from skyrl_train.compute_thread import ComputeThread
from skyrl_train.inference.base import EngineLoad, GenerationOutput, SamplingParams
from skyrl_train.inference.concurrency import PauseGate, paused_during
from skyrl_train.inference.local_batch import (
    Batch,
    BatchSettings,
    EngineClosedError,
    EngineStats,
    Request,
    eos_token_ids,
    pad_token_id,
)
from skyrl_train.inference.model_weights import HostOffload, copy_weights
from skyrl_train.inference.sampling import validate_sampling_params

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "EngineClosedError",
    "EngineStats",
    "LocalEngine",
    "LocalEngineConfig",
    "PauseAt",
    "validate_sampling_params",
]

PauseAt = Literal["sequence_end", "token"]


@dataclass(frozen=True)
class LocalEngineConfig:
    """Settings of :class:`LocalEngine`."""

    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"; the engine moves the model there
    dtype: str = "float32"  # torch dtype of weights and activations when loading from a path ("bfloat16", …)
    max_batch_size: int = 64  # sequences per batch at most
    batch_window_s: float = 0.002  # seconds the batching loop waits for more requests after the first one
    max_model_len: int | None = None  # prompt + completion tokens at most; None: max_position_embeddings
    seed: int = 0  # seeds the generator shared by requests without their own seed
    return_text: bool = True  # decode each completion into GenerationOutput.text (needs a tokenizer)
    pause_at: PauseAt = "sequence_end"  # "token": pause() stops running batches at the next token (module docstring)


class LocalEngine:
    """An :class:`~skyrl_train.inference.base.InferenceEngine` running a transformers causal LM in-process.

    The engine owns ``model`` from now on (it moves it to ``config.device`` and loads weights into it); pass a
    tokenizer for stop strings and decoded text. ``compute``: the thread to run model work on (the caller keeps
    owning it); None gives the engine a thread of its own. Bound to the event loop it is first used from; after
    ``asyncio.run`` ends, a later loop may use it again.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        config: LocalEngineConfig | None = None,
        compute: ComputeThread | None = None,
    ) -> None:
        from skyrl_train.inference.decoding import use_gqa_attention

        self.config = config or LocalEngineConfig()
        self.device = torch.device(self.config.device)
        torch.nn.Module.to(model, self.device)  # in place; transformers' typed wrapper of `.to` confuses mypy
        self.model = model.eval()
        use_gqa_attention(model)  # same outputs, without copying the KV cache per layer and step
        self.tokenizer = tokenizer
        self.max_model_len = self.config.max_model_len or int(model.config.max_position_embeddings)
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self.pad_token_id = pad_token_id(model, tokenizer)
        self.stats = EngineStats()
        self._rng = torch.Generator(device=self.device).manual_seed(self.config.seed)
        self._owns_compute = compute is None
        self._compute = compute or ComputeThread("local-engine")
        # "sequence_end": generate() holds a place in the gate for its whole call. "token": the batching loop holds
        # one for each stretch of decoding, and _at_boundary asks the running stretch to stop at the next token.
        self._gate = PauseGate()
        self._at_boundary = threading.Event()
        self.policy_version: int | None = None  # recorded on each sampled token; set it while the engine is paused
        self.asleep = False  # sleep() moved the model to host memory (GPU only)
        self._offload = HostOffload()  # the host buffers sleep() moves the weights into, kept for the next sleep
        self._queue: asyncio.Queue[Request] | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._running = 0  # requests in the batch being decoded
        self._closed = False

    @classmethod
    def from_pretrained(
        cls, model_path: str | Path, *, compute: ComputeThread | None = None, **options: Any
    ) -> LocalEngine:
        """Load a Hugging Face model directory (and its tokenizer, when present); ``options`` set the config."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = LocalEngineConfig(**options)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, config.dtype))
        tokenizer = None
        if any((Path(model_path) / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
            tokenizer = AutoTokenizer.from_pretrained(model_path)
        return cls(model, tokenizer, config, compute)

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        """Sample one completion per prompt (token ids), in order; waits while the engine is paused."""
        self._check_open()
        if self.asleep:
            raise RuntimeError("the engine is asleep (its GPU memory lent to training): call wake_up() first")
        self._validate(prompts, params)
        async with self._call_gate():
            queue = self._bind_loop()
            loop = asyncio.get_running_loop()
            futures = []
            for i, prompt in enumerate(prompts):
                seed = None if params.seed is None else params.seed + i
                future: asyncio.Future[GenerationOutput] = loop.create_future()
                queue.put_nowait(Request(list(prompt), params, seed, future))
                futures.append(future)
            return list(await asyncio.gather(*futures))

    @property
    def pauses_at_token_boundary(self) -> bool:
        """Whether :meth:`pause` stops running batches at the next token (``pause_at="token"``)."""
        return self.config.pause_at == "token"

    def _call_gate(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The gate a whole ``generate`` call passes: the pause gate, unless pauses happen between tokens."""
        return contextlib.nullcontext() if self.pauses_at_token_boundary else self._gate.admit()

    def _stretch_gate(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The gate each stretch of decoding passes: the pause gate when pauses happen between tokens."""
        return self._gate.admit() if self.pauses_at_token_boundary else contextlib.nullcontext()

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` holds the engine's work."""
        return self._gate.paused

    def load(self) -> EngineLoad:
        """Requests in the batch being decoded (``running``, paused ones included) and queued for a later one.

        KV-cache use is None: the cache is allocated per batch, not drawn from a fixed pool. Calls held at the door by
        a pause (``pause_at="sequence_end"``) are not queued yet, so they are not counted.
        """
        queue = self._queue
        return EngineLoad(self._running, 0 if queue is None else queue.qsize(), None)

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(name, tensor)`` pairs (Hugging Face names, any device/dtype) into the model in place.

        Pauses the engine meanwhile unless it is paused already (see :meth:`pause`: with ``pause_at="token"``
        running sequences continue after the load, under the new weights). Raises ``KeyError`` for a name the
        model does not have and ``ValueError`` for a shape mismatch; pairs before the bad one are already loaded
        then.
        """
        self._check_open()
        async with paused_during(self):  # without model work of this engine on the worker thread
            await self._compute.acall(copy_weights, self.model, weights)

    async def sleep(self) -> None:
        """On a GPU: move the model to host memory and return the cached blocks to the driver; on CPU: nothing.

        Waits for running ``generate`` calls (with ``pause_at="token"``: pauses them, until :meth:`wake_up`);
        :meth:`wake_up` moves the model back. The host buffers are pinned, allocated at the first sleep and reused
        by every later one (host memory the size of the model, held until the engine is dropped).
        """
        self._check_open()
        if self.device.type != "cuda" or self.asleep:
            return
        if self.pauses_at_token_boundary:  # a paused batch keeps its cache on the device: it must not run meanwhile
            await self.pause()
            await self._compute.acall(self._offload.to_host, self.model)
        else:
            async with self._gate.quiesced():
                await self._compute.acall(self._offload.to_host, self.model)
        self.asleep = True

    async def wake_up(self) -> None:
        """Move the model back to its device after :meth:`sleep`."""
        self._check_open()
        if self.asleep:
            await self._compute.acall(self._offload.to_device, self.model, self.device)
            self.asleep = False
            if self.pauses_at_token_boundary:
                await self.resume()

    async def pause(self) -> None:
        """Hold new work; return once the worker thread is free of this engine's generation.

        ``pause_at="sequence_end"``: new ``generate`` calls wait, running ones finish first. ``"token"``: running
        batches stop at the next token boundary and wait (their calls stay pending) until :meth:`resume`.
        """
        if self.pauses_at_token_boundary:
            self._at_boundary.set()
        await self._gate.pause()

    async def resume(self) -> None:
        """Let held work proceed (paused batches continue, with whatever weights are loaded now)."""
        self._at_boundary.clear()
        await self._gate.resume()

    async def close(self) -> None:
        """Stop the batching loop, fail queued and running requests, end the worker thread (its own); idempotent.

        The model's memory is freed with the engine object (``model`` stays readable for inspection).
        """
        if self._closed:
            return
        self._closed = True
        batcher = self._batcher
        if batcher is not None and not batcher.done() and batcher.get_loop() is asyncio.get_running_loop():
            batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await batcher
        while self._queue is not None and not self._queue.empty():
            _fail([self._queue.get_nowait()], EngineClosedError("the engine was closed"))
        if self._owns_compute:
            await asyncio.to_thread(self._compute.close)
        else:  # a shared thread stays up; wait until the engine's work handed to it is over (if it still runs)
            with contextlib.suppress(RuntimeError):
                await self._compute.acall(_nothing)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- batching loop (event-loop side) -------------------------------------------------------------------

    def _bind_loop(self) -> asyncio.Queue[Request]:
        """The request queue of the running loop, starting the batching loop on first use in that loop."""
        loop = asyncio.get_running_loop()
        if self._queue is None or self._batcher is None or self._batcher.done() or self._batcher.get_loop() is not loop:
            self._queue = asyncio.Queue()
            self._batcher = loop.create_task(self._batch_loop(self._queue))
        return self._queue

    async def _batch_loop(self, queue: asyncio.Queue[Request]) -> None:
        while True:
            batch = await self._next_batch(queue)
            if not batch:
                continue
            self._running = len(batch)
            try:
                outputs = await self._run_batch(batch)
            except asyncio.CancelledError:  # close(): nobody will deliver this batch's results any more
                _fail(batch, EngineClosedError("the engine was closed during generation"))
                raise
            except Exception as exc:  # the whole batch failed: every caller gets the error
                _fail(batch, exc)
                continue
            finally:
                self._running = 0
            for request, output in zip(batch, outputs, strict=True):
                if not request.future.done():  # the caller may have been cancelled meanwhile
                    request.future.set_result(output)

    async def _run_batch(self, requests: list[Request]) -> list[GenerationOutput]:
        """Decode ``requests`` on the worker thread, in stretches that end at a pause (``pause_at="token"``)."""
        batch: Batch | None = None
        while True:
            async with self._stretch_gate():
                result = await self._compute.acall(self._generate_batch, requests, batch)
            if not isinstance(result, Batch):
                return result
            batch = result

    async def _next_batch(self, queue: asyncio.Queue[Request]) -> list[Request]:
        """The next batch: the first request, plus whatever else arrives within the window, up to the maximum."""
        batch = [await queue.get()]
        if queue.qsize() + 1 < self.config.max_batch_size:
            await asyncio.sleep(self.config.batch_window_s)
        while len(batch) < self.config.max_batch_size and not queue.empty():
            batch.append(queue.get_nowait())
        return [request for request in batch if not request.future.done()]

    # -- model work (worker thread) ------------------------------------------------------------------------

    @torch.inference_mode()
    def _generate_batch(self, requests: list[Request], batch: Batch | None = None) -> list[GenerationOutput] | Batch:
        """Decode a batch (or continue a paused one) until every row stops; runs on the worker thread.

        When a pause asks it to stop between two tokens first, it returns the batch for a later call.
        """
        if batch is None:
            batch = Batch(requests, self._batch_settings())
        if batch.live and not batch.decode(self._at_boundary, lambda: self.policy_version, lambda: self._closed):
            return batch
        self.stats.batches += 1
        self.stats.sequences += len(batch.rows)
        self.stats.generated_tokens += sum(len(row.tokens) for row in batch.rows)
        return batch.outputs()

    def _batch_settings(self) -> BatchSettings:
        """The engine's current values, as a new batch reads them."""
        return BatchSettings(
            model=self.model,
            tokenizer=self.tokenizer,
            device=self.device,
            max_model_len=self.max_model_len,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            return_text=self.config.return_text,
            stats=self.stats,
            rng=self._rng,
        )

    # -- validation ---------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine was closed; create a new one")

    def _validate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> None:
        validate_sampling_params(params)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; construct the engine with one")
        for prompt in prompts:
            if not prompt:
                raise ValueError("a prompt must have at least one token")
            if len(prompt) >= self.max_model_len:
                raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room within {self.max_model_len}")


def _nothing() -> None:
    pass


def _fail(requests: Iterable[Request], exc: BaseException) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(exc)
