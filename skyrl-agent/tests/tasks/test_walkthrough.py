"""The "Writing a task" walkthrough of docs/agent/tasks.md runs as written, start to finish."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "agent" / "tasks.md"

pytestmark = [pytest.mark.docker, pytest.mark.slow]  # the walkthrough validates and runs in Docker too


def _walkthrough() -> str:
    text = DOC.read_text()
    section = text[text.index("## Writing a task") : text.index("## `SWEEnv`")]
    return "\n".join(re.findall(r"```bash\n(.*?)```", section, re.S))


def test_writing_a_task_walkthrough(tmp_path: Path) -> None:
    # The commands call `skyrl-agent` and `python3` by name: put this interpreter's scripts first on PATH.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    script = "set -euo pipefail\n" + _walkthrough()
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1/1 tasks valid" in proc.stdout
    assert "resolved {'tests/test_shorten.py::test_cut_text_fits_the_width': True}" in proc.stdout
    runs = tmp_path / "my-tasks" / "runs"
    resolved = {name: json.loads((runs / name / "summary.json").read_text())["resolved"] for name in os.listdir(runs)}
    assert resolved == {"oracle": 1, "null": 0, "oracle-docker": 1}
