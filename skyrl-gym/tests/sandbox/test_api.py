"""The public surface: limits, results, the tool text, modes, the default executor, lifecycle."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from skyrl_gym import error
from skyrl_gym.sandbox import (
    GUARANTEES,
    CodeExecutor,
    ExecutionResult,
    ExecutorClosedError,
    SandboxError,
    SandboxLimits,
    SandboxStartError,
    SandboxUnavailableError,
    format_python_tool_output,
    get_default_executor,
    isolation,
    isolation_guarantees,
    isolation_mode,
)
from skyrl_gym.sandbox.interpreter import SYSTEM_PYTHON, inspect_interpreter, normalize_interpreter_path
from skyrl_gym.sandbox.isolation import MODES, UidPool, bwrap_command, check_mode

ERROR = "Error executing Python code: "


def result(**changes: object) -> ExecutionResult:
    fields: dict[str, object] = {
        "stdout": "",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_s": 0.01,
        "isolation": "bwrap",
    }
    fields.update(changes)
    return ExecutionResult(**fields)  # type: ignore[arg-type]


def test_limits_validate() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match="cpu_s"):
        SandboxLimits(cpu_s=-1)


def test_cpu_limit_follows_the_timeout() -> None:
    assert SandboxLimits(timeout_s=2.5).cpu_seconds == 4
    assert SandboxLimits(timeout_s=2.5, cpu_s=1.2).cpu_seconds == 2
    assert SandboxLimits().replace(timeout_s=7).timeout_s == 7


def test_rlimit_header() -> None:
    limits = SandboxLimits(timeout_s=1, memory_mb=2, max_processes=3, max_file_mb=4)
    assert limits.rlimit_header(max_processes=True) == f"{2 << 20} 2 3 {4 << 20}\n".encode()
    assert limits.rlimit_header(max_processes=False) == f"{2 << 20} 2 -1 {4 << 20}\n".encode()


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        (result(stdout="  42\n\n"), "42"),
        (result(stdout=""), ""),
        (
            result(stdout="out\n", stderr="Traceback ...\nValueError: x\n", exit_code=1),
            ERROR + "Traceback ...\nValueError: x",
        ),
        (
            result(stdout="ok\n", stderr="<string>:1: UserWarning: w\n"),
            ERROR + "<string>:1: UserWarning: w",
        ),
        (result(timed_out=True, exit_code=-9), ERROR + "Execution timed out after 2.5 seconds."),
        (result(exit_code=-24), ERROR + "Execution timed out after 2.5 seconds."),
    ],
)
def test_python_tool_text(run: ExecutionResult, expected: str) -> None:
    assert format_python_tool_output(run, 2.5) == expected


def test_python_tool_text_prints_the_timeout_as_given() -> None:
    assert format_python_tool_output(result(timed_out=True), 10) == (ERROR + "Execution timed out after 10 seconds.")


def test_result_flags() -> None:
    assert result().ok
    assert not result(exit_code=1).ok
    assert result(stdout_truncated=True).killed
    assert result(exit_code=-24).cpu_limit_exceeded


def test_mode_and_guarantees() -> None:
    mode = isolation_mode()
    assert mode in MODES
    assert isolation_guarantees() <= set(GUARANTEES)
    assert {"resource_limits", "wall_clock", "output_cap", "private_tmp"} <= isolation_guarantees("rlimits")
    assert isolation_guarantees("rlimits") <= isolation_guarantees("unshare") <= isolation_guarantees("bwrap")


def test_environment_variable_selects_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYRL_SANDBOX_ISOLATION", "rlimits")
    assert isolation_mode() == "rlimits"
    monkeypatch.setenv("SKYRL_SANDBOX_ISOLATION", "chroot")
    with pytest.raises(SandboxUnavailableError, match="chroot"):
        isolation_mode()


@pytest.fixture
def without_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as one where bwrap and unshare cannot run (a root caller in an unprivileged container)."""
    problems = {"bwrap": "`bwrap` is not installed", "unshare": "probe exited with 1: Operation not permitted"}
    monkeypatch.setattr(isolation, "_mode_problem", problems.get)
    monkeypatch.setattr(isolation, "_fallback_warned", set(), raising=False)  # as in a fresh process
    monkeypatch.delenv("SKYRL_SANDBOX_ISOLATION", raising=False)


@pytest.mark.usefixtures("without_bwrap")
def test_falling_back_from_bwrap_warns_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    with caplog.at_level(logging.WARNING, logger="skyrl_gym.sandbox"):
        assert isolation_mode() == isolation_mode() == "rlimits"
        with CodeExecutor(pool_size=0) as executor:
            assert executor.isolation == "rlimits"
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1, [record.getMessage() for record in warnings]
    message = warnings[0].getMessage()
    assert "`bwrap` is not installed" in message  # why
    for lost in ("network", "filesystem"):  # what is lost
        assert GUARANTEES[lost] in message
    assert "bubblewrap" in message  # how to get bwrap
    assert "SKYRL_SANDBOX_ISOLATION" in message  # or how to choose this mode and silence it
    caplog.clear()
    monkeypatch.setenv("SKYRL_SANDBOX_ISOLATION", "rlimits")  # asked for: not a fallback, nothing to warn about
    isolation._fallback_warned.clear()
    with caplog.at_level(logging.WARNING, logger="skyrl_gym.sandbox"):
        assert isolation_mode() == "rlimits"
    assert not caplog.records


@pytest.mark.usefixtures("without_bwrap")
def test_metrics_report_the_mode_and_a_fallback() -> None:
    with CodeExecutor(pool_size=0) as fallen_back, CodeExecutor(pool_size=0, isolation="rlimits") as chosen:
        assert fallen_back.metrics() == {"sandbox_mode": "rlimits", "sandbox_fallback": True}
        assert chosen.metrics() == {"sandbox_mode": "rlimits", "sandbox_fallback": False}
        assert fallen_back.run("print(1)").isolation == "rlimits"
    with CodeExecutor(pool_size=0) as default:
        assert default.metrics()["sandbox_mode"] == default.isolation


def test_errors_are_library_errors() -> None:
    assert issubclass(SandboxError, error.Error)
    assert issubclass(ExecutorClosedError, SandboxError)


def test_bwrap_command_shape(tmp_path: Path) -> None:
    prefix = tmp_path / "py"
    (prefix / "lib").mkdir(parents=True)
    roots = [str(prefix / "lib"), str(prefix), "/usr/lib", "/nonexistent"]
    command = bwrap_command(["python", "-c", "pass"], ro_paths=roots, tmpfs_bytes=1024)
    assert command[0] == "bwrap"
    assert command[-4:] == ["--", "python", "-c", "pass"]
    assert "--unshare-net" in command
    assert "--unshare-pid" in command
    # Nested, missing and /usr paths collapse into the binds that already show them.
    binds = [command[i + 1] for i, arg in enumerate(command) if arg == "--ro-bind"]
    assert binds[-1] == str(prefix)
    assert str(prefix / "lib") not in binds
    assert "/nonexistent" not in binds
    assert binds.count("/usr") == 1
    # Parent directories are created searchable, whatever their mode on the host.
    parent = str(tmp_path)
    assert command[command.index(parent) - 3 : command.index(parent) + 1] == ["--perms", "0755", "--dir", parent]
    # The private /tmp is mounted before the binds, so a bind below /tmp stays visible.
    assert command.index("/tmp") < command.index(str(prefix))


def test_uid_pool_hands_out_distinct_uids() -> None:
    pool = UidPool(pid=12345)
    first, second = pool.acquire(), pool.acquire()
    assert first != second
    assert first in pool.uids
    assert first in pool
    pool.release(first)
    assert first not in pool
    assert pool.acquire() not in (first, second)  # round-robin: a freed uid is reused last
    assert max(UidPool(pid=2**22 - 1).uids) < 2**31


def test_code_must_be_text(shared_executor: CodeExecutor) -> None:
    with pytest.raises(TypeError):
        shared_executor.run(b"print(1)")  # type: ignore[arg-type]


def test_surrogates_and_null_bytes(shared_executor: CodeExecutor) -> None:
    # Neither can reach `python -c` through argv; the sandbox reports them as the compiler does.
    surrogate = shared_executor.run("print(len('\udcff'))")
    assert surrogate.exit_code == 1
    assert "surrogates not allowed" in surrogate.stderr
    null = shared_executor.run("print(1)\x00")
    assert null.exit_code == 1
    assert "null bytes" in null.stderr


def test_closed_executor_refuses_runs() -> None:
    executor = CodeExecutor(pool_size=1)
    executor.close()
    executor.close()  # idempotent
    assert executor.closed
    with pytest.raises(ExecutorClosedError):
        executor.run("print(1)")


def test_pool_size_zero_still_runs() -> None:
    with CodeExecutor(pool_size=0) as executor:
        assert executor.run("print('cold')").stdout == "cold\n"


def test_unknown_interpreter_is_refused() -> None:
    with pytest.raises(SandboxUnavailableError):
        CodeExecutor(python="/nonexistent/python3")


def test_default_executor_is_shared() -> None:
    first = get_default_executor()
    assert get_default_executor() is first
    assert first.run("print('default')").stdout == "default\n"
    first.close()
    second = get_default_executor()  # a closed default is replaced
    assert second is not first
    second.close()


def test_import_starts_nothing() -> None:
    code = textwrap.dedent(
        """
        import os, threading
        import skyrl_gym.sandbox, skyrl_gym.tools.python

        def parent(pid):  # a process of another program may exit between listdir and open
            try:
                return open(f'/proc/{pid}/stat').read().split(')')[-1].split()[1]
            except (FileNotFoundError, ProcessLookupError):
                return None

        children = [p for p in os.listdir('/proc') if p.isdigit() and parent(p) == str(os.getpid())]
        print(threading.active_count(), children)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1 []\n"


def test_executor_closes_at_exit() -> None:
    # An executor left open is closed when the interpreter exits: its idle workers do not outlive it.
    code = (
        "from skyrl_gym.sandbox import get_default_executor\n"
        "print(get_default_executor().run('print(5)').stdout, end='')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout == "5\n"
    assert done.stderr == ""


def test_interpreter_outside_bwrap_is_usable_by_the_private_uid() -> None:
    own = inspect_interpreter(sys.executable)
    private = os.geteuid() == 0 and not own.usable_by_any_uid()
    with CodeExecutor(pool_size=1, isolation="rlimits") as executor:
        # A private interpreter (pyenv under /root) is replaced by the system one; otherwise it is kept.
        assert executor.python == (SYSTEM_PYTHON if private else sys.executable)
        assert executor.run("import json\nprint(json.dumps([1]))").stdout == "[1]\n"
    if private:
        with pytest.raises(SandboxUnavailableError, match="unprivileged"):
            CodeExecutor(pool_size=0, isolation="rlimits", python=sys.executable)


def require_bwrap() -> None:
    """Skip by hand on a machine without bubblewrap; fail in CI (``SKYRL_REQUIRE_ALL=1``), which installs it."""
    try:
        check_mode("bwrap")
    except SandboxUnavailableError as exc:
        if os.environ.get("SKYRL_REQUIRE_ALL") == "1":
            pytest.fail(f"bwrap test cannot run and SKYRL_REQUIRE_ALL=1: {exc}", pytrace=False)
        pytest.skip(str(exc))


def test_interpreter_path_resolves_directories_but_keeps_the_venv_link(
    open_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A venv's bin/python links to the base interpreter: resolving the link itself would lose the venv.
    real = os.path.realpath(os.path.join(open_dir, "real"))
    os.makedirs(os.path.join(real, "bin"))
    os.symlink(sys.executable, os.path.join(real, "bin", "python"))
    os.symlink(real, os.path.join(open_dir, "linked"))
    expected = os.path.join(real, "bin", "python")
    assert normalize_interpreter_path(os.path.join(open_dir, "linked", "bin", "..", "bin", "python")) == expected
    assert normalize_interpreter_path(os.path.join(open_dir, "linked", "..", "real", "bin", "python")) == expected
    monkeypatch.chdir(open_dir)
    assert normalize_interpreter_path("linked/bin/python") == expected
    assert normalize_interpreter_path("python3") == "python3"  # a command name is looked up on PATH, unchanged


def test_venv_reached_through_dot_dot_runs_in_bwrap(open_dir: str) -> None:
    # bwrap execs the interpreter path inside the sandbox, where a directory before ".." may not exist.
    require_bwrap()
    venv = os.path.realpath(os.path.join(open_dir, "venv"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = subprocess.run([f"{venv}/bin/python", "-c", purelib], capture_output=True, text=True, check=True)
    Path(site.stdout.strip(), "venv_marker.py").write_text("WHERE = 'venv'\n")
    os.mkdir(os.path.join(open_dir, "detour"))
    dotted = os.path.join(open_dir, "detour", "..", "venv", "bin", "python")
    with CodeExecutor(pool_size=1, isolation="bwrap", python=dotted) as executor:
        assert executor.python == os.path.join(venv, "bin", "python")
        ran = executor.run("import sys, venv_marker\nprint(venv_marker.WHERE, sys.prefix)")
    assert (ran.stdout, ran.stderr) == (f"venv {venv}\n", "")


def test_sys_executable_with_dot_dot_runs_in_bwrap(open_dir: str) -> None:
    # Started by a relative path, sys.executable keeps its "..": /tmp/x/detour/../../../venv/bin/python.
    require_bwrap()
    detour = os.path.join(open_dir, "detour")
    os.mkdir(detour)
    code = (
        "import sys\n"
        "from skyrl_gym.sandbox import CodeExecutor\n"
        "assert '..' in sys.executable.split('/'), sys.executable\n"
        "with CodeExecutor(pool_size=1, isolation='bwrap') as executor:\n"
        "    print(executor.python)\n"
        "    print(executor.run('import sys; print(sys.prefix)').stdout, end='')\n"
    )
    relative = os.path.relpath(sys.executable, detour)
    done = subprocess.run([relative, "-c", code], cwd=detour, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{normalize_interpreter_path(sys.executable)}\n{os.path.realpath(sys.prefix)}\n"


def test_worker_killed_while_idle_is_replaced(host: Any) -> None:
    with CodeExecutor(pool_size=1) as executor:
        pool = executor._pool
        assert host.wait_until(lambda: pool.idle_count() == 1)
        idle = pool._ready[0]
        os.killpg(idle.pid, signal.SIGKILL)
        if executor.fork_server:
            # The pool watches its fork servers: a dead idle one is replaced without waiting for a run.
            assert host.wait_until(lambda: pool.idle_count() == 1 and pool._ready[0] is not idle)
        else:
            assert host.wait_until(lambda: os.waitid(os.P_PID, idle.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT))
        result = executor.run("print('fresh')")
        assert result.stdout == "fresh\n"
        assert result.exit_code == 0


def test_interpreter_that_cannot_start_is_an_error() -> None:
    executor = CodeExecutor(pool_size=0, preload=["no_such_module_for_the_sandbox"])
    with executor, pytest.raises(SandboxStartError, match="no_such_module_for_the_sandbox"):
        executor.run("print(1)")
