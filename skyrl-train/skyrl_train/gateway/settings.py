"""What a :class:`~skyrl_train.gateway.server.Gateway` is configured with, and what it counts while it serves."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GatewayConfig", "GatewayStats"]


@dataclass(frozen=True)
class GatewayConfig:
    """Settings of :class:`~skyrl_train.gateway.server.Gateway`."""

    host: str = "127.0.0.1"  # interface to listen on
    port: int = 0  # 0: any free port (read Gateway.url)
    model_name: str = "policy"  # what /v1/models lists; answers echo the request's model
    max_model_len: int | None = None  # prompt + reply tokens at most; None: the engine's, else the tokenizer's
    default_max_tokens: int = 2048  # reply tokens when a request sets no max_tokens (capped by the context left)
    max_n: int = 16  # largest `n` accepted
    stream_keepalive_s: float = 15.0  # seconds between SSE comments while a streamed request waits for the engine
    max_body_bytes: int = 8 * 2**20  # largest request body accepted
    max_prompt_chars: int = 2 * 2**20  # characters of text in one request (messages, tools, prompts)
    template_kwargs: tuple[str, ...] = ("enable_thinking",)  # chat_template_kwargs keys a request may set
    max_samples_per_request: int = 64  # prompts × n of one request
    max_request_tokens: int = 2**21  # prompt + max_tokens over one request's samples
    max_session_requests: int = 4096  # requests one session may make
    max_session_samples: int = 4096  # samples one session may ask for
    max_session_tokens: int = 2**24  # prompt + max_tokens over all of one session's samples


@dataclass
class GatewayStats:
    """Counters since the gateway was created."""

    requests: int = 0  # HTTP requests received
    errors: int = 0  # answered with an OpenAI error
    sessions_opened: int = 0
    sessions_closed: int = 0
    engine_calls: int = 0  # engine.generate calls made (one per request, whatever its n)
    engine_s: float = 0.0  # seconds those calls took, summed (calls in flight together each count in full)
