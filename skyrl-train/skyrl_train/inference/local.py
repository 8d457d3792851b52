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
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from skyrl_train.compute_thread import ComputeThread
from skyrl_train.inference.base import GenerationOutput, SamplingParams, StopReason
from skyrl_train.inference.concurrency import PauseGate, paused_during

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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


@dataclass
class EngineStats:
    """Counters since the engine started (written by the worker thread, read anywhere)."""

    batches: int = 0  # batches run
    forward_calls: int = 0  # model forward passes (one prefill plus one per decoding step, per batch)
    sequences: int = 0  # completions produced
    generated_tokens: int = 0  # tokens sampled


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    seed: int | None
    future: asyncio.Future[GenerationOutput]


@dataclass
class _Row:
    """Decoding state of one sequence of a batch."""

    request: _Request
    budget: int  # new tokens allowed
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int | None] = field(default_factory=list)  # LocalEngine.policy_version when each token was drawn
    stop_reason: StopReason | None = None
    stop_string: str | None = None


@dataclass
class _Decoding:
    """A batch between two decoding steps: everything needed to continue it later (on the worker thread)."""

    rows: list[_Row]  # every row of the batch, in request order
    live: list[_Row]  # the rows still decoding, aligned with the tensors below
    stoppers: list[_Stopper]
    sampler: _Sampler
    cache: Any
    attention_mask: torch.Tensor  # [B_live, L]
    positions: torch.Tensor  # [B_live, n] position ids of ``feed``
    feed: torch.Tensor  # [B_live, n] ids the next forward pass reads: the prompts, then the latest tokens
    logits: torch.Tensor | None = None  # [B_live, V] of the next token, once the forward pass has run


class EngineClosedError(RuntimeError):
    """The engine was closed; create a new one."""


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
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        self.pad_token_id = _pad_token_id(model, tokenizer)
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
        self._queue: asyncio.Queue[_Request] | None = None
        self._batcher: asyncio.Task[None] | None = None
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
                queue.put_nowait(_Request(list(prompt), params, seed, future))
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

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(name, tensor)`` pairs (Hugging Face names, any device/dtype) into the model in place.

        Pauses the engine meanwhile unless it is paused already (see :meth:`pause`: with ``pause_at="token"``
        running sequences continue after the load, under the new weights). Raises ``KeyError`` for a name the
        model does not have and ``ValueError`` for a shape mismatch; pairs before the bad one are already loaded
        then.
        """
        self._check_open()
        async with paused_during(self):  # without model work of this engine on the worker thread
            await self._compute.acall(self._load_weights, weights)

    async def sleep(self) -> None:
        """On a GPU: move the model to host memory and return the cached blocks to the driver; on CPU: nothing.

        Waits for running ``generate`` calls (with ``pause_at="token"``: pauses them, until :meth:`wake_up`);
        :meth:`wake_up` moves the model back.
        """
        self._check_open()
        if self.device.type != "cuda" or self.asleep:
            return
        if self.pauses_at_token_boundary:  # a paused batch keeps its cache on the device: it must not run meanwhile
            await self.pause()
            await self._compute.acall(self._move_model, torch.device("cpu"))
        else:
            async with self._gate.quiesced():
                await self._compute.acall(self._move_model, torch.device("cpu"))
        self.asleep = True

    async def wake_up(self) -> None:
        """Move the model back to its device after :meth:`sleep`."""
        self._check_open()
        if self.asleep:
            await self._compute.acall(self._move_model, self.device)
            self.asleep = False
            if self.pauses_at_token_boundary:
                await self.resume()

    def _move_model(self, device: torch.device) -> None:
        torch.nn.Module.to(self.model, device)
        if device.type == "cpu":
            torch.cuda.empty_cache()

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

    def _bind_loop(self) -> asyncio.Queue[_Request]:
        """The request queue of the running loop, starting the batching loop on first use in that loop."""
        loop = asyncio.get_running_loop()
        if self._queue is None or self._batcher is None or self._batcher.done() or self._batcher.get_loop() is not loop:
            self._queue = asyncio.Queue()
            self._batcher = loop.create_task(self._batch_loop(self._queue))
        return self._queue

    async def _batch_loop(self, queue: asyncio.Queue[_Request]) -> None:
        while True:
            batch = await self._next_batch(queue)
            if not batch:
                continue
            try:
                outputs = await self._run_batch(batch)
            except asyncio.CancelledError:  # close(): nobody will deliver this batch's results any more
                _fail(batch, EngineClosedError("the engine was closed during generation"))
                raise
            except Exception as exc:  # the whole batch failed: every caller gets the error
                _fail(batch, exc)
                continue
            for request, output in zip(batch, outputs, strict=True):
                if not request.future.done():  # the caller may have been cancelled meanwhile
                    request.future.set_result(output)

    async def _run_batch(self, batch: list[_Request]) -> list[GenerationOutput]:
        """Decode ``batch`` on the worker thread, in stretches that end at a pause (``pause_at="token"``)."""
        decoding: _Decoding | None = None
        while True:
            async with self._stretch_gate():
                result = await self._compute.acall(self._generate_batch, batch, decoding)
            if not isinstance(result, _Decoding):
                return result
            decoding = result

    async def _next_batch(self, queue: asyncio.Queue[_Request]) -> list[_Request]:
        """The next batch: the first request, plus whatever else arrives within the window, up to the maximum."""
        batch = [await queue.get()]
        if queue.qsize() + 1 < self.config.max_batch_size:
            await asyncio.sleep(self.config.batch_window_s)
        while len(batch) < self.config.max_batch_size and not queue.empty():
            batch.append(queue.get_nowait())
        return [request for request in batch if not request.future.done()]

    # -- model work (worker thread) ------------------------------------------------------------------------

    @torch.inference_mode()
    def _generate_batch(
        self, requests: list[_Request], decoding: _Decoding | None = None
    ) -> list[GenerationOutput] | _Decoding:
        """Decode a batch (or continue a paused one) until every row stops; runs on the worker thread.

        When a pause asks it to stop between two tokens first, it returns the batch's state for a later call.
        """
        if decoding is None:
            rows = [_Row(r, min(r.params.max_tokens, self.max_model_len - len(r.prompt))) for r in requests]
            for row in rows:
                if row.budget <= 0:
                    row.stop_reason = "length"
            decoding = self._start([row for row in rows if row.budget > 0], rows)
        if decoding.live and not self._decode(decoding):
            return decoding
        rows = decoding.rows
        self.stats.batches += 1
        self.stats.sequences += len(rows)
        self.stats.generated_tokens += sum(len(row.tokens) for row in rows)
        return [self._output(row) for row in rows]

    def _start(self, live: list[_Row], rows: list[_Row]) -> _Decoding:
        """The state of a batch before its prefill: left-padded prompts and a cache sized for the longest budget."""
        from skyrl_train.inference.decoding import preallocated_cache

        if not live:
            empty = torch.empty(0, 0, dtype=torch.long)
            return _Decoding(rows, [], [], _Sampler([], self.device, self._rng), None, empty, empty, empty)
        input_ids, attention_mask = self._left_pad([row.request.prompt for row in live])
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cache = preallocated_cache(self.model, input_ids.shape[1] + max(row.budget for row in live))
        sampler = _Sampler([row.request for row in live], self.device, self._rng)
        stoppers = [_Stopper(row.request.params, self.eos_token_ids, self.tokenizer) for row in live]
        return _Decoding(rows, live, stoppers, sampler, cache, attention_mask, positions, input_ids)

    def _decode(self, state: _Decoding) -> bool:
        """Run forward passes and sample one token per live row per step; True once all rows stopped.

        False when a pause asked to stop first: ``state`` then holds where to continue (the next step's forward
        pass has not run, so the next token is drawn from the weights loaded by then).
        """
        while True:
            if state.logits is None:
                if self._at_boundary.is_set():
                    return False
                state.logits = self._forward(state.feed, state.attention_mask, state.positions, state.cache)
            tokens, logprobs = state.sampler.sample(state.logits)
            keep = []
            # One device-to-host copy per step, not one per row (matters on CUDA).
            step_tokens, step_logprobs = tokens.tolist(), logprobs.tolist()
            version = self.policy_version
            for j, (row, stopper) in enumerate(zip(state.live, state.stoppers, strict=True)):
                row.tokens.append(step_tokens[j])
                row.logprobs.append(step_logprobs[j])
                row.versions.append(version)
                row.stop_reason, row.stop_string = stopper.check(row.tokens, row.budget)
                if row.stop_reason is None:
                    keep.append(j)
            if not keep:
                return True
            if self._closed:  # close() already failed this batch's callers; stop spending compute on it
                raise EngineClosedError("the engine was closed during generation")
            next_positions = state.positions[:, -1] + 1
            if len(keep) < len(state.live):  # drop finished rows so later steps compute only live ones
                index = torch.tensor(keep, device=self.device)
                state.cache.batch_select_indices(index)
                state.attention_mask, next_positions, tokens = (
                    state.attention_mask[index],
                    next_positions[index],
                    tokens[index],
                )
                state.sampler.select(index)
                state.live, state.stoppers = [state.live[j] for j in keep], [state.stoppers[j] for j in keep]
            state.attention_mask = torch.cat(
                [state.attention_mask, state.attention_mask.new_ones(len(state.live), 1)], dim=1
            )
            state.feed, state.positions, state.logits = tokens[:, None], next_positions[:, None], None

    def _forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Logits ``[B, V]`` (float32) of the last position; the cache grows by ``input_ids.shape[1]``."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # the LM head only for the position we sample from
        )
        self.stats.forward_calls += 1
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits.float()

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``attention_mask``, both ``[B, L]`` int64, prompts aligned to the right edge."""
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[i, width - len(prompt) :] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _output(self, row: _Row) -> GenerationOutput:
        text = None
        if self.config.return_text and self.tokenizer is not None:
            text = _truncate_after(str(self.tokenizer.decode(row.tokens, skip_special_tokens=True)), row.stop_string)
        metadata: dict[str, object] = {} if row.stop_string is None else {"stop_string": row.stop_string}
        assert row.stop_reason is not None
        versions = [v for v in row.versions if v is not None]
        return GenerationOutput(
            token_ids=row.tokens,
            logprobs=row.logprobs if row.request.params.logprobs else None,
            stop_reason=row.stop_reason,
            text=text,
            metadata=metadata,
            token_policy_versions=versions if row.tokens and len(versions) == len(row.tokens) else None,
        )

    @torch.no_grad()
    def _load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the model's parameters and buffers; runs on the worker thread."""
        # keep_vars=True yields the live Parameters, under every name (tied weights appear under both names).
        targets = self.model.state_dict(keep_vars=True)
        for name, tensor in weights:
            target = targets.get(name)
            if target is None:
                raise KeyError(f"the model has no parameter {name!r} (expected Hugging Face names)")
            if target.shape != tensor.shape:
                raise ValueError(f"{name}: the model has shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))

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


def validate_sampling_params(params: SamplingParams) -> None:
    """Raise ``ValueError`` naming the first out-of-range field of ``params``."""
    checks = {
        "max_tokens must be >= 0": params.max_tokens >= 0,
        "temperature must be >= 0": params.temperature >= 0,
        "top_p must be in (0, 1]": 0 < params.top_p <= 1,
        "top_k must be -1 (off) or >= 0": params.top_k >= -1,
        "min_p must be in [0, 1]": 0 <= params.min_p <= 1,
    }
    for message, ok in checks.items():
        if not ok:
            raise ValueError(f"invalid SamplingParams: {message}; got {params}")


class _Sampler:
    """Per-row sampling settings of a batch, kept aligned with its live rows."""

    def __init__(self, requests: list[_Request], device: torch.device, shared: torch.Generator) -> None:
        params = [r.params for r in requests]
        self.greedy = torch.tensor([p.temperature == 0 for p in params], device=device)
        self.temperature = torch.tensor([p.temperature or 1.0 for p in params], device=device)
        # Greedy rows get no filters, so their reported log-probability is the plain log_softmax(logits).
        self.top_k = torch.tensor([0 if p.temperature == 0 else max(p.top_k, 0) for p in params], device=device)
        self.top_p = torch.tensor([1.0 if p.temperature == 0 else p.top_p for p in params], device=device)
        self.min_p = torch.tensor([0.0 if p.temperature == 0 else p.min_p for p in params], device=device)
        self.generators = [
            None if r.seed is None else torch.Generator(device=device).manual_seed(r.seed) for r in requests
        ]
        self.shared = shared

    def select(self, index: torch.Tensor) -> None:
        """Keep only the rows at ``index``."""
        self.greedy, self.temperature = self.greedy[index], self.temperature[index]
        self.top_k, self.top_p, self.min_p = self.top_k[index], self.top_p[index], self.min_p[index]
        self.generators = [self.generators[i] for i in index.tolist()]

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled token ids ``[B]`` (int64) and their log-probabilities ``[B]`` (float32) from logits ``[B, V]``."""
        logprobs = torch.log_softmax(self._filter(logits / self.temperature[:, None]), dim=-1)
        tokens = logits.argmax(dim=-1)
        if not bool(self.greedy.all()):
            # Gumbel-max: argmax(log p + Gumbel noise) is a draw from p; -log(Exp(1)) is Gumbel(0, 1).
            drawn = (logprobs - self._exponential_noise(logprobs).log()).argmax(dim=-1)
            tokens = torch.where(self.greedy, tokens, drawn)
        return tokens, logprobs.gather(1, tokens[:, None])[:, 0]

    def _exponential_noise(self, like: torch.Tensor) -> torch.Tensor:
        """Exp(1) noise shaped like ``like`` ``[B, V]``, row ``i`` from its own generator (or the shared one).

        Drawn as ``-log(U)`` with ``U`` uniform on [0, 1): one generator call per row, then one vectorised log for
        the batch (``Tensor.exponential_`` per row costs several times more on a CPU).
        """
        noise = torch.empty_like(like)
        shared_rows = [i for i, g in enumerate(self.generators) if g is None]
        if shared_rows:
            rows = torch.tensor(shared_rows, device=like.device)
            noise[rows] = torch.rand(like[rows].shape, generator=self.shared, device=like.device, dtype=like.dtype)
        for i, generator in enumerate(self.generators):
            if generator is not None:
                noise[i].uniform_(generator=generator)
        # U < 1, so -log(U) > 0; the clamp keeps log(noise) finite all the same (log(0) would pick a token with p = 0).
        return noise.log_().neg_().clamp_(min=torch.finfo(noise.dtype).tiny)

    def _filter(self, scaled: torch.Tensor) -> torch.Tensor:
        """Mask (to -inf) tokens removed by min-p, top-k and top-p, in vLLM's order."""
        if bool((self.min_p > 0).any()):
            probs = torch.softmax(scaled, dim=-1)
            threshold = probs.amax(dim=-1, keepdim=True) * self.min_p[:, None]
            scaled = scaled.masked_fill(probs < threshold, float("-inf"))
        if bool((self.top_k > 0).any()):
            vocab = scaled.shape[-1]
            k = torch.where(self.top_k > 0, self.top_k, vocab).clamp(max=vocab)
            kth = scaled.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if bool((self.top_p < 1).any()):
            ordered, order = scaled.sort(dim=-1, descending=True)
            probs = torch.softmax(ordered, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it does.
            drop = (probs.cumsum(dim=-1) - probs >= self.top_p[:, None]) & (self.top_p < 1)[:, None]
            scaled = scaled.scatter(1, order, ordered.masked_fill(drop, float("-inf")))
        return scaled


class _Stopper:
    """Decides when one sequence stops."""

    def __init__(
        self, params: SamplingParams, eos_token_ids: frozenset[int], tokenizer: PreTrainedTokenizerBase | None
    ) -> None:
        self.stop_ids = eos_token_ids | frozenset(params.stop_token_ids)
        self.stop_strings = params.stop
        self.tokenizer = tokenizer
        # A stop string of n characters spans at most 4n byte-level tokens (UTF-8), plus a boundary token.
        self.window = 4 * max((len(s) for s in params.stop), default=0) + 2

    def check(self, tokens: list[int], budget: int) -> tuple[StopReason | None, str | None]:
        """``(reason, stop string)`` after the newest token of ``tokens``; ``(None, None)`` to continue."""
        if tokens[-1] in self.stop_ids:
            return "stop", None
        if self.stop_strings and self.tokenizer is not None:
            # Only the tail can hold a new match: earlier matches would have stopped the sequence already.
            tail = str(self.tokenizer.decode(tokens[-self.window :], skip_special_tokens=True))
            for stop in self.stop_strings:
                if stop in tail:
                    return "stop", stop
        if len(tokens) >= budget:
            return "length", None
        return None, None


def _nothing() -> None:
    pass


def _fail(requests: Iterable[_Request], exc: BaseException) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(exc)


def _truncate_after(text: str, stop: str | None) -> str:
    """``text`` up to and including the first occurrence of ``stop`` (all of it when absent)."""
    if stop is None or (at := text.find(stop)) < 0:
        return text
    return text[: at + len(stop)]


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> frozenset[int]:
    """EOS ids from the generation config, the model config and the tokenizer, together."""
    found: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    for source in (getattr(generation_config, "eos_token_id", None), getattr(model.config, "eos_token_id", None)):
        if isinstance(source, int):
            found.add(source)
        elif isinstance(source, list | tuple):
            found.update(int(t) for t in source)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        found.add(int(tokenizer.eos_token_id))
    return frozenset(found)


def _pad_token_id(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> int:
    """Any valid id works as padding (it is masked out); prefer the declared pad token."""
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(model.config, "pad_token_id", None)):
        if isinstance(candidate, int):
            return candidate
    return 0
