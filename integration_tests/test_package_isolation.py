"""Each package installs alone into a fresh virtual environment and imports; gym and agent need no torch.

PyPI serves unrelated packages under the names ``skyrl-gym`` and ``skyrl-train``, so local packages that
depend on each other are installed in one pip command, and the tests check that what got imported is ours.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import importlib, importlib.util, json, sys
names = sys.argv[1].split(",")
mods = {n: importlib.import_module(n) for n in names}
print(json.dumps({
    "versions": {n: m.__version__ for n, m in mods.items()},
    "files": {n: m.__file__ for n, m in mods.items()},
    "torch": importlib.util.find_spec("torch") is not None,
    "loaded_torch": "torch" in sys.modules,
}))
"""


def _fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin" / "python"


def _install_and_probe(tmp_path: Path, packages: list[str], modules: list[str], *extra: str) -> dict[str, object]:
    import json

    python = _fresh_venv(tmp_path / "venv")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *extra, *(str(REPO / p) for p in packages)],
        check=True,
        cwd=tmp_path,
    )
    out = subprocess.run(
        [str(python), "-c", PROBE, ",".join(modules)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    files = result["files"]
    assert isinstance(files, dict)
    for name, file in files.items():
        assert str(tmp_path / "venv") in file, f"{name} was imported from {file}, not from the fresh venv"
    assert result["versions"] == dict.fromkeys(modules, "0.1.0"), "a package from PyPI replaced ours"
    return result


@pytest.mark.slow
def test_skyrl_gym_installs_alone_without_torch(tmp_path: Path) -> None:
    result = _install_and_probe(tmp_path, ["skyrl-gym"], ["skyrl_gym"])
    assert result["torch"] is False


@pytest.mark.slow
def test_skyrl_agent_installs_without_torch(tmp_path: Path) -> None:
    result = _install_and_probe(tmp_path, ["skyrl-gym", "skyrl-agent"], ["skyrl_agent", "skyrl_gym"])
    assert result["torch"] is False


@pytest.mark.slow
def test_skyrl_train_installs_with_its_dependencies(tmp_path: Path) -> None:
    constraints = str(REPO / "constraints" / "cpu.txt")
    result = _install_and_probe(tmp_path, ["skyrl-gym", "skyrl-train"], ["skyrl_train", "skyrl_gym"], "-c", constraints)
    assert result["torch"] is True


def test_development_environment_uses_the_repository_packages() -> None:
    import skyrl_agent
    import skyrl_gym
    import skyrl_train

    for module in (skyrl_gym, skyrl_train, skyrl_agent):
        assert module.__file__ is not None
        assert Path(module.__file__).resolve().is_relative_to(REPO), f"{module.__name__} is not the repository's"
        assert module.__version__ == "0.1.0"
    assert sys.prefix != sys.base_prefix, "tests are meant to run inside the project's virtual environment"
