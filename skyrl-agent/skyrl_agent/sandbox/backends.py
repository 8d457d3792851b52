"""The sandbox backends of one machine by name: ``docker``, ``local`` (bubblewrap) and ``process`` (no isolation).

What ``skyrl-agent --backend NAME`` and a Ray sandbox host (:mod:`skyrl_agent.sandbox.ray_host_actor`) build their
sandboxes with; the ``ray`` backend itself, which places sandboxes on other machines, is made by
:func:`skyrl_agent.tasks.validate.make_backend`.
"""

from __future__ import annotations

import importlib

from skyrl_agent.sandbox.base import SandboxBackend

__all__ = ["MACHINE_BACKENDS", "make_machine_backend"]

MACHINE_BACKENDS = {  # name → (module, class); process is NOT isolated (trusted tasks only)
    "docker": ("skyrl_agent.sandbox.docker_backend", "DockerBackend"),
    "local": ("skyrl_agent.sandbox.local_backend", "LocalBackend"),
    "process": ("skyrl_agent.sandbox.process_backend", "ProcessBackend"),
}


def make_machine_backend(name: str, *, run_id: str | None = None, lifetime_s: float | None = None) -> SandboxBackend:
    """The backend called ``name`` on this machine.

    ``run_id`` and ``lifetime_s`` go to the Docker backend (its ``skyrl.run`` label, and how long an unclosed
    sandbox may live); the other backends have neither.

    Raises:
        ValueError: ``name`` is not one of :data:`MACHINE_BACKENDS`, or its module cannot be imported (the
            message names what is missing).
    """
    if name not in MACHINE_BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose docker, local, process or ray")
    module_name, class_name = MACHINE_BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"the {name} backend is not available ({exc}); try --backend process") from exc
    options = {"run_id": run_id, "lifetime_s": lifetime_s} if name == "docker" else {}
    backend: SandboxBackend = getattr(module, class_name)(**options)
    return backend
