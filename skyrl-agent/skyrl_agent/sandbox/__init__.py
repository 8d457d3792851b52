"""Sandboxes for agent episodes: the protocol, Docker and local (bwrap) backends, warm pools, a reaper.

Backends import lazily: ``docker_backend`` needs the docker SDK, ``local_backend`` needs bubblewrap.
"""

from skyrl_agent.sandbox.base import (
    CommandResult,
    ExpiringSandbox,
    Sandbox,
    SandboxBackend,
    SandboxClosedError,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
    SandboxUnavailableError,
    Snapshot,
)
from skyrl_agent.sandbox.image import BASE_IMAGE, ImageBuildError, ImageRecipe, ensure_base_image
from skyrl_agent.sandbox.memory import InMemoryBackend, InMemorySandbox
from skyrl_agent.sandbox.pool import WarmPool

__all__ = [
    "BASE_IMAGE",
    "CommandResult",
    "ExpiringSandbox",
    "ImageBuildError",
    "ImageRecipe",
    "InMemoryBackend",
    "InMemorySandbox",
    "Sandbox",
    "SandboxBackend",
    "SandboxClosedError",
    "SandboxError",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxUnavailableError",
    "Snapshot",
    "WarmPool",
    "ensure_base_image",
]
