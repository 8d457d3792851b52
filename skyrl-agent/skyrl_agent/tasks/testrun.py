"""The grading test run: runs a task's hidden tests inside the grading sandbox and reports through its own channel.

:mod:`skyrl_agent.tasks.grading` writes this file (standard library only, python ≥ 3.8) into a directory of its
own outside the repository under test, with a one-time token in ``DIR/token``, and runs it as
``PYTHON -I testrun.py run --dir DIR … -- child …``. Two processes:

``run`` (the supervisor)
    Reads and deletes the token, makes itself undumpable (the test process, running as the same user, can then
    neither read nor write its memory or descriptors through ``/proc``), then starts the test process with a
    clean environment. The test process's stdout and stderr go to a pipe that the supervisor drains without pause
    into ``DIR/test.log`` (the first ``--log-cap`` bytes and the last 64 KiB are kept, the bytes between are
    counted), so the tests never block on output. Results come on a second pipe, each line signed with a token
    the test process got on its stdin; a line without it is counted as forged. At ``--timeout`` the test process
    group gets SIGTERM, and SIGKILL 5 s later. The supervisor writes the results to ``DIR/report.jsonl`` and
    prints one JSON line: the token, exit code, timed out, log size, truncated, forged lines, CPU seconds, and the
    SHA-256 of the report.

``child`` (the test process)
    Loads the tripwire (``tripwire.py`` beside this file), imports pytest, its own plugins and the task's declared
    plugins while nothing of the repository is on ``sys.path`` (``-I``: no current directory, no ``PYTHON*``
    variables, no user site), arms the tripwire (:mod:`skyrl_agent.tasks.tripwire`: an audit hook, guarded
    modules and a snapshot of the runner), and only then puts the repository first on ``sys.path`` and calls
    ``pytest.main`` with plugin autoload off, an explicit ``--rootdir``, ``-c`` config and ``--confcutdir``, and
    :class:`Reporter` as a plugin object.

The reporter sends raw facts, not statuses: per test phase its outcome, whether it was an xfail, whether a skip
or xfail was declared by the tests themselves (a marker, or raised from a hidden test file or a ``conftest.py``,
not from the code under test), and whether the call phase reached the test function at all. The grader turns
them into statuses. It hashes the hidden test files before any code of the repository runs and checks each again
as pytest starts collecting it, and at the end it checks that no plugin was registered from a module of the
repository other than a ``conftest.py`` and that every hook implementation belongs to a registered plugin.
Findings are sent the moment they are made, as ``tamper`` lines, and make the verdict ``tampered``. Code under
test runs in the test process, so this raises the bar without being a wall (docs/agent/tasks.md, "What grading
guarantees").
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
from collections.abc import Callable
from typing import Any

KEEP_TAIL = 64 * 1024  # bytes at the end of the log always kept, past the cap
KILL_AFTER_S = 5.0
CHECK_EVERY_S = 0.05  # the tripwire's check of the runner's critical classes and modules, during the tests


def supervise(argv: list[str]) -> None:
    """``run`` mode: start the test process (``rest``: ``child`` and its options), drain its pipes, time it out."""
    opts, rest = _options(argv, ("--dir", "--log-cap", "--timeout"))
    directory, cap, limit = opts["--dir"], int(opts["--log-cap"]), float(opts["--timeout"])
    token_path = os.path.join(directory, "token")
    with open(token_path) as handle:
        token = handle.read().strip()
    os.unlink(token_path)
    _undumpable()
    start = time.monotonic()
    child_token = os.urandom(16).hex()
    report_r, report_w = os.pipe()
    log = open(os.path.join(directory, "test.log"), "wb")  # noqa: SIM115 (before the tests start: theirs to race)
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
    with log:
        drained = _drain(proc, report_r, log, cap, start + limit)
    records, forged = _signed(drained.pop("report"), child_token)
    body = "".join(json.dumps(record) + "\n" for record in records).encode()
    summary = {"token": token, "exit_code": proc.returncode, **drained, "forged": forged}
    try:  # the tests ran as this user and may have put anything at this path: a failure is theirs, and reported
        fd = os.open(os.path.join(directory, "report.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW)
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
    except OSError as exc:
        summary["report_error"] = f"{type(exc).__name__}: {exc}"
    summary.update(report_sha256=hashlib.sha256(body).hexdigest(), duration_s=round(time.monotonic() - start, 3))
    print(json.dumps(summary))


class _CpuWatch:
    """Samples the test process's CPU time, to tell at the deadline whether it was working or asleep.

    The share is taken over the second half of the run, so the start-up of pytest does not count: a hang that
    sleeps (or waits on something that never comes) uses nothing there, a slow or starved run uses some.
    """

    def __init__(self, pid: int, start: float) -> None:
        self._path, self._start = f"/proc/{pid}/stat", start
        self._samples: list[tuple[float, float]] = []
        self._tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0

    def sample(self, now: float) -> None:
        cpu = self._cpu_s()
        if cpu is not None:
            self._samples.append((now, cpu))

    def share(self, now: float) -> float | None:
        """CPU seconds per second over the second half of the run so far; None when /proc cannot tell."""
        self.sample(now)
        middle = self._start + (now - self._start) / 2
        later = [sample for sample in self._samples if sample[0] >= middle]
        if len(later) < 2 or later[-1][0] - later[0][0] <= 0:
            return None
        return round((later[-1][1] - later[0][1]) / (later[-1][0] - later[0][0]), 4)

    def _cpu_s(self) -> float | None:
        try:
            with open(self._path) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            return sum(int(value) for value in fields[11:15]) / self._tick  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            return None


def _undumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): a process of the same user may no longer ptrace this one or open its /proc files."""
    with contextlib.suppress(Exception):  # not Linux, or no libc: the other guards still hold
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)


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


def _drain(proc: subprocess.Popen[bytes], report_fd: int, log: Any, cap: int, deadline: float) -> dict[str, Any]:
    """Copy the test output to ``log`` (the head up to ``cap``, then a tail ring) and collect the report pipe.

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
    cpu, busy = _CpuWatch(proc.pid, time.monotonic()), None
    period = min(1.0, max(0.05, (deadline - time.monotonic()) / 20))  # enough CPU samples in a short run
    while open_fds:
        now = time.monotonic()
        if exited_at == float("inf") and proc.poll() is not None:
            exited_at = now
        if now > exited_at + 1.0:
            break
        if not timed_out:
            cpu.sample(now)
        if not timed_out and now >= deadline:
            timed_out, kill_at, busy = True, now + KILL_AFTER_S, cpu.share(now)
            _signal_group(proc.pid, signal.SIGTERM)
        if now >= kill_at:
            _signal_group(proc.pid, signal.SIGKILL)
            kill_at = float("inf")
        wake = min(deadline if not timed_out else kill_at, now + period)
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
            "log_truncated": dropped > len(tail), "busy_share": busy}  # fmt: skip


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signum)


def run_tests(argv: list[str]) -> None:
    """``child`` mode: arm the tripwire over the runner before the repository is imported; run pytest."""
    opts, pytest_args = _options(argv, ("--report-fd", "--workdir", "--config", "--plugins", "--guard"))
    token = sys.stdin.buffer.readline().strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the tests read nothing, and cannot read the token again
    os.close(devnull)
    import importlib

    send, tamper = _channel(int(opts["--report-fd"]), token)
    plugins = [name for name in opts["--plugins"].split(",") if name]
    tripwire = _load_tripwire().Tripwire(tamper, tuple(name.split(".")[0] for name in plugins))
    import pytest

    _import_runner(importlib)
    declared = [importlib.import_module(name) for name in plugins]
    workdir = os.path.realpath(opts["--workdir"])
    with open(opts["--guard"]) as handle:
        guard = [line for line in handle.read().splitlines() if line]
    for name in ("pytest_pyfunc_call", "pytest_runtest_call", "pytest_runtest_makereport"):
        pytest.hookimpl(tryfirst=True)(getattr(Reporter, name))
    reporter = Reporter(send, tripwire, workdir, guard)
    tripwire.arm()  # from here on, code under test may import: nothing of the repository has run yet
    os.chdir(workdir)
    sys.path.insert(0, workdir)  # what `python -m pytest` gives the tests, added after the runner is imported
    args = ["-c", opts["--config"], "--rootdir", workdir, "--confcutdir", workdir, *pytest_args]
    sys.exit(int(pytest.main(args, plugins=[*declared, reporter])))


def _load_tripwire() -> Any:
    """The tripwire module, from the file beside this one (``-I`` keeps this directory off ``sys.path``)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tripwire.py")
    spec = importlib.util.spec_from_file_location("skyrl_tripwire", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["skyrl_tripwire"] = module
    spec.loader.exec_module(module)
    return module


def _import_runner(importlib: Any) -> None:
    """Import pytest's own plugins now, so that they are in the tripwire's snapshot before any test code runs."""
    from _pytest.config import default_plugins

    for name in (*default_plugins, "unittest", "python", "runner", "reports", "skipping", "outcomes"):
        with contextlib.suppress(ImportError):
            importlib.import_module("_pytest." + name)


def _channel(fd: int, token: bytes) -> tuple[Callable[[dict[str, Any]], None], Callable[[str], None]]:
    """The signed report pipe's two writers: a record, and a tamper finding; each line written at once.

    Closures over ``os.write`` and ``json.dumps`` as they are now, not methods: code under test that replaces
    those, or assigns to a class attribute (which no hook sees), changes nothing here.
    """
    write, dumps = os.write, json.dumps

    def send(record: dict[str, Any]) -> None:
        data = token + b" " + dumps(record).encode() + b"\n"
        while data:
            data = data[write(fd, data) :]

    def tamper(problem: str) -> None:
        send({"t": "tamper", "what": problem})

    return send, tamper


class Reporter:
    """A pytest plugin object: raw facts of each test phase, tamper findings at once, a final line at the end.

    The statuses are decided by the grader from these facts (``skyrl_agent.tasks.grading``), not here.
    """

    def __init__(self, send: Callable[[dict[str, Any]], None], tripwire: Any, workdir: str, guard: list[str]) -> None:
        import _pytest.outcomes
        import _pytest.python

        self._send, self._tripwire, self._workdir = send, tripwire, workdir
        self._hashes = {os.path.join(workdir, path): _digest(os.path.join(workdir, path)) for path in guard}
        self._sources = {os.path.join(workdir, path): _declaring_sources(workdir, path) for path in guard}
        self._collected, self._modules, self._next_check = 0, 0, 0.0
        self._pyfunc_run = _pytest.python.Function.runtest
        self._verdict_exceptions = (_pytest.outcomes.Skipped, _pytest.outcomes.XFailed)
        self._runner_dirs = tuple(_package_dir(name) for name in ("pytest", "_pytest", "pluggy", "unittest"))
        self._entered: dict[str, set[str]] = {"pyfunc": set(), "call": set()}
        self._facts: dict[tuple[str, str], tuple[Any, Any, bool]] = {}  # (node, phase) → (item, excinfo, ran)

    def pytest_collectstart(self, collector: Any) -> None:
        """A hidden test file must be what the grader wrote when pytest imports it, with no cached bytecode."""
        self._watch()
        path = str(getattr(collector, "path", None) or getattr(collector, "fspath", ""))
        expected = self._hashes.get(path)
        if expected is None:
            return
        if _digest(path) != expected:
            self._tripwire.found(f"{os.path.relpath(path, self._workdir)} changed while the tests ran")
        cache = os.path.join(os.path.dirname(path), "__pycache__")
        stem = os.path.splitext(os.path.basename(path))[0] + "."
        with contextlib.suppress(OSError):
            for name in os.listdir(cache):
                if name.startswith(stem):
                    os.unlink(os.path.join(cache, name))

    def pytest_collectreport(self, report: Any) -> None:
        """A file that fails to collect is an ERROR under its path (its tests are then missing)."""
        if report.failed:
            self._send({"t": "test", "id": report.nodeid, "when": "collect", "outcome": "failed"})

    def pytest_collection_finish(self, session: Any) -> None:
        """Remember how many tests were collected."""
        self._collected = len(session.items)

    def pytest_pyfunc_call(self, pyfuncitem: Any) -> None:
        """(Runs first, returns nothing.) The test function was called: a call phase that never got here ran nothing."""
        self._entered["pyfunc"].add(pyfuncitem.nodeid)

    def pytest_runtest_call(self, item: Any) -> None:
        """(Runs first.) The item's test ran (for items whose test is not a plain function)."""
        self._entered["call"].add(item.nodeid)

    def pytest_runtest_makereport(self, item: Any, call: Any) -> None:
        """(Runs first, returns nothing.) What the phase's report line needs besides the report itself.

        Plain hook implementations, not wrappers: an old-style wrapper per phase cost a 5,000-test run a second.
        """
        plain = type(item).runtest is self._pyfunc_run
        ran = item.nodeid in self._entered["pyfunc" if plain else "call"]
        self._facts[(item.nodeid, call.when)] = (item, call.excinfo, ran)

    def _declared(self, item: Any, excinfo: Any) -> bool:
        """Whether a phase's skip or xfail was declared by the tests (module docstring)."""
        origin = None
        if excinfo is not None and isinstance(excinfo.value, self._imperative()):
            origin = self._origin(excinfo.tb)
        # Raised by pytest itself (a marker's skip or xfail), or no exception: the markers decide.
        return self._marked_by_tests(item) if origin is None else self._tests_own(origin)

    def pytest_runtest_logreport(self, report: Any) -> None:
        """One line per phase: its outcome, whether it was an xfail, declared by the tests, and actually ran."""
        self._watch()
        now = time.monotonic()
        if now >= self._next_check:  # at most every CHECK_EVERY_S: a check per phase doubled a 5,000-test run
            self._tripwire.verify(critical=True)
            self._next_check = now + CHECK_EVERY_S
        item, excinfo, ran = self._facts.pop((report.nodeid, report.when), (None, None, False))
        skip_or_xfail = report.skipped or hasattr(report, "wasxfail")  # the only phases "declared" decides
        declared = item is not None and skip_or_xfail and self._declared(item, excinfo)
        record = {"t": "test", "id": report.nodeid, "when": report.when, "outcome": report.outcome,
                  "xfail": hasattr(report, "wasxfail"), "declared": declared, "ran": ran}  # fmt: skip
        self._send(record)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        """The final line, after the tripwire's last check: exit status and tests collected."""
        for path in _tree_plugins(session.config, self._workdir):
            self._tripwire.found(f"a plugin was registered from {path}")
        for problem in _foreign_hookimpls(session.config.pluginmanager):
            self._tripwire.found(problem)
        self._tripwire.verify()
        self._send({"t": "finish", "exit": int(exitstatus), "collected": self._collected})

    def _watch(self) -> None:
        """Snapshot the runner's modules pytest imported since the last look (cheap when none were)."""
        if len(sys.modules) != self._modules:
            self._tripwire.watch_new()
            self._modules = len(sys.modules)

    def _imperative(self) -> tuple[type, ...]:
        unittest = sys.modules.get("unittest")
        skip_test = getattr(unittest, "SkipTest", None)
        return (*self._verdict_exceptions, *([skip_test] if isinstance(skip_test, type) else []))

    def _marked_by_tests(self, item: Any) -> bool:
        """Whether the item's skip/xfail markers are written in its test file or a ``conftest.py`` above it.

        Read before any code under test ran: a marker that code injects into a test module at run time (its
        ``pytestmark``) is in neither, and does not count.
        """
        names = [name for name in ("skip", "skipif", "xfail") if any(True for _ in item.iter_markers(name))]
        if not names:
            return False
        path = os.path.realpath(str(getattr(item, "path", None) or getattr(item, "fspath", "")))
        sources = self._sources.get(path, [])
        return all(any(name in text for text in sources) for name in names)

    def _origin(self, tb: Any) -> str | None:
        """The file of the innermost frame outside the runner in a skip/xfail's traceback (None: the runner's own)."""
        origin = None
        while tb is not None:
            path = os.path.realpath(tb.tb_frame.f_code.co_filename)
            if not path.startswith(self._runner_dirs):
                origin = path
            tb = tb.tb_next
        return origin

    def _tests_own(self, origin: str) -> bool:
        """Whether a skip/xfail raised from ``origin`` is the tests' own.

        The tests' own code: a hidden test file, a ``conftest.py`` (restored to the task's by the grader), or a
        file outside the repository (installed packages). A skip or xfail raised by the code under test is not a
        pass of any kind.
        """
        if not origin.startswith(self._workdir.rstrip("/") + "/"):
            return True
        return origin in self._hashes or os.path.basename(origin) == "conftest.py"


def _declaring_sources(workdir: str, path: str) -> list[str]:
    """The text of the test file ``path`` and of each ``conftest.py`` from its directory up to ``workdir``."""
    files, parts = [os.path.join(workdir, path)], path.split("/")[:-1]
    files += [os.path.join(workdir, *parts[:depth], "conftest.py") for depth in range(len(parts), -1, -1)]
    texts = []
    for file in files:
        with contextlib.suppress(OSError), open(file, encoding="utf-8", errors="replace") as handle:
            texts.append(handle.read())
    return texts


def _package_dir(name: str) -> str:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) or ""
    return os.path.realpath(os.path.dirname(path)) + os.sep if path else "\0"


def _foreign_hookimpls(pluginmanager: Any) -> list[str]:
    """Hook implementations whose function is not one of the plugin's own: put into pluggy's lists by hand.

    ``register`` only takes what the plugin object or its class defines.
    """
    found, owned = [], {}  # type: list[str], dict[int, set[int]]
    for name in dir(pluginmanager.hook):
        caller = getattr(pluginmanager.hook, name, None)
        for impl in getattr(caller, "get_hookimpls", lambda: [])():
            if id(impl.plugin) not in owned:
                owned[id(impl.plugin)] = _own_functions(impl.plugin)
            if id(getattr(impl.function, "__func__", impl.function)) not in owned[id(impl.plugin)]:
                found.append(f"a {name} implementation was put into pluggy without a plugin that defines it")
    return found


def _own_functions(plugin: Any) -> set[int]:
    """Ids of the functions a plugin object (module or instance) or its classes define."""
    namespaces = [vars(plugin)] if hasattr(plugin, "__dict__") else []
    namespaces += [vars(cls) for cls in type(plugin).__mro__]
    ids = set()
    for namespace in namespaces:
        for value in list(namespace.values()):
            value = getattr(value, "__func__", value)  # static and class methods, bound methods
            ids.add(id(value))
    return ids


def _digest(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


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
            sys.exit(f"testrun: unexpected argument {argv[index]!r}")
        opts[argv[index]] = argv[index + 1]
        index += 2
    missing = [name for name in names if name not in opts]
    if missing:
        sys.exit(f"testrun: missing {', '.join(missing)}")
    return opts, argv[index + 1 :]


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "child"):
        sys.exit("usage: testrun.py run|child OPTIONS -- PYTEST_ARGS")
    (supervise if sys.argv[1] == "run" else run_tests)(sys.argv[2:])
