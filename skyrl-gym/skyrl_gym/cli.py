"""The ``skyrl-gym`` command line: inspect and check environments.

Commands: ``list`` (registered ids and entry points), ``check ID`` (run :func:`skyrl_gym.checker.check_env`),
``make-dataset`` (write the offline demo datasets of :mod:`skyrl_gym.datasets`), ``build-index`` and
``serve-retriever`` (the BM25 retrieval service of :mod:`skyrl_gym.retrieval`; their own ``--help`` lists options).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import skyrl_gym
from skyrl_gym import error
from skyrl_gym.envs.registration import registry

Command = Callable[[argparse.Namespace], int]


def _list(args: argparse.Namespace) -> int:
    if args.json:
        rows = {env_id: str(spec.entry_point) for env_id, spec in sorted(registry.items())}
        print(json.dumps(rows, indent=2))
        return 0
    width = max((len(env_id) for env_id in registry), default=0)
    for env_id, spec in sorted(registry.items()):
        print(f"{env_id:<{width}}  {spec.entry_point}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from skyrl_gym.checker import check_env

    extras = json.loads(args.extras) if args.extras else None
    try:
        passed = check_env(args.env_id, extras=extras, check_hostile_actions=not args.no_hostile)
    except error.EnvContractError as exc:
        print(f"{args.env_id}: FAILED {exc}", file=sys.stderr)
        return 1
    print(f"{args.env_id}: {len(passed)} checks passed ({', '.join(passed)})")
    return 0


def _make_dataset(args: argparse.Namespace) -> int:
    from skyrl_gym import datasets

    env_ids = sorted(datasets.BUILDERS) if args.env == ["all"] else args.env
    for env_id in env_ids:
        for split, size in (("train", args.train_size), ("test", args.test_size)):
            rows = datasets.make_demo_dataset(env_id, size, seed=args.seed, split=split)
            paths = datasets.write_dataset(rows, args.out / env_id / split, args.format)
            print(f"{env_id}/{split}: {len(rows)} rows -> {', '.join(str(p) for p in paths)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``skyrl-gym``."""
    parser = argparse.ArgumentParser(prog="skyrl-gym", description="Inspect and check skyrl-gym environments.")
    parser.add_argument("--version", action="version", version=f"skyrl-gym {skyrl_gym.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="list the registered environments")
    listing.add_argument("--json", action="store_true", help="print a JSON object id -> entry point")
    listing.set_defaults(func=_list)

    check = commands.add_parser("check", help="run the env contract checks on a registered environment")
    check.add_argument("env_id", help="a registered id (see `skyrl-gym list`)")
    check.add_argument("--extras", help="JSON object passed as the env's extras (default: the env's own sample)")
    check.add_argument("--no-hostile", action="store_true", help="skip the malformed-action checks")
    check.set_defaults(func=_check)

    data = commands.add_parser("make-dataset", help="write small offline demo datasets (JSONL and Parquet)")
    data.add_argument("--env", nargs="+", default=["all"], help="env ids, or 'all' (default)")
    data.add_argument("--out", type=Path, default=Path("data/demo"), help="output directory (default: %(default)s)")
    data.add_argument("--train-size", type=int, default=64)
    data.add_argument("--test-size", type=int, default=16)
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--format", nargs="+", default=["jsonl", "parquet"], choices=["jsonl", "parquet"])
    data.set_defaults(func=_make_dataset)

    commands.add_parser("build-index", help="build a BM25 index from a JSONL corpus (see build-index --help)")
    commands.add_parser("serve-retriever", help="serve a BM25 index over HTTP (see serve-retriever --help)")
    return parser


# Commands with their own argument parsers, forwarded the rest of the command line.
FORWARDED = {
    "build-index": ("skyrl_gym.retrieval.cli", "build_index_main"),
    "serve-retriever": ("skyrl_gym.retrieval.cli", "serve_main"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FORWARDED:
        import importlib

        module, name = FORWARDED[argv[0]]
        forwarded: Callable[[list[str]], int] = getattr(importlib.import_module(module), name)
        return forwarded(argv[1:])
    args = build_parser().parse_args(argv)
    func: Command = args.func
    try:
        return func(args)
    except (error.Error, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
