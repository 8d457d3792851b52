"""The ``skyrl-train`` command line: ``skyrl-train [--config run.yaml] [section.key=value ...]``.

Every key of :mod:`skyrl_train.config` can be set on the command line; unknown keys fail with a suggestion and
the resolved config is printed and saved in the run directory before any model is loaded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from skyrl_train.config import ConfigError, load_config
from skyrl_train.data.dataset import DatasetError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``skyrl-train``."""
    parser = argparse.ArgumentParser(
        prog="skyrl-train",
        description="Train an LLM policy with RL on skyrl-gym environments.",
        epilog="example: skyrl-train --config examples/gsm8k.yaml trainer.train_batch_size=32 optim.lr=1e-5",
    )
    parser.add_argument("--config", type=Path, help="YAML file with the run config (sections of skyrl_train.config)")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides, applied after the file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        from skyrl_train.run import run

        result = run(config)
    except (ConfigError, DatasetError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"done: {result.global_step} steps in {result.wall_seconds:.0f} s; run directory {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
