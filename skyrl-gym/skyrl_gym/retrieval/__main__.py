"""``python -m skyrl_gym.retrieval {build,serve} ...``: the retrieval commands without the ``skyrl-gym`` script.

``build`` is ``skyrl-gym build-index`` and ``serve`` is ``skyrl-gym serve-retriever``; ``--help`` after either
lists its options.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from skyrl_gym.retrieval.cli import build_index_main, serve_main

_COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "build": build_index_main,
    "build-index": build_index_main,
    "serve": serve_main,
    "serve-retriever": serve_main,
}

_USAGE = "usage: python -m skyrl_gym.retrieval {build,serve} [options]   (add --help after a command for its options)"


def main(argv: Sequence[str]) -> int:
    """Dispatch ``argv[0]`` (``build`` or ``serve``) to its entry point with the remaining arguments."""
    if not argv or argv[0] not in _COMMANDS:
        print(_USAGE, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return _COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
