"""An OpenAI-compatible gateway in front of an inference engine that records each session's tokens as sampled.

See ``docs/agent/harnesses.md``. :class:`Gateway` serves; :class:`Sample` is what a closed session returns.
"""

from skyrl_train.gateway.errors import GatewayError
from skyrl_train.gateway.server import Gateway, GatewayConfig, GatewayStats, SessionHandle
from skyrl_train.gateway.sessions import Sample, Turn

__all__ = ["Gateway", "GatewayConfig", "GatewayError", "GatewayStats", "Sample", "SessionHandle", "Turn"]
