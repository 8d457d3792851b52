"""The ``skyrl-agent`` command line."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

from skyrl_agent.sandbox import image
from skyrl_agent.sandbox.base import SandboxError


def _image_build(args: argparse.Namespace) -> int:
    recipe = image.ImageRecipe(tag=args.tag)
    if not args.force and image.is_current(recipe):
        print(f"{recipe.tag} is up to date (recipe {recipe.digest()})")
        return 0
    print(f"building {recipe.tag} from Debian {recipe.suite} via {image.debian_mirror()} …", flush=True)
    start = time.monotonic()
    image.build_image(recipe)
    print(f"built {recipe.tag} (recipe {recipe.digest()}) in {time.monotonic() - start:.0f} s")
    return 0


def _image_status(args: argparse.Namespace) -> int:
    recipe = image.ImageRecipe(tag=args.tag)
    found = image.image_recipe_of(recipe.tag)
    if found is None:
        print(f"{recipe.tag}: missing; run `skyrl-agent image build`")
        return 1
    state = "up to date" if found == recipe.digest() else f"stale (recipe {found}, expected {recipe.digest()})"
    print(f"{recipe.tag}: {state}")
    return 0 if found == recipe.digest() else 1


def _reap(args: argparse.Namespace) -> int:
    from skyrl_agent.sandbox import reaper
    from skyrl_agent.sandbox.base import SandboxUnavailableError

    try:
        report = reaper.reap(args.run, dead_only=not args.all)
    except SandboxUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"removed {len(report.containers)} containers and {len(report.images)} images")
    return 0


def _tasks_validate(args: argparse.Namespace) -> int:
    import asyncio

    from skyrl_agent.tasks import SUITE_PATH, load_tasks, save_tasks
    from skyrl_agent.tasks.validate import format_table, make_backend, validate_tasks, with_reference_times

    path = Path(args.tasks) if args.tasks else SUITE_PATH
    tasks = load_tasks(path)
    reports = asyncio.run(validate_tasks(tasks, make_backend(args.backend), concurrency=args.jobs))
    print(format_table(reports))
    if args.record:
        save_tasks(with_reference_times(tasks, reports), path)
        print(f"recorded the gold test-run times of {sum(r.ok for r in reports)} valid tasks as reference_s in {path}")
    return 0 if all(report.ok for report in reports) else 1


def _tasks_build_real(args: argparse.Namespace) -> int:
    from skyrl_agent.tasks.real.build import BuildError, build_suite

    packages = [name.strip() for name in args.packages.split(",") if name.strip()] if args.packages else None
    try:
        build_suite(Path(args.out), cache_dir=Path(args.cache) if args.cache else None, packages=packages)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _tasks_export_dataset(args: argparse.Namespace) -> int:
    from skyrl_agent.integrations.train_factory import export_dataset

    if args.max_turns < 1:
        print(f"error: --max-turns must be at least 1 (got {args.max_turns})", file=sys.stderr)
        return 2
    count = export_dataset(args.out, tasks_path=args.tasks, max_turns=args.max_turns)
    print(f"wrote {count} prompt rows (env_class swe) to {args.out}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from skyrl_agent import run
    from skyrl_agent.sandbox import reaper
    from skyrl_agent.tasks import SUITE_PATH, load_tasks

    if args.concurrency < 1 or args.samples < 1 or args.max_turns < 1:
        raise ValueError("--concurrency, --samples and --max-turns must be at least 1")
    if args.ray_address is not None:
        if args.backend != "ray":
            raise ValueError("--ray-address needs --backend ray")
        os.environ["RAY_ADDRESS"] = args.ray_address  # what the ray backend joins when Ray is not yet initialised
    if args.harness is None:
        run.make_llm(args.model)  # reject a bad --model before starting anything
    else:
        from skyrl_agent.integrations.serving import check_model, make_harness

        check_model(args.model)
        make_harness(args.harness)
    options = run.RunOptions(
        model=args.model,
        out=Path(args.out),
        concurrency=args.concurrency,
        samples=args.samples,
        max_turns=args.max_turns,
        served_model=args.served_model,
        run_id=args.run_id or reaper.default_run_id(),
        harness=args.harness,
    )
    return run.main(load_tasks(args.tasks or SUITE_PATH), args.backend, options)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``skyrl-agent``."""
    parser = argparse.ArgumentParser(prog="skyrl-agent", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_image_commands(commands)
    reap = commands.add_parser("reap", help="remove leaked sandbox containers and snapshot images")
    reap.add_argument("--run", default=None, help="only this run id (default: every run)")
    reap.add_argument("--all", action="store_true", help="also remove those of runs that are still alive")
    reap.set_defaults(func=_reap)
    _add_tasks_commands(commands)
    _add_run_command(commands)
    return parser


_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # what add_subparsers returns


def _add_image_commands(commands: _Commands) -> None:
    """``image build`` and ``image status``."""
    image_parser = commands.add_parser("image", help="build and inspect sandbox images")
    image_commands = image_parser.add_subparsers(dest="image_command", required=True)
    build = image_commands.add_parser("build", help="build the base image (skipped when up to date)")
    build.add_argument("--tag", default=image.BASE_IMAGE, help="image tag (default: %(default)s)")
    build.add_argument("--force", action="store_true", help="rebuild even when the image is up to date")
    build.set_defaults(func=_image_build)
    status = image_commands.add_parser("status", help="say whether the base image exists and is current")
    status.add_argument("--tag", default=image.BASE_IMAGE, help="image tag (default: %(default)s)")
    status.set_defaults(func=_image_status)


def _add_tasks_commands(commands: _Commands) -> None:
    """``tasks validate``, ``tasks build-real`` and ``tasks export-dataset``."""
    tasks_parser = commands.add_parser("tasks", help="check SWE-style task files")
    tasks_commands = tasks_parser.add_subparsers(dest="tasks_command", required=True)
    validate = tasks_commands.add_parser("validate", help="check that base fails and gold passes for every task")
    validate.add_argument("--tasks", help="a .jsonl/.json task file (default: the shipped suite)")
    validate.add_argument("--backend", choices=["docker", "local", "process"], default="docker")
    validate.add_argument("--jobs", type=int, default=4, help="tasks validated at once (default: %(default)s)")
    validate.add_argument(
        "--record",
        action="store_true",
        help="write each valid task's gold test-run time into the task file as reference_s (the limit of a retry)",
    )
    validate.set_defaults(func=_tasks_validate)
    build_real = tasks_commands.add_parser("build-real", help="build the suite of bugs injected into PyPI packages")
    build_real.add_argument("--out", required=True, help="directory for tasks.jsonl and the task repositories")
    build_real.add_argument("--cache", help="directory of downloaded sdists (default: OUT/sdists)")
    build_real.add_argument("--packages", help="comma-separated packages to build (default: all in the recipe)")
    build_real.set_defaults(func=_tasks_build_real)
    export = tasks_commands.add_parser(
        "export-dataset", help="write a skyrl-train prompt dataset (JSON lines) with one row per task"
    )
    export.add_argument("out", help="the .jsonl file to write (e.g. data/swe/train.jsonl)")
    export.add_argument("--tasks", help="a .jsonl/.json task file (default: the shipped suite)")
    export.add_argument(
        "--max-turns", type=int, default=30, help="the turn limit the prompts mention (default: %(default)s)"
    )
    export.set_defaults(func=_tasks_export_dataset)


def _add_run_command(commands: _Commands) -> None:
    """``run``: episodes on tasks, graded, their trajectories saved."""
    run = commands.add_parser("run", help="run agent episodes on tasks, grade them and save the trajectories")
    run.add_argument("--tasks", help="a .jsonl/.json task file (default: the shipped suite)")
    run.add_argument(
        "--model", required=True, help="scripted:oracle|null|latency-oracle, or an OpenAI-compatible base URL"
    )
    run.add_argument("--served-model", default="default", help="model name sent to the server (default: %(default)s)")
    run.add_argument("--concurrency", type=int, default=4, help="episodes at once (default: %(default)s)")
    run.add_argument("--out", required=True, help="directory for trajectories.jsonl and summary.json")
    run.add_argument(
        "--backend",
        choices=["docker", "local", "process", "ray"],
        default="docker",
        help="where sandboxes run; ray: Docker sandboxes on the cluster's nodes that offer the resource sandbox_host",
    )
    run.add_argument(
        "--ray-address", default=None, help="with --backend ray: the Ray cluster to join (default: a new local one)"
    )
    run.add_argument("--samples", type=int, default=1, help="episodes per task (default: %(default)s)")
    run.add_argument("--max-turns", type=int, default=30, help="LLM calls per episode at most (default: %(default)s)")
    run.add_argument("--run-id", default=None, help="labels this run's sandboxes (default: host-pid-random)")
    run.add_argument(
        "--harness",
        default=None,
        help="run an unmodified agent program instead of the built-in ReAct agent: mini-swe-agent "
        "(--model scripted:oracle records through the gateway; an http(s) URL is served as is)",
    )
    run.set_defaults(func=_run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (image.ImageBuildError, ValueError, SandboxError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
