from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyrl_gym import cli, deregister, register
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class EchoEnv(BaseTextEnv):
    """Ends after one step with reward 1.0 when the action is 'yes'."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        return BaseTextEnvStepOutput(observations=[], reward=float(action == "yes"), done=True, metadata={})


class BrokenEnv(EchoEnv):
    def step(self, action: str) -> BaseTextEnvStepOutput:
        raise RuntimeError("boom")


@pytest.fixture
def test_envs() -> Iterator[None]:
    register("cli-echo", entry_point=EchoEnv)
    register("cli-broken", entry_point=BrokenEnv)
    yield
    deregister("cli-echo")
    deregister("cli-broken")


def test_list_shows_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "gsm8k  " in out
    assert "skyrl_gym.envs.sql.env:SQLEnv" in out


def test_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows["lcb"] == "skyrl_gym.envs.lcb.env:LCBEnv"


def test_check_passes_and_fails(test_envs: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "cli-echo"]) == 0
    assert "checks passed" in capsys.readouterr().out
    assert cli.main(["check", "cli-broken"]) == 1
    assert "FAILED" in capsys.readouterr().err


def test_unknown_id_names_the_registered_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "gsm9k"]) == 2
    err = capsys.readouterr().err
    assert "No registered env with id: gsm9k" in err
    assert "gsm8k" in err


def test_module_entry_point_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "skyrl_gym", "list"], capture_output=True, text=True, check=True)
    assert "searchcode" in proc.stdout


def test_build_index_is_forwarded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["build-index", "--index", str(tmp_path / "idx")]) == 0
    assert (tmp_path / "idx" / "meta.json").exists()
    assert "Indexed" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve-retriever", "--index", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    assert "build-index" in capsys.readouterr().err
