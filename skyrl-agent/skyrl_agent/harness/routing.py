"""Where a harness that runs inside its sandbox finds its model server, and the check that it does.

A command-line harness (:class:`~skyrl_agent.harness.command.CommandHarness`, ``runs_in_sandbox = True``) is a
process in the episode's sandbox. A Docker sandbox has no network at all; a backend that says
``mounts_model_socket`` mounts a unix socket into it whose connections the host pipes to the model server, and a
forwarder in the sandbox serves that socket on its own loopback (:mod:`skyrl_agent.sandbox.session_socket`). The
harness is then given ``http://127.0.0.1:FORWARD_PORT`` with its endpoint's path and key, and reaches that server
and nothing else. The process backend's sandboxes are host processes (not an isolation boundary): they reach the
endpoint's own URL.

Before such a harness runs, :func:`check_reachable` asks its endpoint's ``/models`` from inside the sandbox: a
harness that cannot reach its model fails at its start with :class:`~skyrl_agent.llm.base.LLMConnectionError`
(a ``model_error``, masked) rather than training on reward 0.
"""

from __future__ import annotations

import shlex
from urllib.parse import urlsplit, urlunsplit

from skyrl_agent.harness.base import Endpoint, Harness
from skyrl_agent.llm.base import LLMConnectionError
from skyrl_agent.sandbox.base import Sandbox, SandboxBackend
from skyrl_agent.sandbox.session_socket import FORWARD_PORT, SessionSocket

__all__ = ["check_reachable", "forwarded_url", "relay_target", "relays_model", "runs_in_sandbox"]

PROBE_TIMEOUT_S = 10.0  # how long the probe waits for the model server's answer
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Run with python3 -I in the sandbox: GET <base_url>/models with the key; on failure, print why and exit 1.
_PROBE = """\
import sys, urllib.request
request = urllib.request.Request(sys.argv[1] + "/models", headers={"Authorization": "Bearer " + sys.argv[2]})
try:
    urllib.request.urlopen(request, timeout=float(sys.argv[3])).read()
except Exception as exc:
    print("%s: %s" % (type(exc).__name__, exc))
    sys.exit(1)
"""


def runs_in_sandbox(harness: Harness) -> bool:
    """Whether the harness's own process runs inside the sandbox (it says so with ``runs_in_sandbox = True``)."""
    return bool(getattr(harness, "runs_in_sandbox", False))


def relays_model(backend: SandboxBackend, harness: Harness) -> bool:
    """Whether the harness's sandboxes reach its model through a model socket.

    True for a harness inside its sandbox on a backend that mounts one; otherwise the harness gets its endpoint's URL
    as it is.
    """
    return runs_in_sandbox(harness) and bool(getattr(backend, "mounts_model_socket", False))


def relay_target(url: str) -> tuple[str, int]:
    """The host and port a model socket connects to for the server at ``url``."""
    parts = urlsplit(url)
    if parts.hostname is None:
        raise ValueError(f"the model server's URL {url!r} names no host")
    return parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)


def forwarded_url(url: str, port: int = FORWARD_PORT) -> str:
    """``url`` as a sandbox with a model socket reaches it: the forwarder's ``127.0.0.1:port``, same path and user."""
    parts = urlsplit(url)
    netloc = f"127.0.0.1:{port}"
    if "@" in parts.netloc:
        netloc = f"{parts.netloc.rsplit('@', 1)[0]}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


async def check_reachable(
    sandbox: Sandbox, endpoint: Endpoint, model_socket: SessionSocket | None = None, timeout_s: float = PROBE_TIMEOUT_S
) -> None:
    """Ask ``endpoint``'s ``/models`` from inside ``sandbox``, as the harness would (through ``model_socket``, if any).

    Raises:
        LLMConnectionError: no 2xx answer came (the message names the URL, what failed, and where).
        SandboxError: the sandbox itself failed.
    """
    argv = ["python3", "-I", "-c", _PROBE, endpoint.base_url, endpoint.api_key, f"{timeout_s:g}"]
    result = await sandbox.run(shlex.join(argv), timeout_s=timeout_s + 20.0)  # python's start-up in a slow image
    if result.exit_code != 0:
        why = "no answer in time" if result.timed_out else (result.output.strip()[-500:] or f"exit {result.exit_code}")
        if model_socket is not None and model_socket.last_error is not None:
            why += f"; the host's end of its model socket: {model_socket.last_error}"
        raise LLMConnectionError(
            f"the harness cannot reach its model from inside its sandbox: GET {endpoint.base_url}/models failed"
            f" ({why}); the model server must be running, and the sandbox must reach it (docs/agent/harnesses.md)"
        )
