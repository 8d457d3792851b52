"""The grading harness: runs a task's hidden tests inside the grading sandbox and reports through its own channel.

:mod:`skyrl_agent.tasks.grading` writes this file (standard library only, python ≥ 3.8) into a directory of its
own outside the repository under test, with a one-time token in ``DIR/token``, and runs it as
``PYTHON -I harness.py run --dir DIR … -- child …``. Two processes:

``run`` (the supervisor)
    Reads and deletes the token, then starts the test process with a clean environment. The test process's stdout
    and stderr go to a pipe that the supervisor drains without pause into ``DIR/test.log`` (the first
    ``--log-cap`` bytes and the last 64 KiB are kept, the bytes between are counted), so the tests never block on
    output. Results come on a second pipe, each line signed with a token the test process got on its stdin; a
    line without it is counted as forged. At ``--timeout`` the test process group gets SIGTERM, and SIGKILL 5 s
    later. The supervisor writes the results to ``DIR/report.jsonl`` and prints one JSON line: the token, exit
    code, timed out, log size, truncated, forged lines and the SHA-256 of the report.

``child`` (the test process)
    Imports pytest and the task's declared plugins while nothing of the repository is on ``sys.path`` (``-I``:
    no current directory, no ``PYTHON*`` variables, no user site), and only then puts the repository first on
    ``sys.path`` and calls ``pytest.main`` with plugin autoload off, an explicit ``--rootdir``, ``-c`` config and
    ``--confcutdir``, and :class:`Reporter` as a plugin object. The reporter sends one line per test phase and a
    final line when the session ends; a run that dies before the end has no final line.

The reporter is also a tripwire. It hashes the hidden test files before any code of the repository runs and
checks each again as pytest starts collecting it (a test module rewritten on disk by code under test is
caught), and at the end of the session it checks that the pytest functions which decide an outcome are the ones
it saw at the start and that no plugin was registered from a module of the repository other than a
``conftest.py``. Findings are reported as ``tampered``. Code under test runs in the test process, so this raises
the bar without being a wall (docs/agent/tasks.md, "What grading guarantees").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

KEEP_TAIL = 64 * 1024  # bytes at the end of the log always kept, past the cap
KILL_AFTER_S = 5.0
# pytest functions that turn a test call into its outcome: replacing one of them forges results.
WATCHED = (
    ("_pytest.runner", "call_and_report"),
    ("_pytest.runner", "runtestprotocol"),
    ("_pytest.runner", "pytest_runtest_makereport"),
    ("_pytest.runner", "check_interactive_exception"),
    ("_pytest.skipping", "pytest_runtest_makereport"),
    ("_pytest.reports", "TestReport"),
    ("_pytest.python", "Function"),
)
WATCHED_ATTRS = (("_pytest.reports", "TestReport", "from_item_and_call"), ("_pytest.reports", "TestReport", "__init__"))


def supervise(argv: list[str]) -> None:
    """``run`` mode: start the test process (``rest``: ``child`` and its options), drain its pipes, time it out."""
    opts, rest = _options(argv, ("--dir", "--log-cap", "--timeout"))
    directory, cap, limit = opts["--dir"], int(opts["--log-cap"]), float(opts["--timeout"])
    token_path = os.path.join(directory, "token")
    with open(token_path) as handle:
        token = handle.read().strip()
    os.unlink(token_path)
    start = time.monotonic()
    child_token = os.urandom(16).hex()
    report_r, report_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), *rest[:1], "--report-fd", str(report_w), *rest[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_clean_env(),
        start_new_session=True,
        pass_fds=(report_w,),
    )
    os.close(report_w)
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(child_token.encode() + b"\n")
        proc.stdin.close()
    drained = _drain(proc, report_r, os.path.join(directory, "test.log"), cap, start + limit)
    records, forged = _signed(drained.pop("report"), child_token)
    body = "".join(json.dumps(record) + "\n" for record in records).encode()
    with open(os.path.join(directory, "report.jsonl"), "wb") as handle:
        handle.write(body)
    summary = {"token": token, "exit_code": proc.returncode, **drained, "forged": forged}
    summary.update(report_sha256=hashlib.sha256(body).hexdigest(), duration_s=round(time.monotonic() - start, 3))
    print(json.dumps(summary))


def _signed(raw: bytes, token: str) -> tuple[list[Any], int]:
    """The records of the lines signed with ``token``, and how many lines were not."""
    records, forged, prefix = [], 0, token.encode() + b" "
    for line in raw.splitlines():
        if line.startswith(prefix):
            try:
                records.append(json.loads(line[len(prefix) :]))
                continue
            except ValueError:
                pass
        forged += 1
    return records, forged


def _clean_env() -> dict[str, str]:
    # PATH and locale from the sandbox, nothing else: PYTHON* and PYTEST_* variables are the grader's to set.
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    return env


def _drain(proc: subprocess.Popen[bytes], report_fd: int, log_path: str, cap: int, deadline: float) -> dict[str, Any]:
    """Copy the test output to ``log_path`` (the head up to ``cap``, then a tail ring) and collect the report pipe.

    Ends when both pipes are closed, or once the test process has exited and a second has passed (a daemon it
    left behind may hold a pipe open). Returns the raw report bytes, the bytes of output, whether some of them
    were dropped, and whether the deadline passed.
    """
    import select

    assert proc.stdout is not None
    out_fd = proc.stdout.fileno()
    open_fds, report = {out_fd, report_fd}, bytearray()
    written, dropped, tail = 0, 0, b""
    timed_out, kill_at, exited_at = False, float("inf"), float("inf")
    with open(log_path, "wb") as log:
        while open_fds:
            now = time.monotonic()
            if exited_at == float("inf") and proc.poll() is not None:
                exited_at = now
            if now > exited_at + 1.0:
                break
            if not timed_out and now >= deadline:
                timed_out, kill_at = True, now + KILL_AFTER_S
                _signal_group(proc.pid, signal.SIGTERM)
            if now >= kill_at:
                _signal_group(proc.pid, signal.SIGKILL)
                kill_at = float("inf")
            wake = min(deadline if not timed_out else kill_at, now + 1.0)
            ready, _, _ = select.select(list(open_fds), [], [], max(0.0, wake - now))
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                elif fd == report_fd:
                    report += chunk
                else:
                    room = max(cap - written, 0)
                    log.write(chunk[:room])
                    written += min(room, len(chunk))
                    if len(chunk) > room:
                        tail = (tail + chunk[room:])[-KEEP_TAIL:]
                        dropped += len(chunk) - room
        if dropped > len(tail):
            log.write(b"\n[log truncated: %d bytes dropped past the %d-byte cap]\n" % (dropped - len(tail), cap))
        log.write(tail)
    _signal_group(proc.pid, signal.SIGKILL)  # whatever the tests left running behind them
    proc.wait()
    os.close(report_fd)
    return {"report": bytes(report), "timed_out": timed_out, "log_bytes": written + dropped,
            "log_truncated": dropped > len(tail)}  # fmt: skip


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signum)


def run_tests(argv: list[str]) -> None:
    """``child`` mode: import the runner first, then the repository; run pytest with :class:`Reporter`."""
    opts, pytest_args = _options(argv, ("--report-fd", "--workdir", "--config", "--plugins", "--guard"))
    token = sys.stdin.buffer.readline().strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the tests read nothing, and cannot read the token again
    os.close(devnull)
    import importlib

    import pytest

    declared = [importlib.import_module(name) for name in opts["--plugins"].split(",") if name]
    workdir = os.path.realpath(opts["--workdir"])
    with open(opts["--guard"]) as handle:
        guard = [line for line in handle.read().splitlines() if line]
    reporter = Reporter(int(opts["--report-fd"]), token, workdir, guard)
    os.chdir(workdir)
    sys.path.insert(0, workdir)  # what `python -m pytest` gives the tests, added after the runner is imported
    args = ["-c", opts["--config"], "--rootdir", workdir, "--confcutdir", workdir, *pytest_args]
    sys.exit(int(pytest.main(args, plugins=[*declared, reporter])))


class Reporter:
    """A pytest plugin object: one signed line per test phase, and a final line when the session ends."""

    def __init__(self, fd: int, token: bytes, workdir: str, guard: list[str]) -> None:
        self._fd, self._token, self._workdir = fd, token, workdir
        self._watched = _watched_identities()
        self._hashes = {os.path.join(workdir, path): _digest(os.path.join(workdir, path)) for path in guard}
        self._problems: list[str] = []
        self._collected = 0

    def pytest_collectstart(self, collector: Any) -> None:
        """A hidden test file must be what the grader wrote when pytest imports it, with no cached bytecode."""
        path = str(getattr(collector, "path", None) or getattr(collector, "fspath", ""))
        expected = self._hashes.get(path)
        if expected is None:
            return
        if _digest(path) != expected:
            self._problems.append(f"{os.path.relpath(path, self._workdir)} changed while the tests ran")
        cache = os.path.join(os.path.dirname(path), "__pycache__")
        stem = os.path.splitext(os.path.basename(path))[0] + "."
        with contextlib.suppress(OSError):
            for name in os.listdir(cache):
                if name.startswith(stem):
                    os.unlink(os.path.join(cache, name))

    def pytest_collectreport(self, report: Any) -> None:
        """A file that fails to collect is an ERROR under its path (its tests are then missing)."""
        if report.failed:
            self._write({"t": "test", "id": report.nodeid, "s": "ERROR", "when": "collect"})

    def pytest_collection_finish(self, session: Any) -> None:
        """Remember how many tests were collected."""
        self._collected = len(session.items)

    def pytest_runtest_logreport(self, report: Any) -> None:
        """One line per phase that decides a status."""
        status = _status(report)
        if status is not None:
            self._write({"t": "test", "id": report.nodeid, "s": status, "when": report.when})

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        """The final line: exit status, tests collected, and what the tripwire found."""
        problems = [*self._problems, *(f"{module}.{name} was replaced" for module, name in _changed(self._watched))]
        problems += [f"a plugin was registered from {path}" for path in _tree_plugins(session.config, self._workdir)]
        self._write({"t": "finish", "exit": int(exitstatus), "collected": self._collected, "tampered": problems})

    def _write(self, record: dict[str, Any]) -> None:
        data = self._token + b" " + json.dumps(record).encode() + b"\n"
        while data:
            data = data[os.write(self._fd, data) :]


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def _status(report: Any) -> str | None:
    """The SWE-bench status of one phase: PASSED/FAILED/SKIPPED/XFAIL/XPASS for the call, ERROR for fixtures."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "XPASS" if xfail else "PASSED"
        if report.skipped:
            return "XFAIL" if xfail else "SKIPPED"
        return "FAILED"
    if report.failed:
        return "ERROR"
    if report.when == "setup" and report.skipped:
        return "XFAIL" if xfail else "SKIPPED"
    return None


def _watched_identities() -> dict[tuple[str, str], object]:
    import importlib

    found: dict[tuple[str, str], object] = {}
    for module, name in WATCHED:
        found[(module, name)] = getattr(importlib.import_module(module), name, None)
    for module, cls, attr in WATCHED_ATTRS:
        owner = getattr(sys.modules.get(module), cls, None)
        found[(module, f"{cls}.{attr}")] = owner.__dict__.get(attr) if owner is not None else None
    return found


def _changed(before: dict[tuple[str, str], object]) -> list[tuple[str, str]]:
    after = _watched_identities()
    return [key for key, value in before.items() if after.get(key) is not value]


def _tree_plugins(config: Any, workdir: str) -> list[str]:
    """Files inside the repository, other than conftest.py files, whose objects are registered as plugins."""
    found: list[str] = []
    for _name, plugin in config.pluginmanager.list_name_plugin():
        module = plugin if hasattr(plugin, "__file__") else sys.modules.get(getattr(plugin, "__module__", ""))
        path = getattr(module, "__file__", None)
        if not path:
            continue
        real = os.path.realpath(path)
        inside = real.startswith(workdir.rstrip("/") + "/")
        if inside and os.path.basename(real) != "conftest.py" and real not in found:
            found.append(real)
    return found


def _options(argv: list[str], names: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """``--name value`` pairs for ``names`` up to ``--``; what follows ``--`` is returned as is."""
    opts: dict[str, str] = {}
    index = 0
    while index < len(argv) and argv[index] != "--":
        if argv[index] not in names or index + 1 >= len(argv):
            sys.exit(f"harness: unexpected argument {argv[index]!r}")
        opts[argv[index]] = argv[index + 1]
        index += 2
    missing = [name for name in names if name not in opts]
    if missing:
        sys.exit(f"harness: missing {', '.join(missing)}")
    return opts, argv[index + 1 :]


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "child"):
        sys.exit("usage: harness.py run|child OPTIONS -- PYTEST_ARGS")
    (supervise if sys.argv[1] == "run" else run_tests)(sys.argv[2:])
