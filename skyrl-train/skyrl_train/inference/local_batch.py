"""One batch of :class:`~skyrl_train.inference.local.LocalEngine` being decoded, on the engine's worker thread.

A :class:`Batch` is built from requests and the engine's current :class:`BatchSettings`: prompts left-padded, a KV
cache preallocated for the longest budget (:mod:`skyrl_train.inference.decoding`), a :class:`Sampler` and a
:class:`Stopper` per row. :meth:`Batch.decode` then runs one forward pass per step and samples one token per live
row, dropping rows as they stop, until every row stopped or a pause asks it to stop at the next token boundary; the
batch then keeps everything needed to continue later. :meth:`Batch.outputs` gives one ``GenerationOutput`` per
request, in order.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from skyrl_train.inference.base import GenerationOutput, SamplingParams, StopReason
from skyrl_train.inference.sampling import Sampler, Stopper

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Batch", "BatchSettings", "EngineClosedError", "EngineStats", "Request"]


class EngineClosedError(RuntimeError):
    """The engine was closed; create a new one."""


@dataclass
class EngineStats:
    """Counters since the engine started (written by the worker thread, read anywhere)."""

    batches: int = 0  # batches run
    forward_calls: int = 0  # model forward passes (one prefill plus one per decoding step, per batch)
    sequences: int = 0  # completions produced
    generated_tokens: int = 0  # tokens sampled


@dataclass
class Request:
    """One prompt of a ``generate`` call, and the future its caller awaits."""

    prompt: list[int]
    params: SamplingParams
    seed: int | None
    future: asyncio.Future[GenerationOutput]


@dataclass(frozen=True)
class BatchSettings:
    """What a batch reads of its engine when it starts (the engine's values at that moment)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # for stop strings and decoded text
    device: torch.device
    max_model_len: int  # prompt + completion tokens at most
    eos_token_ids: frozenset[int]
    pad_token_id: int
    return_text: bool  # decode each completion into GenerationOutput.text (with a tokenizer)
    stats: EngineStats  # forward passes are counted as they run
    rng: torch.Generator  # shared by rows without a seed of their own


@dataclass
class _Row:
    """Decoding state of one sequence of a batch."""

    request: Request
    budget: int  # new tokens allowed
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int | None] = field(default_factory=list)  # the engine's policy version when each token was drawn
    stop_reason: StopReason | None = None
    stop_string: str | None = None


class Batch:
    """A batch between two decoding steps: everything needed to continue it later (on the worker thread).

    Build, decode and read it with torch's inference mode on.
    """

    def __init__(self, requests: list[Request], settings: BatchSettings) -> None:
        from skyrl_train.inference.decoding import preallocated_cache

        self.settings = settings
        self.rows = [_Row(r, min(r.params.max_tokens, settings.max_model_len - len(r.prompt))) for r in requests]
        for row in self.rows:
            if row.budget <= 0:
                row.stop_reason = "length"
        self.live = [row for row in self.rows if row.budget > 0]  # still decoding, aligned with the tensors below
        self.sampler = Sampler([row.request for row in self.live], settings.device, settings.rng)
        self.stoppers = [Stopper(row.request.params, settings.eos_token_ids, settings.tokenizer) for row in self.live]
        self.cache: Any = None
        self.logits: torch.Tensor | None = None  # [B_live, V] of the next token, once the forward pass has run
        self.feed = self.attention_mask = self.positions = torch.empty(0, 0, dtype=torch.long)
        if self.live:
            # feed [B_live, n]: the ids the next forward pass reads (the prompts, then the latest tokens);
            # attention_mask [B_live, L]; positions [B_live, n]: the position ids of feed.
            self.feed, self.attention_mask = self._left_pad([row.request.prompt for row in self.live])
            self.positions = (self.attention_mask.cumsum(-1) - 1).clamp(min=0)
            self.cache = preallocated_cache(settings.model, self.feed.shape[1] + max(row.budget for row in self.live))

    def decode(
        self, pause: threading.Event, policy_version: Callable[[], int | None], closed: Callable[[], bool]
    ) -> bool:
        """Run forward passes and sample one token per live row per step; True once all rows stopped.

        False when ``pause`` is set before a step: the batch then holds where to continue (the next step's forward
        pass has not run, so the next token is drawn from the weights loaded by then). ``policy_version()`` is
        recorded on each token; ``closed()`` raises :class:`EngineClosedError` between steps.
        """
        while True:
            if self.logits is None:
                if pause.is_set():
                    return False
                self.logits = self._forward()
            tokens, keep = self._sample(self.logits, policy_version)
            if not keep:
                return True
            if closed():  # close() already failed this batch's callers; stop spending compute on it
                raise EngineClosedError("the engine was closed during generation")
            self._narrow(tokens, keep)

    def outputs(self) -> list[GenerationOutput]:
        """One output per request, in request order (after :meth:`decode` returned True)."""
        return [self._output(row) for row in self.rows]

    def _sample(self, logits: torch.Tensor, policy_version: Callable[[], int | None]) -> tuple[torch.Tensor, list[int]]:
        """Draw a token for every live row and record it; the sampled ids ``[B_live]`` and the rows still live."""
        tokens, logprobs = self.sampler.sample(logits)
        keep = []
        # One device-to-host copy per step, not one per row (matters on CUDA).
        step_tokens, step_logprobs = tokens.tolist(), logprobs.tolist()
        version = policy_version()
        for j, (row, stopper) in enumerate(zip(self.live, self.stoppers, strict=True)):
            row.tokens.append(step_tokens[j])
            row.logprobs.append(step_logprobs[j])
            row.versions.append(version)
            row.stop_reason, row.stop_string = stopper.check(row.tokens, row.budget)
            if row.stop_reason is None:
                keep.append(j)
        return tokens, keep

    def _narrow(self, tokens: torch.Tensor, keep: list[int]) -> None:
        """Set up the next step: drop the rows that stopped, feed the latest tokens."""
        next_positions = self.positions[:, -1] + 1
        if len(keep) < len(self.live):  # drop finished rows so later steps compute only live ones
            index = torch.tensor(keep, device=self.settings.device)
            self.cache.batch_select_indices(index)
            self.attention_mask, next_positions, tokens = (
                self.attention_mask[index],
                next_positions[index],
                tokens[index],
            )
            self.sampler.select(index)
            self.live, self.stoppers = [self.live[j] for j in keep], [self.stoppers[j] for j in keep]
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(len(self.live), 1)], dim=1)
        self.feed, self.positions, self.logits = tokens[:, None], next_positions[:, None], None

    def _forward(self) -> torch.Tensor:
        """Logits ``[B_live, V]`` (float32) of the last position; the cache grows by ``feed.shape[1]``."""
        out = self.settings.model(
            input_ids=self.feed,
            attention_mask=self.attention_mask,
            position_ids=self.positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,  # the LM head only for the position we sample from
        )
        self.settings.stats.forward_calls += 1
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits.float()

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``attention_mask``, both ``[B, L]`` int64, prompts aligned to the right edge."""
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.settings.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[i, width - len(prompt) :] = 1
        return input_ids.to(self.settings.device), attention_mask.to(self.settings.device)

    def _output(self, row: _Row) -> GenerationOutput:
        tokenizer = self.settings.tokenizer
        text = None
        if self.settings.return_text and tokenizer is not None:
            text = _truncate_after(str(tokenizer.decode(row.tokens, skip_special_tokens=True)), row.stop_string)
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


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> frozenset[int]:
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


def pad_token_id(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> int:
    """Any valid id works as padding (it is masked out); prefer the declared pad token."""
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(model.config, "pad_token_id", None)):
        if isinstance(candidate, int):
            return candidate
    return 0


def _truncate_after(text: str, stop: str | None) -> str:
    """``text`` up to and including the first occurrence of ``stop`` (all of it when absent)."""
    if stop is None or (at := text.find(stop)) < 0:
        return text
    return text[: at + len(stop)]
