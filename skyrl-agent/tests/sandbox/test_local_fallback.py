"""The local backend without overlay mounts: each sandbox copies the layers instead (correct, but slower)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from skyrl_agent.sandbox import local_backend
from skyrl_agent.sandbox.local_backend import LocalBackend, LocalSandbox, export_rootfs

from .conftest import SPEC

pytestmark = [pytest.mark.docker, pytest.mark.slow]  # the rootfs is exported from the Docker image; copies take s


@pytest.fixture
def no_overlay(monkeypatch: pytest.MonkeyPatch) -> list[list[Path]]:
    """Refuse every overlay mount, as for an unprivileged process; record the lower layers asked for."""
    asked: list[list[Path]] = []

    def refuse(lowers: list[Path], upper: Path, work: Path, merged: Path) -> bool:
        asked.append(list(lowers))
        return False

    monkeypatch.setattr(local_backend, "_overlay_mount", refuse)
    return asked


def _mounts() -> str:
    return Path("/proc/mounts").read_text()


def test_without_overlay_mounts_sandboxes_copy_the_layers(no_overlay: list[list[Path]], tmp_path: Path) -> None:
    rootfs = export_rootfs()
    backend = LocalBackend(rootfs, work_dir=tmp_path / "work")

    async def main() -> None:
        try:
            sandbox = await backend.create(SPEC)
            assert isinstance(sandbox, LocalSandbox)
            assert not sandbox.dirs.mounted
            assert str(sandbox.dirs.merged) not in _mounts()
            assert (sandbox.dirs.merged / "usr" / "bin" / "python3").exists()  # a full copy of the image
            await _check_isolated_copy(sandbox, rootfs)
            await _check_snapshot_and_fork(sandbox, backend)
            await sandbox.close()
            assert not sandbox.dirs.base.exists()
        finally:
            await backend.close()

    asyncio.run(main())
    assert no_overlay  # the fallback was taken because the mount was refused
    assert not (tmp_path / "work").exists()


async def _check_isolated_copy(sandbox: LocalSandbox, rootfs: Path) -> None:
    """Commands work as usual; writes land in the sandbox's copy, never in the shared rootfs."""
    result = await sandbox.run("id -un; echo data > note.txt; cat note.txt; touch /etc/owned")
    assert result.output.startswith("sandbox\ndata\n")
    assert "Permission denied" in result.output  # the copy keeps the image's owners: /etc stays root's
    assert (sandbox.dirs.merged / "workspace" / "note.txt").read_text() == "data\n"
    assert not (rootfs / "workspace" / "note.txt").exists()


async def _check_snapshot_and_fork(sandbox: LocalSandbox, backend: LocalBackend) -> None:
    """A snapshot is a whole root (one layer); a fork copies it and is independent of its parent."""
    await sandbox.write_file("state.txt", "v1")
    snapshot = await sandbox.snapshot()
    assert ":" not in snapshot.ref  # one full layer, not an overlay lowerdir list
    await sandbox.write_file("state.txt", "after-snapshot")
    (fork,) = await backend.fork(snapshot, 1, SPEC)
    try:
        assert not fork.dirs.mounted
        assert await fork.read_file("state.txt") == b"v1"
        assert await fork.read_file("note.txt") == b"data\n"
        await fork.write_file("state.txt", "fork")
        assert await sandbox.read_file("state.txt") == b"after-snapshot"
        assert (Path(snapshot.ref) / "workspace" / "state.txt").read_text() == "v1"  # the layer stays frozen
        await backend.discard_snapshot(snapshot)
        assert not Path(snapshot.ref).exists()  # deleted at once: the fork has a copy of its own
        assert (await fork.run("cat state.txt")).output == "fork"
    finally:
        await fork.close()
