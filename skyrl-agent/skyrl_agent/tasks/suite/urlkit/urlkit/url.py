from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORTS = {"http": 80, "https": 443, "ftp": 21}


@dataclass(frozen=True)
class URL:
    """The parts of an absolute URL; ``port`` is the explicit port or the scheme's default."""

    scheme: str
    host: str
    port: int
    path: str
    query: str


def split_url(url: str) -> URL:
    """Split ``scheme://host[:port]/path?query``; raises ``ValueError`` without a scheme or host."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        raise ValueError(f"not an absolute URL: {url!r}")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    host, colon, port_text = netloc.partition(":")
    if not host:
        raise ValueError(f"URL has no host: {url!r}")
    port = int(port_text) if colon and port_text else DEFAULT_PORTS.get(scheme, 0)
    scheme = scheme.lower()
    return URL(scheme, host.lower(), port, slash + path or "/", query)


def join_path(base: str, *segments: str) -> str:
    """Join URL path segments with exactly one ``/`` between them: ``join_path("/a/", "/b", "c")`` -> ``/a/b/c``."""
    path = base
    for segment in segments:
        stripped = segment.strip("/")
        if stripped:
            path = f"{path}/{stripped}"
    return path or "/"
