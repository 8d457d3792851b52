"""Where a harness that runs inside its sandbox finds its model server.

A command-line harness (:class:`~skyrl_agent.harness.command.CommandHarness`, ``runs_in_sandbox = True``) is a
process in the episode's sandbox. The process backend's sandboxes are host processes and reach ``127.0.0.1``; a
Docker sandbox is a container with no network at all. A backend that offers a host route
(``DockerBackend.host_route``: an internal network on which the host's address is the one thing reachable) puts
such a harness's sandboxes on that network; the gateway listens on the route's address, and a plain server's
loopback URL is rewritten to it (that server must listen there too, or on ``0.0.0.0``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from skyrl_agent.harness.base import Harness
from skyrl_agent.sandbox.base import HostRoute, SandboxBackend

__all__ = ["LOOPBACK_HOSTS", "RoutedBackend", "routed_url", "runs_in_sandbox", "sandbox_route"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})


@runtime_checkable
class RoutedBackend(Protocol):
    """A sandbox backend whose sandboxes can be given a route to the host."""

    async def host_route(self) -> HostRoute:
        """The network to put sandboxes on, and the host's address there."""
        ...


def runs_in_sandbox(harness: Harness) -> bool:
    """Whether the harness's own process runs inside the sandbox (it says so with ``runs_in_sandbox = True``)."""
    return bool(getattr(harness, "runs_in_sandbox", False))


async def sandbox_route(backend: SandboxBackend, harness: Harness) -> HostRoute | None:
    """The route the harness's sandboxes need to reach a server on the host; None when they need none."""
    if not runs_in_sandbox(harness) or not isinstance(backend, RoutedBackend):
        return None
    return await backend.host_route()


def routed_url(url: str, route: HostRoute | None) -> str:
    """``url`` with a loopback host replaced by the route's address (unchanged without a route)."""
    if route is None:
        return url
    parts = urlsplit(url)
    if parts.hostname not in LOOPBACK_HOSTS:
        return url
    host = f"[{route.address}]" if ":" in route.address else route.address
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    if "@" in parts.netloc:
        netloc = f"{parts.netloc.rsplit('@', 1)[0]}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))
