"""An :class:`~skyrl_agent.llm.base.LLMClient` over a skyrl-train inference engine.

``skyrl_train`` (and with it torch) is imported only when a call is made, so this module imports without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from skyrl_agent.llm.base import Completion, Message, Prompt, SamplingParams, Usage

__all__ = ["TrainEngineClient"]


class TrainEngineClient:
    """Completes prompts with ``skyrl_train.inference.base.InferenceEngine.generate``.

    Args:
        engine: A skyrl-train ``InferenceEngine``.
        render: Chat messages → prompt token ids (the chat template with a generation prompt).
        decode: Token ids → text, when the engine does not decode.
    """

    def __init__(
        self,
        engine: Any,
        render: Callable[[Sequence[Message]], list[int]],
        decode: Callable[[list[int]], str],
    ) -> None:
        self.engine, self.render, self.decode = engine, render, decode

    async def complete(self, prompt: Prompt, params: SamplingParams, *, timeout_s: float | None = None) -> Completion:
        """One completion; ``timeout_s`` is ignored (the dispatcher's deadline cancels the call)."""
        from skyrl_train.inference.base import SamplingParams as EngineParams

        ids = self.render(prompt) if prompt and isinstance(prompt[0], dict) else [int(t) for t in prompt]  # type: ignore[arg-type]
        engine_params = EngineParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=params.stop,
            logprobs=params.logprobs,
            seed=params.seed,
        )
        (out,) = await self.engine.generate([ids], engine_params)
        text = out.text if out.text is not None else self.decode(list(out.token_ids))
        return Completion(
            text=text,
            token_ids=list(out.token_ids),
            logprobs=None if out.logprobs is None else list(out.logprobs),
            finish_reason=out.stop_reason,
            usage=Usage(len(ids), len(out.token_ids)),
            prompt_token_ids=ids,
        )
