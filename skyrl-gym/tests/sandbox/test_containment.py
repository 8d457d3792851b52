"""Hostile snippets stay contained, in every isolation mode this machine has, and the pool survives them.

Each test runs against ``mode_executor`` (one executor per available mode, limits: 2 s wall clock, 512 MiB,
16 processes, 64 KiB of output) and asserts what that mode's documented guarantees promise
(:func:`skyrl_gym.sandbox.isolation_guarantees`). The fixture fails the test if any sandbox process or
temporary directory outlives the executor.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyrl_gym.sandbox import CodeExecutor, SandboxLimits, isolation_guarantees
from skyrl_gym.sandbox.isolation import WORLD_WRITABLE_DIRS, uid_pool


def guarantees(executor: CodeExecutor) -> frozenset[str]:
    return isolation_guarantees(executor.isolation)


@pytest.mark.slow
def test_fork_bomb(mode_executor: CodeExecutor, host: Any) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = mode_executor.run(code)
    assert result.timed_out
    assert result.exit_code == -signal.SIGKILL
    host.assert_healthy(mode_executor)


def test_process_limit(mode_executor: CodeExecutor, host: Any) -> None:
    code = (
        "import os, time\n"
        "children = 0\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(5)\n"
        "            os._exit(0)\n"
        "        children += 1\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
        "print(children)\n"
    )
    result = mode_executor.run(code)
    lines = result.stdout.split()
    if "process_limit" in guarantees(mode_executor):
        # max_processes=16 counts the interpreter itself.
        assert lines == ["refused", str(errno.EAGAIN), "15"]
    else:
        assert lines[-1] == "100"
    assert result.exit_code == 0
    host.assert_healthy(mode_executor)


def test_memory_bomb(mode_executor: CodeExecutor, host: Any) -> None:
    result = mode_executor.run("x = bytearray(8 * 1024**3)")
    assert result.stderr.endswith("MemoryError\n")
    assert result.exit_code == 1
    # Filling 512 MiB takes a while on a loaded machine: give it room, this is about memory, not time.
    roomy = mode_executor.limits.replace(timeout_s=20.0)
    grow = mode_executor.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024**2))", limits=roomy)
    assert grow.stderr.endswith("MemoryError\n")
    assert not grow.timed_out
    host.assert_healthy(mode_executor)


@pytest.mark.slow
def test_infinite_loop_hits_the_wall_clock(mode_executor: CodeExecutor, host: Any) -> None:
    result = mode_executor.run("while True:\n    pass")
    assert result.timed_out
    assert result.exit_code == -signal.SIGKILL
    assert result.duration_s >= mode_executor.limits.timeout_s
    host.assert_healthy(mode_executor)


@pytest.mark.slow
def test_cpu_time_limit(mode_executor: CodeExecutor, host: Any) -> None:
    limits = mode_executor.limits.replace(timeout_s=30.0, cpu_s=1.0)
    result = mode_executor.run("while True:\n    pass", limits=limits)
    assert not result.timed_out
    assert result.exit_code == -signal.SIGXCPU
    assert result.cpu_limit_exceeded
    host.assert_healthy(mode_executor)


@pytest.mark.slow
def test_sleep_past_the_wall_clock(mode_executor: CodeExecutor, host: Any) -> None:
    result = mode_executor.run("import time\nprint('start', flush=True)\ntime.sleep(60)\nprint('never')")
    assert result.timed_out
    assert result.stdout == "start\n"
    assert result.duration_s >= mode_executor.limits.timeout_s
    host.assert_healthy(mode_executor)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_infinite_output_is_capped(mode_executor: CodeExecutor, host: Any, stream: str) -> None:
    result = mode_executor.run(f"import sys\nwhile True:\n    sys.{stream}.write('x' * 1000 + '\\n')")
    cap = mode_executor.limits.max_output_bytes
    assert getattr(result, stream) == ("x" * 1000 + "\n") * (cap // 1001) + "x" * (cap % 1001)
    assert getattr(result, f"{stream}_truncated")
    assert not result.timed_out
    assert result.exit_code == -signal.SIGKILL
    host.assert_healthy(mode_executor)


def test_output_at_the_cap_is_not_truncated(mode_executor: CodeExecutor) -> None:
    cap = mode_executor.limits.max_output_bytes
    result = mode_executor.run(f"print('y' * {cap - 1})")
    assert len(result.stdout) == cap
    assert not result.stdout_truncated
    assert result.exit_code == 0


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP server on the host's loopback that a sandbox with network access could reach."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    yield server
    server.close()


def test_network(mode_executor: CodeExecutor, host: Any, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        f"for address in [('127.0.0.1', {port}), ('192.0.2.1', 80), ('8.8.8.8', 53)]:\n"
        "    s = socket.socket()\n"
        "    s.settimeout(0.5)\n"
        "    try:\n"
        "        s.connect(address)\n"
        "        print('connected')\n"
        "    except OSError as e:\n"
        "        print('failed', e.errno)\n"
    )
    # Connection attempts that are not refused at once may each take their 0.5 s timeout.
    result = mode_executor.run(code, limits=mode_executor.limits.replace(timeout_s=10.0))
    loopback, *external = result.stdout.splitlines()
    if "network" in guarantees(mode_executor):
        # Its own empty network namespace: the host's loopback server does not exist there, and no route leads out.
        assert loopback.startswith("failed")
        assert external == [f"failed {errno.ENETUNREACH}"] * 2
        with pytest.raises(BlockingIOError):
            listener.accept()
    else:
        assert loopback == "connected"  # documented: this mode does not isolate the network
    host.assert_healthy(mode_executor)


def test_writes_outside_the_private_directory(mode_executor: CodeExecutor, host: Any) -> None:
    marker = f"sandbox-escape-{uuid.uuid4().hex}"
    protected = [Path("/work") / marker, Path("/root") / marker, Path(os.getcwd()) / marker]
    targets = protected + [Path(d) / marker for d in WORLD_WRITABLE_DIRS if os.path.isdir(d)]
    code = (
        "import os\n"
        f"for path in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('escaped')\n"
        "        print('wrote', path)\n"
        "    except OSError as e:\n"
        "        print('failed', path, e.errno)\n"
    )
    result = mode_executor.run(code)
    assert result.exit_code == 0
    outcome = dict(line.split()[:2][::-1] for line in result.stdout.splitlines())
    if guarantees(mode_executor) & {"filesystem", "unprivileged"}:
        assert all(outcome[str(path)] == "failed" for path in protected), outcome
    # Whatever did succeed was inside the sandbox's own view, or is removed once the run ends.
    assert host.wait_until(lambda: not any(t.exists() for t in targets)), [str(t) for t in targets if t.exists()]
    host.assert_healthy(mode_executor)


def test_world_writable_host_directory(mode_executor: CodeExecutor, open_dir: str) -> None:
    target = Path(open_dir) / "escaped"
    result = mode_executor.run(f"open({str(target)!r}, 'w').write('escaped')")
    if "filesystem" in guarantees(mode_executor):
        assert result.stderr.endswith(f"FileNotFoundError: [Errno 2] No such file or directory: {str(target)!r}\n")
        assert not target.exists()
    else:
        # Documented: outside bwrap only what the uid may not write is protected, and only the top level of the
        # usual world-writable directories is cleaned.
        assert result.exit_code == 0
        assert target.read_text() == "escaped"


def test_host_files_are_hidden(mode_executor: CodeExecutor) -> None:
    checks = [__file__, "/etc/passwd", "/etc/hostname", "/root/.bashrc"]
    result = mode_executor.run(f"import os\nprint([os.path.exists(p) for p in {checks!r}])")
    if "filesystem" in guarantees(mode_executor):
        assert result.stdout == f"{[False] * len(checks)}\n"
    else:  # documented: the host's files are visible (read-only where the uid lacks write permission)
        assert result.stdout.startswith("[True, True")


def test_daemon_that_outlives_its_parent_is_killed(mode_executor: CodeExecutor, host: Any) -> None:
    tag = f"{uuid.uuid4().int % 10**6}.123"  # a unique argument to find the daemon by on the host
    code = (
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
    result = mode_executor.run(code)
    assert result.stdout == "parent exits\n"
    if "escaped_processes" in guarantees(mode_executor):
        assert host.wait_until(lambda: not host.processes_with_argument(tag)), "the daemon survived the run"
    else:  # documented: without a PID namespace or a private uid, a daemon that called setsid() escapes
        survivors = host.processes_with_argument(tag)
        assert survivors
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
    host.assert_healthy(mode_executor)


def test_child_holding_the_output_pipe_does_not_hang_the_run(mode_executor: CodeExecutor, host: Any) -> None:
    # The background child keeps stdout open; the run must end when the interpreter does, not at the timeout.
    code = "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('started')\n"
    result = mode_executor.run(code)
    assert result.stdout == "started\n"
    assert not result.timed_out
    assert result.exit_code == 0
    host.assert_healthy(mode_executor)


def test_runs_as_a_private_uid(mode_executor: CodeExecutor) -> None:
    result = mode_executor.run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())")
    uid, gid, groups = result.stdout.split(" ", 2)
    if "unprivileged" in guarantees(mode_executor):
        assert int(uid) in uid_pool().uids
        assert uid == gid
        assert groups.strip() == "[]"
    else:
        assert int(uid) == os.getuid()


def test_processes_are_hidden_in_bwrap(mode_executor: CodeExecutor) -> None:
    result = mode_executor.run("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    pids = [int(p) for p in result.stdout.strip("[]\n").split(", ")]
    if mode_executor.isolation == "bwrap":
        # A PID namespace of its own: bwrap's init, the fork server (if any) and the run, nothing of the host.
        assert len(pids) <= 3
        assert 1 in pids
    else:
        assert os.getpid() in pids


def test_environment_is_not_inherited(mode_executor: CodeExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYRL_TEST_SECRET", "hunter2")
    result = mode_executor.run("import os\nprint(sorted(os.environ))")
    assert "SKYRL_TEST_SECRET" not in result.stdout
    # bwrap adds PWD for the directory it starts in.
    assert set(ast.literal_eval(result.stdout)) <= {"HOME", "LANG", "PATH", "TMPDIR", "PWD"}


def test_limits_are_per_run(mode_executor: CodeExecutor) -> None:
    small = SandboxLimits(timeout_s=2.0, memory_mb=64, max_file_mb=1)
    result = mode_executor.run("x = bytearray(200 * 1024**2)", limits=small)
    assert result.stderr.endswith("MemoryError\n")
    big_file = mode_executor.run("open('big', 'wb').write(b'x' * 2 * 1024**2)", limits=small)
    assert big_file.exit_code != 0  # SIGXFSZ or an OSError, depending on the interpreter's signal setup
    assert mode_executor.run("x = bytearray(200 * 1024**2)").exit_code == 0


def test_no_new_privileges(mode_executor: CodeExecutor) -> None:
    # no_new_privs also holds for what the snippet execs: setuid bits and file capabilities are ignored there.
    code = (
        "import subprocess\n"
        "status = subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout\n"
        "print([line.split()[1] for line in status.splitlines() if line.startswith('NoNewPrivs:')])\n"
    )
    assert mode_executor.run(code).stdout == "['1']\n"
    assert "no_new_privs" in guarantees(mode_executor)


# ctypes on libc: what a snippet needs for System V shared memory. shmat's failure value is (void *) -1.
SHM = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
SHM_FAILED = (1 << 64) - 1


def shm_snippets(key: int) -> tuple[str, str]:
    """A snippet that creates, attaches and fills a segment (printing its id); one that looks for it by key and id."""
    create = SHM + (
        f"shmid = libc.shmget({key}, 4096, 0o1666)\n"  # IPC_CREAT | 0666: anyone may attach
        "addr = libc.shmat(shmid, None, 0)\n"
        "ctypes.memmove(addr, b'secret', 6)\n"
        "print(shmid, flush=True)\n"
    )
    look = SHM + (
        f"print(libc.shmget({key}, 0, 0) >= 0)\n"
        "addr = libc.shmat(int(input()), None, 0)\n"
        f"print(ctypes.string_at(addr, 6) if addr not in (None, {SHM_FAILED}) else None)\n"
    )
    return create, look


def test_sysv_shared_memory_does_not_outlive_the_run(mode_executor: CodeExecutor, host: Any) -> None:
    key = 0x5E000000 + uuid.uuid4().int % (1 << 24)
    create, look = shm_snippets(key)
    made = mode_executor.run(create)
    assert made.exit_code == 0, made.stderr
    found = mode_executor.run(look, stdin=made.stdout)
    if "ipc" in guarantees(mode_executor):
        # The next run finds it neither by key nor by id, and nothing of it is left on the host.
        assert found.stdout == "False\nNone\n"
        assert not host.sandbox_ipc_objects()
    else:  # documented: a non-root caller in rlimits mode shares its IPC namespace (and uid) with its runs
        assert found.stdout == "True\nb'secret'\n"
        mode_executor.run(SHM + f"libc.shmctl(libc.shmget({key}, 0, 0), 0, None)")  # IPC_RMID
    host.assert_healthy(mode_executor)


# Runs the shared-memory attack in rlimits mode as root without CAP_SYS_ADMIN (a root caller in an unprivileged
# container): no IPC namespace can be made there, so the run's segments live in the host's namespace.
_NO_CAP_SYS_ADMIN_SCRIPT = """
import json, os, sys
from skyrl_gym.sandbox import CodeExecutor
create, look = json.loads(sys.argv[1])
report = {"ipc_namespace": os.readlink("/proc/self/ns/ipc")}
for fork_server in (True, False):
    with CodeExecutor(pool_size=1, isolation="rlimits", fork_server=fork_server) as executor:
        namespace = executor.run("import os\\nprint(os.readlink('/proc/self/ns/ipc'))").stdout.strip()
        made = executor.run(create)
        found = executor.run(look, stdin=made.stdout)
        # A run killed at its timeout: its segment must go as well (a fork server is killed with it).
        killed = executor.run(create + "import time\\ntime.sleep(30)", limits=executor.limits.replace(timeout_s=1.0))
        found_after_kill = executor.run(look, stdin=killed.stdout)
        report[str(fork_server)] = [namespace, made.exit_code, found.stdout, killed.timed_out, found_after_kill.stdout]
print(json.dumps(report))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv(1)")
def test_sysv_shared_memory_is_removed_where_no_ipc_namespace_can_be_made() -> None:
    key = 0x5F000000 + uuid.uuid4().int % (1 << 24)
    command = ["setpriv", "--bounding-set", "-sys_admin", sys.executable, "-c", _NO_CAP_SYS_ADMIN_SCRIPT]
    done = subprocess.run(
        [*command, json.dumps(shm_snippets(key))], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    host_namespace = report.pop("ipc_namespace")
    for namespace, made, found, timed_out, found_after_kill in report.values():
        assert namespace == host_namespace  # the run shares the caller's IPC namespace
        assert made == 0
        assert found == "False\nNone\n"
        assert timed_out
        assert found_after_kill == "False\nNone\n"
    with open("/proc/sysvipc/shm") as table:
        assert f"{key:>10}" not in table.read()  # the segment was removed, not just hidden
