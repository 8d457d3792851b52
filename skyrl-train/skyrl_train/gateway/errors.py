"""Errors the gateway answers with, each carrying its HTTP status and OpenAI's error body.

Every failure a client can cause becomes one of these and is answered as ``{"error": {"message", "type", "param",
"code"}}`` with the status below; the server keeps serving. Anything else raised while handling a request is a bug
or an engine failure and is answered as a 500 ``server_error``.

Exceptions::

    GatewayError (Exception)                  status  code
     ├── InvalidRequestError                   400     invalid_request (malformed JSON, body, messages, values)
     │    ├── UnsupportedParameterError         400     unsupported_parameter: the gateway does not implement it
     │    └── ContextLengthError                400     context_length_exceeded: prompt (+ max_tokens) too long
     ├── SessionNotFoundError                  404     session_not_found: open the session (URL path) first
     │    └── UnknownSessionKeyError            401     invalid_api_key: the bearer token names no open session
     ├── SessionClosedError                    404     session_closed: the session closed while the request ran
     ├── RequestTooLargeError                  413     request_too_large: over GatewayConfig.max_body_bytes,
     │                                                  max_prompt_chars, max_samples_per_request or
     │                                                  max_request_tokens
     ├── SessionLimitError                     429     session_limit: the session used up a max_session_* cap
     └── EngineError                           500     engine_error: the inference engine failed
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ContextLengthError",
    "EngineError",
    "GatewayError",
    "InvalidRequestError",
    "RequestTooLargeError",
    "SessionClosedError",
    "SessionLimitError",
    "SessionNotFoundError",
    "UnknownSessionKeyError",
    "UnsupportedParameterError",
    "error_body",
]


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class GatewayError(Exception):
    """A request the gateway refuses or could not serve; ``status`` is the HTTP status of the answer."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body of the answer."""
        return error_body(self.message, self.type, self.param, self.code)


class InvalidRequestError(GatewayError):
    """The request is malformed: fix the JSON, the messages or the named parameter."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class UnsupportedParameterError(InvalidRequestError):
    """The request uses a parameter (or a value of one) the gateway does not implement; drop it."""

    code = "unsupported_parameter"


class ContextLengthError(InvalidRequestError):
    """The prompt, or the prompt plus ``max_tokens``, exceeds the model's context; shorten the conversation."""

    code = "context_length_exceeded"


class SessionNotFoundError(GatewayError):
    """No open session has this id: open it with ``Gateway.open_session`` before sending requests."""

    status = 404
    type = "invalid_request_error"
    code = "session_not_found"


class UnknownSessionKeyError(SessionNotFoundError):
    """The bearer token names no open session (the session id is the API key when no path names it)."""

    status = 401
    code = "invalid_api_key"


class SessionClosedError(GatewayError):
    """The session was closed while this request was being generated; its reply was not recorded."""

    status = 404
    type = "invalid_request_error"
    code = "session_closed"


class RequestTooLargeError(GatewayError):
    """The request is larger than a per-request cap of :class:`~skyrl_train.gateway.server.GatewayConfig`."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class SessionLimitError(GatewayError):
    """The session has used up one of its caps (requests, samples, tokens); the episode must end."""

    status = 429
    type = "rate_limit_error"
    code = "session_limit"


class EngineError(GatewayError):
    """The inference engine failed to generate; the message names the engine's error."""

    status = 500
    type = "server_error"
    code = "engine_error"
