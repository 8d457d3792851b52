"""The bootstrap: its parts join into one self-contained program, which runs the snippet as documented."""

from __future__ import annotations

import ast
import builtins
import dis
import subprocess
import types
from pathlib import Path

import pytest

from skyrl_gym.sandbox import CodeExecutor, bootstrap
from skyrl_gym.sandbox.bootstrap import PARTS, bootstrap_text

PART_DIR = Path(bootstrap.__file__).parent
MAX_ARG_STRLEN = 32 * 4096  # Linux's limit on one argv string: the program travels as `python -c TEXT`


def test_every_part_file_is_listed() -> None:
    files = {path.stem for path in PART_DIR.glob("*.py")} - {"__init__"}
    assert files == set(PARTS)
    assert PARTS[0] == "serve"


def test_program_starts_with_the_snapshot_and_has_no_docstring() -> None:
    tree = ast.parse(bootstrap_text())
    assert ast.get_docstring(tree) is None
    assert ast.unparse(tree.body[0]) == "_pristine = dict(globals())"


def test_program_fits_in_one_argument() -> None:
    assert len(bootstrap_text().encode()) < MAX_ARG_STRLEN


@pytest.mark.parametrize("part", PARTS)
def test_parts_import_the_library_only_for_the_type_checker(part: str) -> None:
    tree = ast.parse((PART_DIR / f"{part}.py").read_text(encoding="utf-8"))
    guarded = {
        id(node)
        for block in tree.body
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("skyrl_gym"):
            assert id(node) in guarded, f"{part}.py line {node.lineno} imports skyrl_gym at run time"


def test_every_global_a_function_uses_is_defined() -> None:
    # Defining the program's functions runs nothing else: only _serve(...), appended by the library, starts it.
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(bootstrap_text(), "<string>", "exec"), namespace)
    assert namespace["TYPE_CHECKING"] is False
    missing = {
        (function.__name__, name)
        for function in namespace.values()
        if isinstance(function, types.FunctionType)
        for name in _globals_used(function.__code__)
        if name not in namespace and not hasattr(builtins, name)
    }
    assert not missing


def _globals_used(code: types.CodeType) -> set[str]:
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_used(const)
    return names


def test_snippet_runs_two_bootstrap_frames_up(launcher_shared_executor: CodeExecutor) -> None:
    # The documented difference from python -c: two bootstrap frames below the snippet's <module> (the recursion
    # limit is raised to make up for them; test_python_c_fidelity checks where RecursionError strikes).
    code = "import traceback\nprint(len(traceback.extract_stack()))"
    reference = subprocess.run(
        [launcher_shared_executor.python, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert int(launcher_shared_executor.run(code).stdout) == int(reference.stdout) + 2
