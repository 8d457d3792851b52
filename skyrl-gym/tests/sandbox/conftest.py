"""Fixtures for the sandbox tests.

Every executor here keeps a pool of two interpreters (the machines have two cores). After each test that
uses one, the executor is closed and the test fails if any process of the sandbox's uids, or any temporary
directory it created, is left on the host. Tests of guarantees run in every isolation mode this machine has, each
with fork servers (where supported) and with one interpreter per run.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from skyrl_gym.sandbox import CodeExecutor, SandboxLimits
from skyrl_gym.sandbox.errors import SandboxUnavailableError
from skyrl_gym.sandbox.forkserver import fork_server_supported
from skyrl_gym.sandbox.isolation import MODES, IsolationMode, check_mode, isolation_mode, uid_pool

POOL_SIZE = 2
LEFTOVER_WAIT_S = 10.0


def available_modes() -> list[IsolationMode]:
    """Every isolation mode this machine supports; the tests of guarantees run in each."""
    modes = []
    for mode in MODES:
        with contextlib.suppress(SandboxUnavailableError):
            modes.append(check_mode(mode))
    return modes


def launchers() -> list[bool]:
    """The ``fork_server`` values to test: fork servers where supported, and one interpreter per run."""
    return [True, False] if fork_server_supported() else [False]


def mode_launchers() -> list[pytest.param]:  # type: ignore[valid-type]
    """Every (isolation mode, fork_server) pair this machine supports, with readable ids."""
    return [
        pytest.param((mode, fork), id=f"{mode}-{'fork' if fork else 'per-run'}")
        for mode in available_modes()
        for fork in launchers()
    ]


def sandbox_processes() -> list[int]:
    """Pids of live (non-zombie) processes owned by one of this test process's sandbox uids."""
    uids = uid_pool().uids
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) in uids and not fields["State"].strip().startswith("Z"):
            found.append(int(entry))
    return found


def sandbox_ipc_objects() -> list[str]:
    """System V IPC objects in the host's namespace created by one of this test process's sandbox uids."""
    uids = uid_pool().uids
    found = []
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as table:
            header, *rows = (line.split() for line in table)
        for row in rows:
            fields = dict(zip(header, row, strict=False))
            if int(fields["cuid"]) in uids:
                found.append(f"{kind} {row[1]} (key {fields['key']})")
    return found


def sandbox_tmpdirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "skyrl-sandbox-*")))


def wait_until(condition: Callable[[], bool], timeout_s: float = LEFTOVER_WAIT_S) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passed (a bound on waiting, not a speed assertion)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def assert_nothing_left(tmpdirs_before: set[str]) -> None:
    assert wait_until(lambda: not sandbox_processes()), f"sandbox processes left: {sandbox_processes()}"
    assert wait_until(lambda: not (sandbox_tmpdirs() - tmpdirs_before)), "sandbox temporary directories left"
    assert not sandbox_ipc_objects(), f"System V IPC objects left: {sandbox_ipc_objects()}"


def assert_healthy(executor: CodeExecutor) -> None:
    """The pool still serves a normal run correctly."""
    result = executor.run("import sys; print(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2 3")
    assert result.stdout == "6\n"
    assert result.stderr == ""
    assert result.exit_code == 0
    assert result.ok


@contextlib.contextmanager
def checked_executor(pool_size: int = POOL_SIZE, **kwargs: object) -> Iterator[CodeExecutor]:
    """An executor that is closed afterwards, with a check that it left nothing behind."""
    before = sandbox_tmpdirs()
    executor = CodeExecutor(pool_size=pool_size, **kwargs)  # type: ignore[arg-type]
    try:
        yield executor
    finally:
        executor.close()
    assert_nothing_left(before)


def processes_with_argument(argument: str) -> list[int]:
    """Pids of host processes with ``argument`` among their command-line arguments."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    arguments = cmdline.read().split(b"\0")
            except OSError:
                continue
            if argument.encode() in arguments:
                found.append(int(entry))
    return found


class HostChecks:
    """What tests need to look at the host from outside the sandbox (a fixture: test modules cannot import)."""

    assert_healthy = staticmethod(assert_healthy)
    wait_until = staticmethod(wait_until)
    sandbox_processes = staticmethod(sandbox_processes)
    sandbox_ipc_objects = staticmethod(sandbox_ipc_objects)
    processes_with_argument = staticmethod(processes_with_argument)


@pytest.fixture
def host() -> type[HostChecks]:
    return HostChecks


@pytest.fixture
def open_dir() -> Iterator[str]:
    """A world-writable directory on the host, reachable by any uid (pytest's tmp_path is private to root)."""
    path = tempfile.mkdtemp(prefix="skyrl-test-open-")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_executor() -> Iterator[CodeExecutor]:
    """One executor of the default mode for the many small tests of a module."""
    with checked_executor() as executor:
        yield executor


@pytest.fixture(scope="module", params=launchers(), ids=lambda fork: "fork" if fork else "per-run")
def launcher_shared_executor(request: pytest.FixtureRequest) -> Iterator[CodeExecutor]:
    """Like ``shared_executor``, once with fork servers and once with one interpreter per run."""
    with checked_executor(fork_server=request.param) as executor:
        yield executor


@pytest.fixture(params=mode_launchers())
def mode_executor(request: pytest.FixtureRequest) -> Iterator[CodeExecutor]:
    """A fresh executor in each isolation mode and launcher available here, with short limits for attacks."""
    mode, fork_server = request.param
    limits = SandboxLimits(timeout_s=2.0, memory_mb=512, max_processes=16, max_output_bytes=64 * 1024)
    with checked_executor(limits=limits, isolation=mode, fork_server=fork_server) as executor:
        yield executor


@pytest.fixture(params=launchers(), ids=lambda fork: "fork" if fork else "per-run")
def launcher_executor(request: pytest.FixtureRequest) -> Iterator[CodeExecutor]:
    """A fresh executor of the default isolation mode, with fork servers and with one interpreter per run."""
    with checked_executor(fork_server=request.param) as executor:
        yield executor


@pytest.fixture
def default_mode() -> IsolationMode:
    return isolation_mode()


@pytest.fixture(params=available_modes())
def one_server(request: pytest.FixtureRequest) -> Iterator[CodeExecutor]:
    """An executor with a single fork server, in each isolation mode available here (fork servers only)."""
    if not fork_server_supported():
        pytest.skip("fork servers need a root caller")
    limits = SandboxLimits(timeout_s=2.0, memory_mb=512, max_processes=16)
    with checked_executor(pool_size=1, limits=limits, isolation=request.param, fork_server=True) as executor:
        yield executor
