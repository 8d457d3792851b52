"""How the local engine picks each token and decides when a sequence stops, following vLLM.

Sampling: temperature, then min-p, top-k and top-p filtering, then a draw from the filtered distribution
(Gumbel-max: ``argmax(log p − log E)``, ``E ~ Exp(1)`` drawn as ``−log U``). Reported log-probabilities are those of
that distribution (vLLM's ``processed_logprobs``). Greedy rows (``temperature == 0``) take the argmax and report
``log_softmax(logits)``. A row with a seed draws from a generator of its own; the others share one.

Stopping: at an EOS or ``stop_token_ids`` token, at a stop string (matched on the decoded tail), or at the row's
token budget (``"length"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from skyrl_train.inference.base import SamplingParams, StopReason

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["SampledRow", "Sampler", "Stopper", "validate_sampling_params"]


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


class SampledRow(Protocol):
    """What :class:`Sampler` reads of each row's request."""

    @property
    def params(self) -> SamplingParams:
        """The row's sampling parameters."""
        ...

    @property
    def seed(self) -> int | None:
        """The row's own seed; None draws from the shared generator."""
        ...


class Sampler:
    """Per-row sampling settings of a batch, kept aligned with its live rows.

    ``shared`` (owned by the caller) serves every row without a seed of its own.
    """

    def __init__(self, requests: Sequence[SampledRow], device: torch.device, shared: torch.Generator) -> None:
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


class Stopper:
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
