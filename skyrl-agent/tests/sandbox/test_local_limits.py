"""The local backend's /tmp size limit, and the sweep of what a SIGKILLed backend left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from skyrl_agent.sandbox import local_backend
from skyrl_agent.sandbox.local_backend import LocalBackend, LocalSandbox, export_rootfs

from .conftest import SPEC

pytestmark = pytest.mark.docker  # the rootfs is exported from the Docker image


def _run_in_local(body, backend: LocalBackend) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        try:
            sandbox = await backend.create(SPEC)
            try:
                await body(sandbox)
            finally:
                await sandbox.close()
        finally:
            await backend.close()

    asyncio.run(main())


def test_tmp_is_a_tmpfs_of_the_configured_size(tmp_path: Path) -> None:
    backend = LocalBackend(export_rootfs(), work_dir=tmp_path / "work", tmp_size_mb=8)

    async def body(sandbox: LocalSandbox) -> None:
        small = await sandbox.run("head -c 4M /dev/zero > /tmp/small && echo ok")
        assert small.output == "ok\n"
        big = await sandbox.run("head -c 16M /dev/zero > /tmp/big; echo status=$?")
        assert "No space left on device" in big.output
        assert "status=1" in big.output
        assert (await sandbox.run("df -k /tmp | tail -1")).output.split()[1] == str(8 * 1024)

    _run_in_local(body, backend)


def test_tmp_has_a_default_size(tmp_path: Path) -> None:
    backend = LocalBackend(export_rootfs(), work_dir=tmp_path / "work")

    async def body(sandbox: LocalSandbox) -> None:
        size_kb = int((await sandbox.run("df -k /tmp | tail -1")).output.split()[1])
        assert size_kb == local_backend.TMP_SIZE_MB * 1024

    _run_in_local(body, backend)


CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from skyrl_agent.sandbox.base import SandboxSpec
    from skyrl_agent.sandbox.local_backend import LocalBackend

    async def main():
        backend = LocalBackend(Path(sys.argv[1]))
        sandbox = await backend.create(SandboxSpec(memory_mb=256, pids_limit=64))
        print(backend.work_dir, sandbox.dirs.merged, sandbox.dirs.mounted, flush=True)
        time.sleep(600)

    asyncio.run(main())
    """
)


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


def test_a_sigkilled_backend_is_swept_by_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rootfs = export_rootfs()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(rootfs)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None
        work, merged, mounted = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    work_dir, merged_dir = Path(work), Path(merged)
    assert work_dir.parent == tmp_path
    assert work_dir.is_dir()  # nothing cleaned up after a SIGKILL
    assert _mounted(merged_dir) == (mounted == "True")
    live = Path(tempfile.mkdtemp(prefix="skyrl-local-", dir=tmp_path))  # not a backend's: no lock, left alone
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        backend = LocalBackend(rootfs)
        try:
            assert not _mounted(merged_dir)
            assert not work_dir.exists()
            assert live.is_dir()
            assert backend.work_dir.is_dir()
        finally:
            asyncio.run(backend.close())
    finally:
        if _mounted(merged_dir):
            subprocess.run(["umount", "-l", str(merged_dir)], check=False)


def test_a_live_backend_is_not_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rootfs = export_rootfs()
    first = LocalBackend(rootfs)

    async def main() -> None:
        sandbox = await first.create(SPEC)
        try:
            second = LocalBackend(rootfs)  # sweeps on start: the first backend is alive
            await second.close()
            assert (await sandbox.run("echo alive")).output == "alive\n"
            assert _mounted(sandbox.dirs.merged) == sandbox.dirs.mounted
        finally:
            await first.close()

    asyncio.run(main())
    assert not first.work_dir.exists()
