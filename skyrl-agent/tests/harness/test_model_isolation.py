"""A harness inside its Docker sandbox reaches its own model server and nothing else.

Sandboxes are made as :class:`HarnessPipeline` makes them for a command-line harness (``acquire``, then the model
socket served and checked as ``run_agent`` does). From inside, a listener on the host's wildcard address is tried at
every address the host has, a second sandbox's listener by its name, the internet by address and by name; then a
whole episode talks to a stand-in model server through its URL (megabytes, many connections at once), and one whose
server is not there fails before its harness starts, masked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import itertools
import shlex
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.dispatch import Episode
from skyrl_agent.dispatch.outcomes import Outcome, Treatment
from skyrl_agent.harness import CommandHarness, HarnessPipeline
from skyrl_agent.harness.base import Endpoint
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.sandbox.base import Sandbox
from skyrl_agent.tasks import load_suite

pytestmark = pytest.mark.docker
KEY = "session-key"
MB = 1 << 20

# python3 -I -c TRY PORT ADDRESS...: one line per address, "reached" or "failed" and why.
TRY = """
import socket, sys
for address in sys.argv[2:]:
    try:
        socket.create_connection((address, int(sys.argv[1])), 3).close()
        print("reached", address)
    except Exception as exc:
        print("failed", address, exc)
"""

# The harness of the session test: a standard-library client (task images have no openai SDK).
AGENT = r"""
import hashlib, json, os, urllib.request
from concurrent.futures import ThreadPoolExecutor
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
def call(path, body=None):
    request = urllib.request.Request(base + path, body, {"Authorization": "Bearer " + key})
    return urllib.request.urlopen(request, timeout=60).read()
body = os.urandom(4 << 20)
print("url", base)
print("models", json.loads(call("/models"))["data"][0]["id"])
print("posted", json.loads(call("/echo", body))["sha256"] == hashlib.sha256(body).hexdigest())
print("got", len(call("/blob/%d" % (4 << 20))))
with ThreadPoolExecutor(16) as pool:
    sizes = list(pool.map(lambda k: len(call("/blob/%d" % (k * 1000))), range(32)))
print("concurrent", sizes == [k * 1000 for k in range(32)])
"""


@contextlib.asynccontextmanager
async def _stand_in_gateway() -> AsyncIterator[Endpoint]:
    """An HTTP server on the host's loopback standing in for the gateway (the key checked on every route)."""
    from aiohttp import web

    @web.middleware
    async def keyed(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": "bad key"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stand-in"}]})

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"sha256": hashlib.sha256(await request.read()).hexdigest()})

    async def blob(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * int(request.match_info["n"]))

    app = web.Application(middlewares=[keyed], client_max_size=16 * MB)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/echo", echo)
    app.router.add_get("/v1/blob/{n}", blob)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Endpoint(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", KEY, "stand-in")
    finally:
        await runner.cleanup()


def _pipeline(endpoint: Endpoint, argv: list[str], run_id: str) -> HarnessPipeline:
    from skyrl_agent.sandbox.docker_backend import DockerBackend

    return HarnessPipeline(DockerBackend(run_id=run_id), AgentConfig(), harness=CommandHarness(argv), endpoint=endpoint)


@contextlib.asynccontextmanager
async def _agent_sandboxes(n: int) -> AsyncIterator[list[Sandbox]]:
    """``n`` agent sandboxes as an in-sandbox harness gets them, their model sockets serving a stand-in gateway."""
    task = load_suite()[0]
    async with _stand_in_gateway() as endpoint:
        pipeline = _pipeline(endpoint, ["true"], "skyrl-test-isolation")
        sandboxes: list[Sandbox] = []
        try:
            for k in range(n):
                sandboxes.append(await pipeline.acquire(Episode(f"isolation-{k}", {"task": task})))
                reached = await pipeline._reach(sandboxes[-1], endpoint)  # as run_agent does: serve, then check
                assert reached.base_url == "http://127.0.0.1:17400/v1"
            yield sandboxes
        finally:
            for sandbox in sandboxes:
                await pipeline.release(sandbox)
            await pipeline.backend.close()


async def _try(sandbox: Sandbox, port: int, addresses: list[str]) -> dict[str, str]:
    """Address -> "reached" or "failed …", connecting from inside ``sandbox``."""
    command = shlex.join(["python3", "-I", "-c", TRY, str(port), *addresses])
    result = await sandbox.run(command, timeout_s=120)
    assert result.exit_code == 0, result.output
    return {line.split()[1]: line for line in result.output.splitlines()}


def _host_addresses() -> list[str]:
    """Every address of the host but loopback: its interfaces' (v4 and global v6) and each Docker network's gateway."""
    import docker

    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    found = {prev.split()[-1] for prev, line in itertools.pairwise(lines) if "/32 host LOCAL" in line}
    with contextlib.suppress(OSError):
        v6 = Path("/proc/net/if_inet6").read_text().splitlines()
        found |= {str(ipaddress.IPv6Address(int(line.split()[0], 16))) for line in v6}
    client = docker.from_env()
    for network in client.networks.list():
        network.reload()
        configs = network.attrs["IPAM"]["Config"] or []
        found |= {config["Gateway"].split("/")[0] for config in configs if "Gateway" in config}
    client.close()
    addresses = [ipaddress.ip_address(address) for address in found]
    return sorted(str(a) for a in addresses if not (a.is_loopback or a.is_link_local))


def _reaches(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), 3).close()
    except OSError:
        return False
    return True


def _wildcard_listener() -> socket.socket:
    """A TCP listener on every address of the host (v4 and v6 where the host has v6)."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("0.0.0.0", 0))


def test_a_listener_on_the_hosts_wildcard_address_is_unreachable_at_every_host_address() -> None:
    listener = _wildcard_listener()
    port = listener.getsockname()[1]
    # The addresses at which the host itself reaches the listener (a Docker bridge with nothing attached may be
    # down, and its address then answers nobody): each must be out of the sandbox's reach.
    addresses = [address for address in _host_addresses() if _reaches(address, port)]
    assert addresses, "the host reaches its own wildcard listener at none of its addresses"
    names = ["host.docker.internal", "localhost", "127.0.0.1"]  # the last two: the sandbox's own loopback

    async def main() -> dict[str, str]:
        async with _agent_sandboxes(1) as (sandbox,):
            return await _try(sandbox, port, [*addresses, *names])

    try:
        tried = asyncio.run(main())
    finally:
        listener.close()
    assert len(tried) == len(addresses) + len(names)
    reached = [line for line in tried.values() if line.startswith("reached")]
    assert reached == [], f"a sandbox reached the host's port {port}: {reached}"


def test_a_sandbox_cannot_reach_another_sandbox() -> None:
    # The peer listens for 8 s on every address, then connects to itself (so its listener did work).
    peer_listens = """
import socket, time
try:
    server = socket.create_server(("", 9999), family=socket.AF_INET6, dualstack_ipv6=True)
except OSError:  # no IPv6 in the sandbox
    server = socket.create_server(("0.0.0.0", 9999))
server.settimeout(0.2)
accepted, end = 0, time.monotonic() + 8
while time.monotonic() < end:
    try:
        server.accept()[0].close()
        accepted += 1
    except OSError:
        pass
socket.create_connection(("127.0.0.1", 9999), 3).close()
print("accepted", accepted, "then itself", server.accept()[0] is not None)
"""

    async def main() -> tuple[str, dict[str, str], Any]:
        async with _agent_sandboxes(2) as (first, peer):
            listening = asyncio.ensure_future(peer.run(shlex.join(["python3", "-I", "-c", peer_listens]), timeout_s=60))
            await asyncio.sleep(2)
            container = peer.container  # type: ignore[attr-defined]
            container.reload()
            names = [container.name, container.attrs["Config"]["Hostname"]]
            ips = [n["IPAddress"] for n in container.attrs["NetworkSettings"]["Networks"].values() if n["IPAddress"]]
            tried = await _try(first, 9999, [*names, *ips, "127.0.0.1"])
            return (await listening).output, tried, container.attrs["HostConfig"]["NetworkMode"]

    peer_output, tried, mode = asyncio.run(main())
    assert mode == "none"
    assert "accepted 0 then itself True" in peer_output, peer_output
    assert not [line for line in tried.values() if line.startswith("reached")], tried


def test_a_sandbox_has_no_internet_and_no_dns() -> None:
    outside = """
import socket
print("interfaces", sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]))
for host in ("example.com", "pypi.org"):
    try:
        socket.getaddrinfo(host, 443)
        print("resolved", host)
    except OSError as exc:
        print("unresolved", host, exc)
for address in ("1.1.1.1", "8.8.8.8", "2606:4700:4700::1111"):
    try:
        socket.create_connection((address, 443), 3).close()
        print("reached", address)
    except OSError as exc:
        print("failed", address, exc)
"""

    async def main() -> str:
        async with _agent_sandboxes(1) as (sandbox,):
            return (await sandbox.run(shlex.join(["python3", "-I", "-c", outside]), timeout_s=120)).output

    output = asyncio.run(main())
    assert "interfaces ['lo']" in output, output
    assert "resolved" not in output.replace("unresolved", ""), output
    assert "reached" not in output, output
    assert output.count("unresolved") == 2, output
    assert output.count("failed") == 3, output


def test_the_session_is_reachable_with_megabytes_and_many_connections() -> None:
    task = load_suite()[0]

    async def main() -> Any:
        async with _stand_in_gateway() as endpoint:
            pipeline = _pipeline(endpoint, ["python3", "-c", AGENT], "skyrl-test-session")
            try:
                (result,) = (await pipeline.dispatcher(null_policy()).run([Episode(task.id, {"task": task})])).results
            finally:
                await pipeline.backend.close()
            return result

    result = asyncio.run(main())
    assert result.outcome is Outcome.UNRESOLVED, result.error  # graded: the program changed nothing
    output = result.trajectory.result.messages[0]["content"]
    for line in ("url http://127.0.0.1:17400/v1", "models stand-in", "posted True", f"got {4 * MB}", "concurrent True"):
        assert line in output, output


def test_a_harness_whose_model_is_unreachable_fails_at_its_start_masked() -> None:
    task = load_suite()[0]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: the model server is not there
        port = closed.getsockname()[1]
        endpoint = Endpoint(f"http://127.0.0.1:{port}/v1", KEY, "gone")

        async def main() -> Any:
            pipeline = _pipeline(endpoint, ["sleep", "600"], "skyrl-test-unreachable")  # would run 10 minutes
            try:
                return (await pipeline.dispatcher(null_policy()).run([Episode(task.id, {"task": task})])).results[0]
            finally:
                await pipeline.backend.close()

        start = time.monotonic()
        result = asyncio.run(main())
    assert time.monotonic() - start < 120  # the harness never started
    assert result.outcome is Outcome.MODEL_ERROR, result.error
    assert result.treatment is Treatment.MASK  # not trained on as a reward of 0
    assert result.grade is None
    assert "GET http://127.0.0.1:17400/v1/models failed" in str(result.error), result.error
    assert f"connecting to 127.0.0.1:{port} failed" in str(result.error), result.error  # the host's side of it
