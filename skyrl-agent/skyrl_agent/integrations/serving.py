"""What ``skyrl-agent run --harness NAME --model M`` serves the harness: a recording gateway or a plain server.

``--model scripted:oracle``: skyrl-train's gateway over :class:`~skyrl_agent.integrations.harness.OracleEngine`
with the tiny tokenizer (built locally, no download); every model call is recorded, token ids and all, as in
training. ``--model http://host:port/v1``: that server, unrecorded (how a harness is deployed). The scripted path
needs skyrl-train installed (the gateway lives there); the plain one does not.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from skyrl_agent.harness.base import Endpoint, Harness, SessionServer
from skyrl_agent.tasks.format import SWETask

__all__ = ["HARNESSES", "Serving", "make_harness", "serving"]

HARNESSES = ("mini-swe-agent", "command:ARGV")
ORACLE_CONTEXT = 1 << 20  # the oracle has no context limit; the gateway's must not refuse the long SWE prompts


@dataclass(frozen=True)
class Serving:
    """The harness's model: a recording ``server`` (one session per episode) or a plain ``endpoint``.

    ``llm_s`` says how many seconds the model's calls took so far (summed); None for a plain endpoint, whose calls
    are the harness's own HTTP requests.
    """

    server: SessionServer | None = None
    endpoint: Endpoint | None = None
    llm_s: Callable[[], float] | None = None


def make_harness(name: str) -> Harness:
    """The harness called ``name``: ``mini-swe-agent``, or ``command:ARGV``.

    ``command:ARGV`` is a program run in the sandbox, e.g. ``command:python /opt/agent.py``
    (:mod:`skyrl_agent.harness.command`).

    Raises:
        ValueError: No such harness, or its package is not installed (the message says how to install it).
    """
    if name == "mini-swe-agent":
        from skyrl_agent.harness.mini_swe_agent import MiniSWEAgent

        try:
            return MiniSWEAgent()
        except ImportError as exc:
            raise ValueError(str(exc)) from exc
    if name.startswith("command:"):
        from skyrl_agent.harness.command import CommandHarness

        argv = shlex.split(name.removeprefix("command:"))
        if not argv:
            raise ValueError("harness command: names no program (e.g. command:python agent.py)")
        return CommandHarness(argv)
    raise ValueError(f"unknown harness {name!r}; choose one of {', '.join(HARNESSES)}")


def check_model(model: str) -> None:
    """Refuse a ``--model`` no harness can use, before anything starts."""
    if model == "scripted:oracle" or model.startswith(("http://", "https://")):
        return
    raise ValueError(f"with --harness, --model must be scripted:oracle or an http(s) base URL; got {model!r}")


@asynccontextmanager
async def serving(
    model: str, tasks: Sequence[SWETask], served_model: str, *, host: str = "127.0.0.1"
) -> AsyncIterator[Serving]:
    """The model the harness talks to for the run's length (see the module docstring).

    ``host``: the address the gateway listens on (loopback: sandboxes reach it through their model socket).
    """
    check_model(model)
    if model != "scripted:oracle":
        key = os.environ.get("OPENAI_API_KEY", "none")
        yield Serving(endpoint=Endpoint(model.rstrip("/"), key, served_model))
        return
    try:
        from skyrl_agent.integrations.harness import GatewaySessions, OracleEngine
        from skyrl_train.gateway import Gateway, GatewayConfig
        from skyrl_train.models.tiny import build_tokenizer
    except ImportError as exc:
        raise ValueError(
            f"--model scripted:oracle with a harness serves the oracle through skyrl-train's gateway, which is not "
            f"importable here ({exc}): pip install skyrl-train"
        ) from exc
    tokenizer = build_tokenizer()
    tokenizer.model_max_length = ORACLE_CONTEXT
    engine = OracleEngine(tokenizer, tasks)
    config = GatewayConfig(host=host, model_name=served_model, max_model_len=ORACLE_CONTEXT)
    async with Gateway(engine, tokenizer, config) as gateway:
        yield Serving(server=GatewaySessions(gateway), llm_s=lambda: gateway.stats.engine_s)
