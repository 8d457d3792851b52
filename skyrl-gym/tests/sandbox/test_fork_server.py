"""Fork servers: back-to-back runs in the same server start from the state the server had before the first.

Most tests use one executor with a single fork server per isolation mode (``pool_size=1``), check that the
same server served the runs they compare (or that it was replaced, where it must be), and that whatever a run left
(processes, files, IPC objects) is gone before the next run starts. Leftover checks of the fixtures still apply.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from skyrl_gym.sandbox import CodeExecutor, isolation_guarantees
from skyrl_gym.sandbox.errors import SandboxUnavailableError
from skyrl_gym.sandbox.forkserver import ForkServer, fork_server_supported
from skyrl_gym.sandbox.isolation import check_mode

pytestmark = pytest.mark.skipif(not fork_server_supported(), reason="fork servers need a root caller")


def idle_server(executor: CodeExecutor, host: Any) -> ForkServer:
    """The executor's only idle fork server (waiting, if it is being replaced)."""
    assert host.wait_until(lambda: executor._pool.idle_count() == 1)
    server = executor._pool._ready[0]
    assert isinstance(server, ForkServer)
    return server


def test_a_daemon_is_dead_before_the_next_run_in_the_same_server(one_server: CodeExecutor, host: Any) -> None:
    # The daemon test of test_containment, run back to back in one server: the second run must not see it.
    tag = f"{uuid.uuid4().int % 10**6}.321"
    daemon = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        for fd in (0, 1, 2):\n"
        "            os.close(fd)\n"
        f"        os.execvp('sleep', ['sleep', '{tag}'])\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "import time\n"
        "time.sleep(0.3)\n"
        "print('parent exits')\n"
    )
    look = (
        "import os\n"
        "found = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        f"        if b'{tag}' in open(f'/proc/{{pid}}/cmdline', 'rb').read():\n"
        "            found.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(found)\n"
    )
    server = idle_server(one_server, host)
    assert one_server.run(daemon).stdout == "parent exits\n"
    assert idle_server(one_server, host) is server  # the run left it clean: it serves the next one
    assert one_server.run(look).stdout == "[]\n"
    assert idle_server(one_server, host) is server
    assert not host.processes_with_argument(tag)


def test_files_are_gone_before_the_next_run_in_the_same_server(one_server: CodeExecutor, host: Any) -> None:
    # Outside bwrap /dev/shm is the host's: what a run leaves there is removed in the background (test_containment).
    shm = one_server.isolation == "bwrap"
    write = (
        "import os\n"
        "os.makedirs('deep/er', exist_ok=True)\n"
        "open('deep/er/f', 'w').write('x')\n"
        "os.chmod('deep/er', 0)\n"  # not even its owner could list it now
        "os.mkdir('sticky')\n"
        "os.chmod('sticky', 0o1777)\n"
        "open('sticky/g', 'w').write('y')\n"
        "open(os.path.join(os.environ['TMPDIR'], 'notes'), 'w').write('z')\n"
        f"if {shm}:\n"
        "    open('/dev/shm/left-behind', 'w').write('w')\n"
        "print(os.getcwd())\n"
    )
    server = idle_server(one_server, host)
    # Mount points of an interpreter living under the temp dir may be there from the start; nothing else stays.
    listing = "import os\nprint(sorted(set(os.listdir('.')) - {'deep', 'sticky', 'notes'}))"
    baseline = one_server.run(listing).stdout
    first = one_server.run(write)
    assert first.exit_code == 0, first.stderr
    cwd = first.stdout.strip()
    check = (
        "import os\nprint(sorted(os.listdir('.')) == " + baseline.strip() + ", "
        f"os.path.exists({cwd!r} + '/deep'), os.path.exists('/dev/shm/left-behind'))"
    )
    assert one_server.run(check).stdout == "True False False\n"
    assert idle_server(one_server, host) is server


def _ipc_cases() -> list[tuple[str, str]]:
    """(mode, kind) pairs with an IPC guarantee, among the modes this machine supports.

    System V objects are checked wherever a server has its own IPC namespace (bwrap, unshare); POSIX message
    queues under bwrap only. rlimits mode shares the host's IPC namespace and promises nothing about IPC
    (docs/gym/sandbox.md), so it has no case here rather than a skipped one.
    """
    cases = []
    for mode, kinds in (("bwrap", ("sysv", "mqueue")), ("unshare", ("sysv",))):
        try:
            check_mode(mode)
        except SandboxUnavailableError:
            continue
        cases += [(mode, kind) for kind in kinds]
    return cases


@pytest.mark.parametrize(("one_server", "kind"), _ipc_cases(), indirect=["one_server"])
def test_ipc_objects_do_not_reach_the_next_run(one_server: CodeExecutor, host: Any, kind: str) -> None:
    setup = "import ctypes, os\nlibc = ctypes.CDLL(None)\nrt = ctypes.CDLL('librt.so.1')\n"
    create = {
        "sysv": "print(libc.shmget(0, 4096, 0o1666) >= 0)",  # IPC_PRIVATE, IPC_CREAT | 0666
        "mqueue": "print(rt.mq_open(b'/leak', os.O_CREAT | os.O_RDWR, 0o666, None) >= 0)",
    }[kind]
    present = {
        "sysv": "print(open('/proc/sysvipc/shm').read().count('\\n') > 1)",  # more than the header line
        "mqueue": "print(rt.mq_open(b'/leak', os.O_RDONLY, 0, None) >= 0)",
    }[kind]
    server = idle_server(one_server, host)
    assert one_server.run(setup + create).stdout == "True\n"
    # The server does not remove IPC objects: it exits, and a fresh one (a fresh IPC namespace) serves next.
    assert host.wait_until(lambda: one_server._pool.idle_count() == 1 and one_server._pool._ready[0] is not server)
    assert one_server.run(setup + present).stdout == "False\n"


def test_a_run_that_times_out_takes_its_server_with_it(one_server: CodeExecutor, host: Any) -> None:
    server = idle_server(one_server, host)
    result = one_server.run("import time\ntime.sleep(30)", limits=one_server.limits.replace(timeout_s=0.5))
    assert result.timed_out
    assert result.exit_code == -9
    assert idle_server(one_server, host) is not server
    host.assert_healthy(one_server)


def forge_report(payload: bytes, then: str) -> str:
    """A snippet that prints, writes ``payload`` to every descriptor it has beyond 0-2, then runs ``then``.

    One of those descriptors is where its fork server's child reports its exit status: a snippet can reach it.
    """
    return (
        "import os, time\n"
        "print('before', flush=True)\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        f"        os.write(fd, {payload!r})\n"
        "    except OSError:\n"
        "        pass\n"
        f"{then}"
    )


def test_a_forged_exit_report_does_not_stop_the_clock(one_server: CodeExecutor, host: Any) -> None:
    server = idle_server(one_server, host)
    tag = f"{uuid.uuid4().int % 10**6}.123"
    code = forge_report(b"E 0\n", f"os.execvp('sleep', ['sleep', '{tag}'])\n")
    result = one_server.run(code, limits=one_server.limits.replace(timeout_s=1.0))
    # Only the child's real end counts: the run goes on after its false report and is killed at its timeout.
    assert (result.stdout, result.exit_code, result.timed_out) == ("before\n", -9, True)
    assert host.wait_until(lambda: not host.processes_with_argument(tag))
    assert idle_server(one_server, host) is not server  # killed with the run, as after any timeout
    host.assert_healthy(one_server)


@pytest.mark.parametrize("streams", ["kept", "closed"])
def test_a_forged_exit_report_does_not_end_the_run(
    one_server: CodeExecutor, host: Any, open_dir: str, streams: str
) -> None:
    server = idle_server(one_server, host)
    marker = Path(open_dir) / "written-after-the-forged-report"
    visible = "filesystem" not in isolation_guarantees(one_server.isolation)  # the host sees what it writes
    code = (
        "import os, time\n"
        "print(os.getuid(), flush=True)\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, b'E 0\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        + ("for fd in (0, 1, 2):\n    os.close(fd)\n" if streams == "closed" else "")
        + "time.sleep(0.5)\n"
        + (f"open({str(marker)!r}, 'w').write('late')\n" if visible else "")
        + ("print('after')\n" if streams == "kept" else "")
        + "raise SystemExit(3)\n"
    )
    result = one_server.run(code, limits=one_server.limits.replace(timeout_s=5.0))
    # The host calls the run over only when it really is: with its real exit status, after all it did.
    assert (result.exit_code, result.timed_out) == (3, False)
    assert result.duration_s >= 0.5
    uid = result.stdout.split()[0]
    assert result.stdout == f"{uid}\n" + ("after\n" if streams == "kept" else "")
    if visible:
        assert marker.read_text() == "late"
    # The next run in the same server starts only once nothing of the first one is alive.
    look = (
        "import os\n"
        "alive = []\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        f"        if os.stat('/proc/' + pid).st_uid == {uid} and "
        "open(f'/proc/{pid}/stat').read().rpartition(')')[2].split()[0] != 'Z':\n"
        "            alive.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(alive)\n"
    )
    assert one_server.run(look).stdout == "[]\n"
    assert idle_server(one_server, host) is server
    host.assert_healthy(one_server)


def test_a_malformed_exit_report_is_ignored(one_server: CodeExecutor, host: Any) -> None:
    server = idle_server(one_server, host)
    code = forge_report(b"not a report\nE 0\n", "print('after')\nraise SystemExit(3)\n")
    result = one_server.run(code)
    # Garbage first: the server stops listening to the pipe and reports the status it reaps.
    assert (result.stdout, result.exit_code) == ("before\nafter\n", 3)
    for payload in (b"E 999\n", b"E -1\n", b"E\n", b"J 0 0\n", b"E 1 2\n"):
        result = one_server.run(forge_report(payload, "print('after')\nraise SystemExit(4)\n"))
        assert (result.stdout, result.exit_code) == ("before\nafter\n", 4), payload
    assert idle_server(one_server, host) is server
    host.assert_healthy(one_server)


def test_an_input_cannot_end_its_batch_early(one_server: CodeExecutor) -> None:
    code = forge_report(b"E 0\n", "print(input())\n")
    results = one_server.run_many(code, ["1", "2"])
    assert [result.stdout for result in results] == ["before\n1\n", "before\n2\n"]


def test_each_run_gets_a_private_uid_and_fresh_random_state(one_server: CodeExecutor) -> None:
    code = "import os, random\nprint(os.getuid(), random.random())"
    first, second = (one_server.run(code).stdout.split() for _ in range(2))
    assert first[0] != second[0]  # a uid per run, not per server
    assert first[1] != second[1]  # the standard library reseeds random in every forked child


def test_preloaded_numpy_is_reseeded_in_every_run() -> None:
    pytest.importorskip("numpy")
    with CodeExecutor(pool_size=1, preload=["numpy"], fork_server=True) as executor:
        code = "import numpy\nprint(numpy.random.random())"
        assert executor.run(code).stdout != executor.run(code).stdout


def test_fork_server_is_the_default_and_can_be_turned_off() -> None:
    with CodeExecutor(pool_size=0) as default, CodeExecutor(pool_size=0, fork_server=False) as per_run:
        assert default.fork_server
        assert not per_run.fork_server
        assert "fork_server=True" in repr(default)
        assert default.run("print(1)").stdout == per_run.run("print(1)").stdout == "1\n"


def test_runs_beyond_the_pool_wait_for_a_server_rather_than_start_one(
    one_server: CodeExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    import skyrl_gym.sandbox.executor as executor_module

    monkeypatch.setattr(executor_module, "_WAIT_FOR_IDLE_S", 30.0)  # never give up waiting here
    started: list[int] = []
    start_worker = one_server._pool.start_worker

    def counting_start() -> Any:
        started.append(1)
        return start_worker()

    monkeypatch.setattr(one_server._pool, "start_worker", counting_start)
    with ThreadPoolExecutor(max_workers=3) as threads:
        results = list(threads.map(lambda n: one_server.run(f"print({n})"), range(9)))
    assert [r.stdout for r in results] == [f"{n}\n" for n in range(9)]
    assert started == []  # every run waited the few milliseconds the busy server needed


def test_async_runs_beyond_the_pool_wait_on_the_event_loop(
    one_server: CodeExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    import skyrl_gym.sandbox.executor as executor_module

    monkeypatch.setattr(executor_module, "_WAIT_FOR_IDLE_S", 30.0)
    started: list[int] = []
    start_worker = one_server._pool.start_worker

    def counting_start() -> Any:
        started.append(1)
        return start_worker()

    monkeypatch.setattr(one_server._pool, "start_worker", counting_start)

    async def main() -> list[str]:
        results = await asyncio.gather(*(one_server.arun(f"print({n})") for n in range(12)))
        return [r.stdout for r in results]

    assert asyncio.run(main()) == [f"{n}\n" for n in range(12)]
    assert started == []


def test_not_supported_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    import skyrl_gym.sandbox.executor as executor_module

    monkeypatch.setattr(executor_module, "fork_server_supported", lambda: False)
    with pytest.raises(SandboxUnavailableError, match="root"):
        CodeExecutor(pool_size=0, fork_server=True)
    with CodeExecutor(pool_size=0) as executor:
        assert not executor.fork_server
