"""The program every sandboxed interpreter runs, kept as parts of one purpose each and sent as one text.

The library never imports the parts. :func:`bootstrap_text` joins their source, in the order of :data:`PARTS`,
into the one program that each sandboxed interpreter runs with ``python -c`` (plus the call that starts it, see
:func:`skyrl_gym.sandbox.worker.bootstrap_source`). So the program is self-contained: it imports nothing of
skyrl_gym, and the parts share one namespace at run time, where each calls the others' functions by name. For
the type checker, a part imports those names from the other parts under ``TYPE_CHECKING``, a name the part sets
to False, so the import never runs.

The parts, in order:

- ``serve``: what the interpreter does from start to end of a job (``_serve`` takes it, ``_run_job`` runs it),
  and the protocols it speaks with the library. First, because its first statement captures the namespace the
  snippet starts with, before any other name of the program exists.
- ``kernel``: kernel calls without ctypes: no_new_privs, private IPC namespaces, removal of a uid's IPC objects.
- ``cleanup``: what a job leaves behind: killing its processes, emptying private directories, finding IPC objects.
- ``batch_parent``: a batch, one program run against several standard inputs (``_run_batch``).
- ``server_loop``: the fork server (``_fork_server``): one forked child per job, the sandbox restored after each.
- ``finish``: the end of a run in a forked process (``_finish``), the interpreter's shutdown as a snippet sees it.

Only ``serve`` must come first; the others only define functions and constants, which are looked up when called.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Final

__all__ = ["PARTS", "bootstrap_text"]

PARTS: Final = ("serve", "kernel", "cleanup", "batch_parent", "server_loop", "finish")


@functools.cache
def bootstrap_text() -> str:
    """The bootstrap program: the parts' source joined in the order of :data:`PARTS`; read once per process."""
    directory = Path(__file__).parent
    return "\n\n".join((directory / f"{part}.py").read_text(encoding="utf-8") for part in PARTS)
