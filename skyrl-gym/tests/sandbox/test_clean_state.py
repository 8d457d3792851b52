"""Every run starts from a clean interpreter: nothing of an earlier run is visible to a later one."""

from __future__ import annotations

import asyncio

from skyrl_gym.sandbox import CodeExecutor


def test_globals_do_not_leak_between_runs(shared_executor: CodeExecutor) -> None:
    assert shared_executor.run("secret = 42\nprint(secret)").stdout == "42\n"
    assert shared_executor.run("print('secret' in globals())").stdout == "False\n"


def test_module_state_does_not_leak(shared_executor: CodeExecutor) -> None:
    shared_executor.run("import json, sys\njson.injected = True\nsys.modules['planted'] = json\nsys.path.append('/x')")
    result = shared_executor.run("import json, sys\nprint(hasattr(json, 'injected'), 'planted' in sys.modules)")
    assert result.stdout == "False False\n"
    assert shared_executor.run("import sys\nprint('/x' in sys.path)").stdout == "False\n"


def test_builtins_patches_do_not_leak(shared_executor: CodeExecutor) -> None:
    shared_executor.run("import builtins\nbuiltins.print = lambda *a, **k: None\nbuiltins.len = None")
    assert shared_executor.run("print(len('abc'))").stdout == "3\n"


def test_files_do_not_survive_the_run(shared_executor: CodeExecutor) -> None:
    # The baseline may hold mount points of an interpreter that lives under the temp dir; a run adds nothing to it.
    listing = "import os\nprint(sorted(os.listdir('.')))"
    baseline = shared_executor.run(listing).stdout
    written = shared_executor.run("import os\nopen('notes.txt', 'w').write('hi')\nprint(os.getcwd())")
    assert written.exit_code == 0
    cwd = written.stdout.strip()
    check = f"import os\nprint(os.path.exists('notes.txt'), os.path.exists({cwd + '/notes.txt'!r}))"
    assert shared_executor.run(check).stdout == "False False\n"
    assert shared_executor.run(listing).stdout == baseline
    assert "notes.txt" not in baseline


def test_each_run_is_a_new_process(shared_executor: CodeExecutor) -> None:
    # A run that kills its own interpreter's state (exit with threads alive, os._exit) leaves nothing behind.
    shared_executor.run("import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()")
    shared_executor.run("import os\nos._exit(0)")
    result = shared_executor.run("import threading\nprint(threading.active_count())")
    assert result.stdout == "1\n"


def test_preloaded_modules_are_fresh_in_every_run() -> None:
    with CodeExecutor(pool_size=1, preload=["json", "fractions"]) as executor:
        check = "import sys\nprint('fractions' in sys.modules, hasattr(sys.modules['json'], 'mark'))"
        assert executor.run(check).stdout == "True False\n"
        executor.run("import json\njson.mark = 1")
        assert executor.run(check).stdout == "True False\n"


def test_async_runs_are_clean_too(shared_executor: CodeExecutor) -> None:
    async def main() -> list[str]:
        await shared_executor.arun("leak = 1")
        second = await shared_executor.arun("print('leak' in globals())")
        return [second.stdout]

    assert asyncio.run(main()) == ["False\n"]
