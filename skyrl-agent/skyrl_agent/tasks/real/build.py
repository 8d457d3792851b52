"""Turn the recipe into a task suite: download the sdists, inject the bugs, and measure the tests with the grader.

Nothing here trusts the recipe's own word on the tests: every task is graded twice (the buggy repository, then
with the gold patch) by :func:`skyrl_agent.tasks.grade`, PASS_TO_PASS is what passed both times, and the recipe's
FAIL_TO_PASS must be exactly what failed first and passed second. A recipe that drifts from its sdists (a release
re-uploaded, an edit that no longer applies, a bug that breaks other tests) therefore fails the build, naming the
task, instead of producing a task that grades wrongly.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from skyrl_agent.sandbox.base import SandboxBackend
from skyrl_agent.tasks.format import SWETask, save_tasks
from skyrl_agent.tasks.grading import PASSING, GradeResult, grade
from skyrl_agent.tasks.policy import is_protected
from skyrl_agent.tasks.real import Edit, PackageSpec, Recipe, RecipeError, Sdist, TaskSpec, load_recipe

_SKIPPED_PARTS = frozenset({"__pycache__", ".git", ".pytest_cache", ".mypy_cache"})
_LISTED = 10  # node ids quoted in an error message before "… and N more"


class BuildError(RuntimeError):
    """The suite could not be built: a download, a hash, an archive or a grading went wrong (the message says which)."""


class SdistHashError(BuildError):
    """A downloaded or cached sdist is not the file the recipe pins."""


class UnsafeArchiveError(BuildError):
    """An sdist has a member that would land outside the extraction directory."""


@dataclass(frozen=True)
class Measured:
    """What the two gradings of a task say: FAIL_TO_PASS and PASS_TO_PASS as measured, and the tests counted."""

    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    tests: int
    failing_on_gold: tuple[str, ...]


def build_suite(
    out_dir: Path,
    *,
    cache_dir: Path | None = None,
    packages: Sequence[str] | None = None,
    backend: SandboxBackend | None = None,
    recipe: Recipe | None = None,
) -> Path:
    """Build the tasks of ``packages`` (default: all) into ``out_dir`` and return the ``tasks.jsonl`` written.

    ``out_dir/repos/<task id>`` holds each task's buggy repository; ``out_dir/repos`` is rewritten from scratch, so
    running twice with the same recipe gives the same files. Sdists are kept in ``cache_dir`` (default
    ``out_dir/sdists``) and downloaded only when missing or not matching their pinned sha256. ``backend`` grades
    the tasks (default: Docker); ``recipe`` defaults to the shipped one.
    """
    recipe = recipe or load_recipe()
    selected = select_packages(recipe, packages)
    out_dir = Path(out_dir)
    cache = Path(cache_dir) if cache_dir is not None else out_dir / "sdists"
    repos = out_dir / "repos"
    shutil.rmtree(repos, ignore_errors=True)
    repos.mkdir(parents=True)
    tasks = asyncio.run(_build_all(recipe, selected, cache, repos, backend))
    path = out_dir / "tasks.jsonl"
    save_tasks(tasks, path)
    print(f"wrote {len(tasks)} tasks to {path}", flush=True)
    return path


async def _build_all(
    recipe: Recipe, packages: Sequence[PackageSpec], cache: Path, repos: Path, backend: SandboxBackend | None
) -> list[SWETask]:
    """Every task of ``packages``, one after the other: in one event loop, so the grader's limits hold for all."""
    own_backend = backend is None
    if backend is None:
        from skyrl_agent.tasks.validate import make_backend

        backend = make_backend("docker")
    tasks = []
    try:
        for package in packages:
            released = released_files(package, cache)
            for spec in recipe.tasks:
                if spec.package == package.name:
                    tasks.append(await build_task(recipe, spec, released, repos, backend))
    finally:
        if own_backend:
            await backend.close()
    return tasks


def select_packages(recipe: Recipe, names: Sequence[str] | None) -> list[PackageSpec]:
    """The recipe's packages named in ``names`` (all when ``None``), in recipe order; unknown names are an error."""
    if names is None:
        return list(recipe.packages.values())
    unknown = sorted(set(names) - set(recipe.packages))
    if unknown:
        raise RecipeError(f"unknown package(s) {', '.join(unknown)}; the recipe has {', '.join(recipe.packages)}")
    return [package for name, package in recipe.packages.items() if name in names]


# --- sdists -------------------------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, *, what: str) -> None:
    """Refuse a file whose sha256 is not ``expected``: a different file must never become a task."""
    actual = sha256_of(path)
    if actual != expected:
        raise SdistHashError(
            f"{what}: {path.name} has sha256 {actual}, but the recipe pins {expected}; "
            "the release on the index is not the one the recipe was written for"
        )


def fetch_sdist(sdist: Sdist, cache_dir: Path) -> Path:
    """The sdist's archive in ``cache_dir``, downloaded with pip unless a copy with the pinned hash is there."""
    target = cache_dir / f"{sdist.name}-{sdist.version}.tar.gz"
    if target.is_file() and sha256_of(target) == sdist.sha256:
        print(f"sdist {sdist.requirement}: cached ({target})", flush=True)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
        downloaded = pip_download(sdist.requirement, Path(tmp))
        check_sha256(downloaded, sdist.sha256, what=sdist.requirement)
        os.replace(downloaded, target)
    print(f"sdist {sdist.requirement}: downloaded {target.stat().st_size} bytes ({target})", flush=True)
    return target


def pip_download(requirement: str, dest: Path) -> Path:
    """Download the sdist of ``requirement`` (never a wheel) into the empty directory ``dest``."""
    argv = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", requirement, "-d", str(dest)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"pip could not download {requirement}: {(proc.stderr or proc.stdout)[-1500:]}")
    archives = sorted(path for path in dest.iterdir() if path.name.endswith(".tar.gz"))
    if len(archives) != 1:
        found = ", ".join(path.name for path in dest.iterdir()) or "nothing"
        raise BuildError(f"pip download {requirement} gave {found}, expected one .tar.gz sdist")
    return archives[0]


def safe_extract(archive: Path, target: Path) -> Path:
    """Extract a tar sdist into ``target`` and return its single top-level directory.

    Every member is checked first, so a malicious or broken archive (``../`` paths, absolute paths, links leading
    out) is refused as a whole, before anything is written; ``filter="data"`` then also drops special files and
    unsafe permission bits.
    """
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for member in members:
            check_member(member, target, archive=archive.name)
        tar.extractall(target, filter="data")
    tops = {PurePosixPath(member.name).parts[0] for member in members if member.name.strip("/")}
    if len(tops) != 1 or not (target / next(iter(tops))).is_dir():
        raise BuildError(f"{archive.name}: expected one top-level directory, found {sorted(tops)}")
    return target / tops.pop()


def check_member(member: tarfile.TarInfo, target: Path, *, archive: str = "archive") -> None:
    """Refuse a tar member (or the target of a link member) that resolves outside ``target``."""
    root = target.resolve()
    names = [member.name]
    if member.issym():
        names.append(str(PurePosixPath(member.name).parent / member.linkname))
    elif member.islnk():
        names.append(member.linkname)
    for name in names:
        pure = PurePosixPath(name)
        if pure.is_absolute() or ".." in pure.parts or not (root / name).resolve().is_relative_to(root):
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} would be written outside {target}")


def collect_files(root: Path, files: Mapping[str, str], *, where: str) -> dict[str, bytes]:
    """Repository path → content for the recipe's ``files`` mapping (sdist file or directory → repository path)."""
    collected: dict[str, bytes] = {}
    for source, dest in files.items():
        path = root / source
        if path.is_file():
            collected[dest] = path.read_bytes()
        elif path.is_dir():
            for item in sorted(path.rglob("*")):
                rel = item.relative_to(path)
                if item.is_file() and not _SKIPPED_PARTS.intersection(rel.parts) and item.suffix != ".pyc":
                    collected[(PurePosixPath(dest) / rel.as_posix()).as_posix()] = item.read_bytes()
        else:
            raise RecipeError(f"{where}: {source!r} is not in the sdist")
    return collected


def released_files(package: PackageSpec, cache_dir: Path) -> dict[str, bytes]:
    """The released repository of ``package`` (its test dependencies' files included), path → content."""
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="skyrl-sdist-") as tmp:
        for sdist in (package.sdist, *package.test_deps):
            root = safe_extract(fetch_sdist(sdist, cache_dir), Path(tmp) / sdist.name)
            files.update(collect_files(root, sdist.files, where=f"package {package.name!r} ({sdist.requirement})"))
    missing = [path for path in package.hidden_tests if path not in files]
    if missing:
        raise RecipeError(f"package {package.name!r}: hidden tests not among its files: {', '.join(missing)}")
    return files


# --- bugs and patches ---------------------------------------------------------------------------------------------


def apply_edits(files: Mapping[str, str], edits: Iterable[Edit], *, task_id: str) -> dict[str, str]:
    """The files the edits change, path → buggy text; each ``old`` must occur exactly once where it is applied.

    Once, because a replacement that matches twice (or not at all, after a new release) would inject a different
    bug from the one the issue text and FAIL_TO_PASS describe.
    """
    changed: dict[str, str] = {}
    for edit in edits:
        if edit.path not in files:
            raise RecipeError(f"task {task_id!r}: bug edits {edit.path!r}, which is not in the repository")
        text = changed.get(edit.path, files[edit.path])
        count = text.count(edit.old)
        if count != 1:
            raise RecipeError(
                f"task {task_id!r}: in {edit.path}, 'old' must occur exactly once but occurs {count} times: "
                f"{edit.old[:80]!r}"
            )
        changed[edit.path] = text.replace(edit.old, edit.new)
    return changed


def unified_patch(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """A ``git apply``-able diff turning ``before`` into ``after`` (both path → text, same paths)."""
    chunks = []
    for path in sorted(before):
        old, new = before[path], after[path]
        if old == new:
            continue
        lines = difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
        body = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        chunks.append(f"diff --git a/{path} b/{path}\n{body}")
    return "".join(chunks)


# --- measuring the tests ------------------------------------------------------------------------------------------


def classify(base: Mapping[str, str], gold: Mapping[str, str], *, collected: int | None = None) -> Measured:
    """Measure FAIL_TO_PASS and PASS_TO_PASS from the node id → status maps of the buggy and the gold grading.

    FAIL_TO_PASS: not passing on the bug, passing with the fix; PASS_TO_PASS: passing on both. A test missing from
    a grading counts as not passing there, so a run that lost results can only make the recipe check fail.

    ``tests`` is what pytest collected with the gold patch (``collected``), or else the tests the gold grading
    reported.
    """
    passed_base = {node for node, status in base.items() if status in PASSING}
    passed_gold = {node for node, status in gold.items() if status in PASSING}
    return Measured(
        fail_to_pass=tuple(sorted(passed_gold - passed_base)),
        pass_to_pass=tuple(sorted(passed_gold & passed_base)),
        tests=len(gold) if collected is None else collected,
        failing_on_gold=tuple(sorted(node for node, status in gold.items() if status not in PASSING | {"SKIPPED"})),
    )


def check_fail_to_pass(task_id: str, expected: Iterable[str], measured: Measured) -> None:
    """Refuse a task whose recipe FAIL_TO_PASS is not exactly the measured one, naming both differences."""
    expected, actual = set(expected), set(measured.fail_to_pass)
    if expected == actual:
        return
    problems = []
    if expected - actual:
        problems.append(f"listed but not failing on the bug and passing on the fix: {_listed(expected - actual)}")
    if actual - expected:
        problems.append(f"failing on the bug and passing on the fix but not listed: {_listed(actual - expected)}")
    raise RecipeError(f"task {task_id!r}: FAIL_TO_PASS does not match the tests ({'; '.join(problems)})")


def check_gradings(task_id: str, base: GradeResult, gold: GradeResult) -> None:
    """Refuse gradings that say nothing about the bug.

    That is: hidden tests that do not apply, a gold patch that does not, a timeout or a tampered run, or a bug
    that breaks tests the fix does not repair.
    """
    for name, result in (("buggy", base), ("gold", gold)):
        if result.status not in ("resolved", "unresolved"):
            why = f"{result.error or ''}\n{result.log[-800:]}".strip()
            raise BuildError(f"task {task_id!r}: the {name} grading ended in {result.status}: {why}")
    passing_on_base = {node for node, status in base.tests.items() if status in PASSING}
    regressions = passing_on_base - {node for node, status in gold.tests.items() if status in PASSING}
    if regressions:
        raise BuildError(f"task {task_id!r}: tests pass on the bug but not with the gold patch: {_listed(regressions)}")


def _listed(nodes: Iterable[str]) -> str:
    ordered = sorted(nodes)
    more = f" … and {len(ordered) - _LISTED} more" if len(ordered) > _LISTED else ""
    return ", ".join(ordered[:_LISTED]) + more


# --- one task -----------------------------------------------------------------------------------------------------


def draft_task(recipe: Recipe, spec: TaskSpec, released: Mapping[str, bytes], repos: Path) -> SWETask:
    """Write the task's buggy repository (hidden tests removed) and return the task before any test is measured.

    Its PASS_TO_PASS holds no tests, only the test files that hold none of the FAIL_TO_PASS tests, as whole-file
    node ids, so that the grader runs every test file of the task; the build replaces them with the measured tests.
    """
    package = recipe.packages[spec.package]
    hidden = {path: _text(released[path], path, spec.id) for path in package.hidden_tests}
    protected = sorted({edit.path for edit in spec.bug if _is_test_path(edit.path, hidden)})
    if protected:
        raise RecipeError(f"task {spec.id!r}: bugs must be in the package source, not in {', '.join(protected)}")
    edited = {edit.path for edit in spec.bug if edit.path in released}
    originals = {path: _text(released[path], path, spec.id) for path in edited}
    buggy = apply_edits(originals, spec.bug, task_id=spec.id)
    repo = repos / spec.id
    for path, content in released.items():
        if path not in hidden:
            destination = repo / path
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(buggy[path].encode() if path in buggy else content)
    test_files = recipe.test_files(spec)
    with_f2p = {node.split("::", 1)[0] for node in spec.fail_to_pass}
    return SWETask(
        id=spec.id,
        repo=repo,
        problem_statement=spec.problem_statement,
        fail_to_pass=spec.fail_to_pass,
        pass_to_pass=tuple(path for path in test_files if path not in with_f2p),
        hidden_tests=hidden,
        gold_patch=unified_patch(buggy, originals),
        timeout_s=package.timeout_s,
        metadata=_metadata(package, spec, test_files),
    )


async def build_task(
    recipe: Recipe, spec: TaskSpec, released: Mapping[str, bytes], repos: Path, backend: SandboxBackend
) -> SWETask:
    """Draft the task, grade it without and with the gold patch, check FAIL_TO_PASS and fill in PASS_TO_PASS."""
    start = time.monotonic()
    draft = draft_task(recipe, spec, released, repos)
    base = await grade(draft, "", backend)
    gold = await grade(draft, draft.gold_patch, backend)
    check_gradings(spec.id, base, gold)
    measured = classify(base.tests, gold.tests, collected=gold.tests_run)
    check_fail_to_pass(spec.id, spec.fail_to_pass, measured)
    if measured.failing_on_gold:
        print(f"  {spec.id}: {len(measured.failing_on_gold)} tests fail on the release too (left out)", flush=True)
    metadata = {
        **draft.metadata,
        "tests": measured.tests,
        "fail_to_pass": len(measured.fail_to_pass),
        "pass_to_pass": len(measured.pass_to_pass),
    }
    print(
        f"task {spec.id}: {measured.tests} tests ({len(measured.fail_to_pass)} FAIL_TO_PASS, "
        f"{len(measured.pass_to_pass)} PASS_TO_PASS), built in {time.monotonic() - start:.0f} s",
        flush=True,
    )
    return replace(draft, pass_to_pass=measured.pass_to_pass, metadata=metadata)


def _metadata(package: PackageSpec, spec: TaskSpec, test_files: Sequence[str]) -> dict[str, object]:
    return {
        "package": package.name,
        "version": package.sdist.version,
        "sdist_sha256": package.sdist.sha256,
        "test_deps": [dep.requirement for dep in package.test_deps],
        "test_files": list(test_files),
        "bug_files": sorted({edit.path for edit in spec.bug}),
        "source": "bug injected into the released sdist",
    }


def _is_test_path(path: str, hidden: Mapping[str, str]) -> bool:
    probe = SWETask(id="probe", repo=None, problem_statement="", fail_to_pass=("x",), hidden_tests=hidden)
    return is_protected(path, probe)


def _text(content: bytes, path: str, task_id: str) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"task {task_id!r}: {path} is not UTF-8 text") from exc
