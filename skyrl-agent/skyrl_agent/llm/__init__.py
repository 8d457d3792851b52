"""LLM clients: the protocol here; ``skyrl_agent.llm.scripted`` (test policies) and ``skyrl_agent.llm.openai`` (HTTP).

The submodules are not imported here, so that importing the protocol stays cheap and cycle-free.
"""

from skyrl_agent.llm.base import (
    Completion,
    LLMClient,
    LLMConnectionError,
    LLMError,
    LLMResponseError,
    LLMServerError,
    LLMTimeoutError,
    Message,
    Prompt,
    SamplingParams,
    Usage,
)

__all__ = [
    "Completion",
    "LLMClient",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMServerError",
    "LLMTimeoutError",
    "Message",
    "Prompt",
    "SamplingParams",
    "Usage",
]
