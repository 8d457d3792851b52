"""Every command of ``docs/train/examples.md`` runs as written, in a directory set up as the page says.

The page's commands are read from its ``bash`` block and run in a fresh directory: the quickstart (its ``--smoke``
version, which writes the same tiny model and tokenizer files to ``runs/quickstart/sft-model``; only the SFT
weights differ), ``skyrl-gym make-dataset``, the retrieval service on the documented port, then each
``skyrl-train --config …`` line with nothing added but ``trainer.max_training_steps`` (CI time: two steps run a
whole cycle, rollout → update → weight sync → the next rollout on the new weights).
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyrl_gym import cli as gym_cli
from skyrl_train import quickstart
from skyrl_train.cli import build_parser
from skyrl_train.config import load_config
from skyrl_train.run import run

REPO = Path(__file__).resolve().parents[2]
EXAMPLES_PAGE = REPO / "docs" / "train" / "examples.md"
EXAMPLES = REPO / "skyrl-train" / "examples"
STEPS = "trainer.max_training_steps=2"  # the one override: CI time (see the module docstring)
FAILED_STOPS = ("timeout", "engine_error", "env_error")  # a trajectory that ended like this did not run as meant
CPU_EXAMPLES = ["gsm8k_multi_turn", "text2sql", "search", "lcb"]  # run here
RUN_ELSEWHERE = {  # needs vLLM and Ray; needs Docker
    "distributed": "tests/test_distributed_example.py",
    "swe_react": "integration_tests/test_swe_train_cli.py",
    "swe_mini_swe_agent": "integration_tests/test_swe_train_cli.py",
}

pytestmark = pytest.mark.slow


def documented_commands(prefix: str) -> list[list[str]]:
    """The argument lists of the page's ``bash`` lines that start with ``prefix`` (comments and ``&`` removed)."""
    text = EXAMPLES_PAGE.read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```bash\n")[1:]]
    lines = [line.split("#", 1)[0].strip().removesuffix("&").strip() for block in blocks for line in block.split("\n")]
    return [shlex.split(line) for line in lines if line.startswith(prefix + " ")]


def example_commands() -> dict[str, list[str]]:
    """``example name → the arguments of its documented skyrl-train command``."""
    commands = {}
    for argv in documented_commands("skyrl-train"):
        config = build_parser().parse_args(argv[1:]).config
        commands[Path(config).stem] = argv[1:]
    return commands


def test_every_example_config_has_a_documented_command() -> None:
    documented = example_commands()
    assert sorted(documented) == sorted(path.stem for path in EXAMPLES.glob("*.yaml"))
    assert sorted(documented) == sorted([*CPU_EXAMPLES, *RUN_ELSEWHERE]), "a new example needs a test that runs it"
    for argv in documented.values():
        assert (REPO / build_parser().parse_args(argv).config).is_file(), argv  # paths are relative to the clone


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory after the page's setup: the quickstart's model and the demo data."""
    root = tmp_path_factory.mktemp("fresh-clone")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert quickstart.main(["--smoke"]) == 0
        for argv in documented_commands("skyrl-gym make-dataset"):
            assert gym_cli.main(argv[1:]) == 0
    return root


@pytest.fixture(scope="module")
def retriever() -> Iterator[subprocess.Popen[str]]:
    """The page's ``skyrl-gym serve-retriever`` command, running from the first line it prints until the end."""
    (argv,) = documented_commands("skyrl-gym serve-retriever")
    command = [sys.executable, "-m", "skyrl_gym.cli", *argv[1:]]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        first_line = process.stdout.readline()  # printed once it accepts requests, or an error (a port in use)
        if not first_line.startswith("Serving"):
            pytest.fail(f"{shlex.join(argv)} did not start: {first_line}{process.stdout.read()}")
        yield process
        assert process.poll() is None, "the retrieval service died during the examples"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("name", CPU_EXAMPLES)
def test_example_runs_as_documented(
    name: str,
    checkout: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if name == "search":
        request.getfixturevalue("retriever")  # only this example needs the service (and its port)
    monkeypatch.chdir(checkout)
    args = build_parser().parse_args(example_commands()[name])
    config = load_config(REPO / args.config, [*args.overrides, STEPS])
    with caplog.at_level(logging.WARNING, logger="skyrl_train.data.dataset"):
        result = run(config, echo_config=False)
    dropped = [record.getMessage() for record in caplog.records if record.name == "skyrl_train.data.dataset"]
    assert not dropped, f"the example's data.max_prompt_length drops demo prompts: {dropped}"
    assert result.global_step == 2
    assert [step for step, _ in result.eval_history] == [0, 2]
    assert result.run_dir == Path("runs") / name
    assert (checkout / result.run_dir / "metrics.png").is_file()
    lines = [json.loads(line) for line in (checkout / result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/mean" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        failed = {reason: line[f"generate/stop_reason/{reason}"] for reason in FAILED_STOPS}
        assert not any(failed.values()), f"step {line['step']}: trajectories failed {failed}"
