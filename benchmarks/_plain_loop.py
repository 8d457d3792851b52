"""The baseline of the training-step benchmarks: a Hugging Face causal LM and AdamW in a plain PyTorch loop.

No framework: per micro-batch a forward pass, cross-entropy on the response positions (the last ``T`` of every
row), backward; then gradient clipping, ``AdamW.step`` and ``zero_grad``. The loss is the token mean over the whole
step, as the framework's ``cross_entropy`` policy loss with ``token_mean`` reduction computes it, so both sides do
the same arithmetic on the same batch. ``benchmarks/train_step_bench.py`` (CPU) and ``benchmarks/gpu_bench.py``
(GPU) put :class:`PlainLoop` beside ``skyrl_train``'s backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


class PlainLoop:
    """One model and its optimizer; :meth:`step` is one optimizer step over a batch, in micro-batches of rows."""

    def __init__(
        self,
        model_path: Path,
        *,
        device: str,
        dtype: str,
        micro_batch: int,
        lr: float = 1e-6,
        max_grad_norm: float = 1.0,
        autocast: str | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.device, self.micro_batch, self.max_grad_norm = torch.device(device), micro_batch, max_grad_norm
        self.autocast = getattr(torch, autocast) if autocast else None  # e.g. "bfloat16" over float32 weights
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model = model.to(self.device).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)

    def step(self, input_ids: torch.Tensor, response_length: int) -> float:
        """Train on ``input_ids`` ``[B, L]`` (every token real; the last ``response_length`` are the response)."""
        ids = input_ids.to(self.device, non_blocking=True)
        tokens = ids.shape[0] * response_length
        total = torch.zeros((), device=self.device)
        for micro in torch.split(ids, self.micro_batch):
            with self._cast():
                # The logits at positions L-T-1 .. L-2 predict the T response tokens.
                logits = self.model(input_ids=micro, logits_to_keep=response_length + 1).logits[:, :-1]
            targets = micro[:, -response_length:]
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum") / tokens
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(total)

    def _cast(self) -> Any:
        if self.autocast is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast)
