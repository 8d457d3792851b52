from __future__ import annotations

import ast
import sys
from pathlib import Path

import skyrl_train.algorithms

ALLOWED = {"torch", "numpy", "skyrl_train", "__future__"} | set(sys.stdlib_module_names)


def test_algorithms_import_only_torch_numpy_and_the_standard_library() -> None:
    package = Path(skyrl_train.algorithms.__file__).parent
    imported: dict[str, str] = {}
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update({alias.name.split(".")[0]: path.name for alias in node.names})
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported[node.module.split(".")[0]] = path.name
    assert {name: file for name, file in imported.items() if name not in ALLOWED} == {}
