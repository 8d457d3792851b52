import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from skyrl_gym.envs.rlm import _process
from skyrl_gym.envs.rlm.repl import (
    BLOCKED_BUILTINS,
    DEFAULT_MAX_OUTPUT_CHARS,
    LM_ERROR_PREFIX,
    RLM_ERROR_PREFIX,
    PersistentREPL,
    REPLResult,
)

HELPERS = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched")


def upper_lm(prompts: list[str]) -> list[str]:
    return [prompt.upper() for prompt in prompts]


def echo_subcall(prompt: str, context: Any = None) -> str:
    return prompt if context is None else f"{prompt}:{context}"


@pytest.fixture
def repl() -> Iterator[PersistentREPL]:
    with PersistentREPL(context="the context", lm_callback=upper_lm, subcall_fn=echo_subcall, timeout=5) as r:
        yield r


def in_thread(func: Callable[[], REPLResult]) -> REPLResult:
    results: list[REPLResult] = []
    thread = threading.Thread(target=lambda: results.append(func()))
    thread.start()
    thread.join(30)
    assert results, "the REPL call did not return"
    return results[0]


# ----------------------------------------------------------------------------------------------------- basics


def test_variables_persist_across_runs(repl: PersistentREPL) -> None:
    assert repl.execute("x = 40\ndef add(a):\n    return a + x").stdout == ""
    assert repl.execute("x += 1\nprint(add(1))").stdout == "42\n"
    assert repl.globals["x"] == 41
    assert repl.locals is repl.globals


def test_print_capture_is_exact(repl: PersistentREPL, capsys: pytest.CaptureFixture[str]) -> None:
    result = repl.execute("print('a', 1, sep='-', end='!')\nprint()\nprint('  two  ')\nprint(None, [1])")
    assert result.stdout == "a-1!\n  two  \nNone [1]\n"
    assert result.stderr == ""
    assert result.error is None
    assert result.output == result.stdout
    assert capsys.readouterr().out == ""  # the process's own stdout is untouched


def test_context_is_available(repl: PersistentREPL) -> None:
    assert repl.execute("print(context.upper())").stdout == "THE CONTEXT\n"


def test_exception_gives_traceback_without_raising(repl: PersistentREPL) -> None:
    result = repl.execute("before = 1\ndef f():\n    return 1 / 0\nf()\nafter = 2")
    assert result.stdout == ""
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert 'File "<repl cell 1>", line 4, in <module>' in result.stderr
    assert "return 1 / 0" in result.stderr
    assert result.stderr.endswith("ZeroDivisionError: division by zero\n")
    assert result.error == "ZeroDivisionError: division by zero"
    assert "before" in repl.globals
    assert "after" not in repl.globals
    assert repl.execute("print(before)").stdout == "1\n"


def test_output_before_an_exception_is_kept(repl: PersistentREPL) -> None:
    result = repl.execute("print('partial')\nraise ValueError('bad')")
    assert result.stdout == "partial\n"
    assert result.output == "partial\n" + result.stderr
    assert result.error == "ValueError: bad"


def test_traceback_shows_lines_of_earlier_runs(repl: PersistentREPL) -> None:
    repl.execute("def broken():\n    return undefined_name")
    result = repl.execute("broken()")
    assert 'File "<repl cell 1>", line 2, in broken' in result.stderr
    assert "return undefined_name" in result.stderr
    assert "NameError" in result.stderr


@pytest.mark.parametrize("code", ["def f(:\n  pass", "x = (", "\tindented = 1\n  bad", "a\x00b", "(" * 300])
def test_unparseable_code_is_reported(repl: PersistentREPL, code: str) -> None:
    result = repl.execute(code)
    assert result.error is not None
    assert result.stderr
    assert not result.timed_out


def test_system_exit_and_keyboard_free_exceptions_do_not_escape(repl: PersistentREPL) -> None:
    assert repl.execute("exit()").error is not None
    assert repl.execute("raise SystemExit(3)").error == "SystemExit: 3"
    assert repl.execute("raise GeneratorExit").error == "GeneratorExit"
    assert repl.execute("print('alive')").stdout == "alive\n"


def test_execute_rejects_non_strings(repl: PersistentREPL) -> None:
    with pytest.raises(TypeError, match="code must be a str"):
        repl.execute(b"print(1)")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------- timeouts


def test_timeout_on_main_thread() -> None:
    with PersistentREPL(timeout=0.3) as repl:
        repl.execute("kept = 'yes'")
        started = time.monotonic()
        result = repl.execute("while True:\n    pass")
        assert time.monotonic() - started < 5
        assert result.timed_out
        assert not result.still_running
        assert result.error == "REPLTimeoutError: execution exceeded the 0.3 s time limit"
        assert result.stderr.startswith("REPLTimeoutError")
        assert repl.execute("print(kept)").stdout == "yes\n"


def test_timeout_is_not_swallowed_by_except_exception() -> None:
    with PersistentREPL(timeout=0.3) as repl:
        result = repl.execute("while True:\n    try:\n        while True: pass\n    except Exception:\n        pass")
        assert result.timed_out


def test_timeout_restores_an_outer_alarm() -> None:
    assert threading.current_thread() is threading.main_thread()
    calls: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: calls.append(signum))
    old_timer = signal.setitimer(signal.ITIMER_REAL, 50.0)
    try:
        with PersistentREPL(timeout=0.2) as repl:
            assert repl.execute("while True: pass").timed_out
            assert repl.execute("print(1)").stdout == "1\n"
        assert signal.getsignal(signal.SIGALRM) is not None
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 45.0 < remaining <= 50.0
        assert calls == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *old_timer)


def test_nested_repl_on_the_main_thread_times_out_on_its_own() -> None:
    child_results: list[REPLResult] = []

    def subcall(prompt: str, context: Any = None) -> str:
        with PersistentREPL(timeout=0.2) as child:
            child_results.append(child.execute(prompt))
        return "child done"

    with PersistentREPL(subcall_fn=subcall, timeout=10) as parent:
        result = parent.execute("print(rlm_query('while True: pass'))\nprint('parent continues')")
    assert child_results[0].timed_out
    assert result.stdout == "child done\nparent continues\n"
    assert not result.timed_out


def test_parent_timeout_interrupts_a_nested_repl() -> None:
    def subcall(prompt: str, context: Any = None) -> str:
        with PersistentREPL(timeout=30) as child:
            return child.execute(prompt).stdout

    with PersistentREPL(subcall_fn=subcall, timeout=0.3) as parent:
        started = time.monotonic()
        result = parent.execute("rlm_query('while True: pass')\nprint('not reached')")
        assert time.monotonic() - started < 5
    assert result.timed_out
    assert result.stdout == ""


def test_timeout_from_a_worker_thread() -> None:
    with PersistentREPL(timeout=0.3) as repl:
        repl.execute("kept = 7")
        started = time.monotonic()
        result = in_thread(lambda: repl.execute("while True:\n    pass"))
        assert time.monotonic() - started < 5
        assert result.timed_out
        assert not result.still_running  # a pure-Python loop is interrupted
        assert in_thread(lambda: repl.execute("print(kept)")).stdout == "7\n"


def test_worker_thread_run_that_swallows_timeouts_is_interrupted_or_reported() -> None:
    code = "n = 0\nwhile True:\n    try:\n        n += 1\n    except BaseException:\n        pass"
    with PersistentREPL(timeout=0.2) as repl:
        result = in_thread(lambda: repl.execute(code))
        assert result.timed_out
        if result.still_running:
            assert "keeps running in the background" in result.stderr


def test_worker_thread_runs_print_and_errors_like_the_main_thread(repl: PersistentREPL) -> None:
    assert in_thread(lambda: repl.execute("print('hi')")).stdout == "hi\n"
    assert in_thread(lambda: repl.execute("1/0")).error == "ZeroDivisionError: division by zero"


# ----------------------------------------------------------------------------------------------------- output


def test_output_is_capped() -> None:
    with PersistentREPL() as repl:
        result = repl.execute("for _ in range(50):\n    print('x' * 999)")
        assert result.stdout.startswith("x" * 999 + "\n")
        kept, note = result.stdout[:DEFAULT_MAX_OUTPUT_CHARS], result.stdout[DEFAULT_MAX_OUTPUT_CHARS:]
        assert set(kept) <= {"x", "\n"}
        assert note == "\n... [output truncated: 30000 more characters]\n"


def test_output_cap_is_configurable_and_bounds_memory() -> None:
    with PersistentREPL(max_output_chars=10, timeout=5) as repl:
        result = repl.execute("for _ in range(1000):\n    print('y' * 10_000)")
        assert result.stdout.startswith("y" * 10 + "\n... [output truncated:")
        assert len(result.stdout) < 100


def test_concurrent_repls_do_not_mix_output() -> None:
    code = "for i in range(2000):\n    print(tag)"
    repls = [PersistentREPL(), PersistentREPL()]
    for tag, repl in zip("ab", repls, strict=True):
        repl.globals["tag"] = tag
    results: dict[str, REPLResult] = {}
    threads = [
        threading.Thread(target=lambda t=t, r=r: results.__setitem__(t, r.execute(code)))
        for t, r in zip("ab", repls, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results["a"].stdout == "a\n" * 2000
    assert results["b"].stdout == "b\n" * 2000
    for repl in repls:
        repl.close()


# ----------------------------------------------------------------------------------------------------- builtins


def test_restricted_builtins_are_none(repl: PersistentREPL) -> None:
    namespace_builtins = repl.globals["__builtins__"]
    for name in ("__import__", "open", "eval", "exec", "compile", "input", "globals", "locals"):
        assert name in BLOCKED_BUILTINS
        assert namespace_builtins[name] is None
    assert namespace_builtins["len"] is len


@pytest.mark.parametrize(
    "code", ["import os", "from os import path", "open('/etc/passwd')", "eval('1')", "exec('x=1')", "globals()"]
)
def test_blocked_builtins_fail_in_model_code(repl: PersistentREPL, code: str) -> None:
    result = repl.execute(code)
    assert result.error == "TypeError: 'NoneType' object is not callable"
    assert "disabled in this REPL" in result.stderr


def test_ordinary_builtins_classes_and_comprehensions_work(repl: PersistentREPL) -> None:
    code = (
        "class Box:\n    def __init__(self, v):\n        self.v = v\n"
        "boxes = [Box(i) for i in range(4)]\n"
        "print(sum(b.v for b in boxes), sorted({3, 1}), isinstance(boxes[0], Box), Box.__name__)"
    )
    assert repl.execute(code).stdout == "6 [1, 3] True Box\n"


def test_allowed_imports() -> None:
    with PersistentREPL(allowed_imports={"math", "json"}) as repl:
        assert repl.execute("import math, json\nprint(math.sqrt(16), json.dumps([1]))").stdout == "4.0 [1]\n"
        result = repl.execute("import os")
        assert result.error is not None
        assert result.error.startswith("ImportError: import of 'os' is not allowed in this REPL")


def test_builtins_edited_by_model_code_are_restored(repl: PersistentREPL) -> None:
    repl.execute("__builtins__['len'] = None\n__builtins__['open'] = print")
    assert repl.execute("print(len('abc'))").stdout == "3\n"
    assert repl.globals["__builtins__"]["open"] is None
    repl.execute("__builtins__ = {}")
    assert repl.execute("print(len('ab'))").stdout == "2\n"


# ----------------------------------------------------------------------------------------------------- scaffold


def test_helpers_only_with_callbacks() -> None:
    with PersistentREPL() as bare:
        assert not any(name in bare.globals for name in HELPERS)
        assert {"FINAL_VAR", "SHOW_VARS", "context"} <= set(bare.globals)
        assert bare.execute("llm_query('x')").error == "NameError: name 'llm_query' is not defined"
        assert bare.execute("rlm_query('x')").error == "NameError: name 'rlm_query' is not defined"
    with PersistentREPL(lm_callback=upper_lm) as lm_only:
        assert set(HELPERS) <= set(lm_only.globals)  # rlm_query and rlm_query_batched fall back to the LM
    with PersistentREPL(subcall_fn=echo_subcall) as sub_only:
        assert {"rlm_query", "rlm_query_batched"} <= set(sub_only.globals)
        assert "llm_query" not in sub_only.globals
        assert "llm_query_batched" not in sub_only.globals


def test_helpers_are_the_repls_own_bound_methods(repl: PersistentREPL) -> None:
    helper = repl.globals["llm_query"]
    assert helper == repl.llm_query
    assert helper.__self__ is repl
    assert repl.globals["rlm_query_batched"] == repl.rlm_query_batched
    repl.execute("print(1)")
    assert repl.globals["llm_query"] is helper


def test_scaffold_is_restored_after_model_code_overwrites_it(repl: PersistentREPL) -> None:
    originals = {name: repl.globals[name] for name in (*HELPERS, "FINAL_VAR", "SHOW_VARS", "context")}
    code = "llm_query = lambda p: 'fake'\nrlm_query = None\nFINAL_VAR = 0\ncontext = 'mine'\ndel SHOW_VARS"
    repl.execute(code)
    for name, original in originals.items():
        assert repl.globals[name] is original, name
    assert repl.execute("print(llm_query('hi'), context)").stdout == "HI the context\n"


def test_scaffold_of_an_lm_only_repl_is_restored_after_model_code_overwrites_it() -> None:
    with PersistentREPL(lm_callback=upper_lm) as repl:
        originals = {name: repl.globals[name] for name in HELPERS}
        repl.execute("llm_query = lambda p, m=None: 'hijacked'\nrlm_query = len\ndel rlm_query_batched")
        for name, original in originals.items():
            assert repl.globals[name] is original, name
        assert repl.globals["llm_query"] == repl.llm_query
        assert repl.execute("print(llm_query('a'), rlm_query('b'), rlm_query_batched(['c']))").stdout == "A B ['C']\n"


def test_overwrite_inside_a_failing_run_is_restored(repl: PersistentREPL) -> None:
    helper = repl.globals["llm_query"]
    repl.execute("llm_query = 1\nraise RuntimeError")
    assert repl.globals["llm_query"] is helper


def test_llm_query_and_batched_order(repl: PersistentREPL) -> None:
    result = repl.execute("print(llm_query('one'))\nprint(llm_query_batched(['a', 'b', 'c']))")
    assert result.stdout == "ONE\n['A', 'B', 'C']\n"


def test_llm_query_batched_isolates_item_failures() -> None:
    def lm(prompts: list[str]) -> list[Any]:
        return [RuntimeError(f"bad {p}") if p == "boom" else (None if p == "none" else p * 2) for p in prompts]

    with PersistentREPL(lm_callback=lm) as repl:
        assert repl.llm_query_batched(["a", "boom", "b", "none"]) == [
            "aa",
            f"{LM_ERROR_PREFIX}bad boom",
            "bb",
            f"{LM_ERROR_PREFIX}no response",
        ]
        assert repl.llm_query_batched([]) == []


def test_llm_query_failures_become_text() -> None:
    def down(prompts: list[str]) -> list[str]:
        raise ConnectionError("server down")

    with PersistentREPL(lm_callback=down) as repl:
        assert repl.execute("print(llm_query('q'))").stdout == "Error: LM query failed - server down\n"
        assert repl.llm_query_batched(["a", "b"]) == [f"{LM_ERROR_PREFIX}server down"] * 2
    with PersistentREPL(lm_callback=lambda prompts: ["only one"]) as short:
        answers = short.llm_query_batched(["a", "b"])
        assert all(answer.startswith(LM_ERROR_PREFIX) for answer in answers)
        assert "returned 1 responses for 2 prompts" in answers[0]


def test_rlm_query_parses_literals_and_falls_back_to_text() -> None:
    answers = {"list": "[1, 2, 3]", "dict": "{'a': 1}", "text": "Paris", "num": "42", "code": "__import__('os')"}
    with PersistentREPL(subcall_fn=lambda prompt, context=None: answers[prompt]) as repl:
        assert repl.rlm_query("list") == [1, 2, 3]
        assert repl.rlm_query("dict") == {"a": 1}
        assert repl.rlm_query("text") == "Paris"
        assert repl.rlm_query("num") == 42
        assert repl.rlm_query("code") == "__import__('os')"  # literal_eval never evaluates code


def test_rlm_query_passes_context_only_when_given() -> None:
    seen: list[tuple[Any, ...]] = []

    def only_prompt(*args: Any) -> str:
        seen.append(args)
        return "ok"

    with PersistentREPL(subcall_fn=only_prompt) as repl:
        repl.execute("rlm_query('p')\nrlm_query('q', context={'k': 1})")
    assert seen == [("p",), ("q", {"k": 1})]


def test_rlm_query_batched_preserves_order_isolates_failures_and_runs_two_at_a_time() -> None:
    lock = threading.Lock()
    running, peak = [0], [0]

    def subcall(prompt: str, context: Any = None) -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.01 * (5 - int(prompt[-1])))  # later prompts finish first
            if prompt == "p3":
                raise ValueError("child crashed")
            return f"'{prompt}-{context}'"
        finally:
            with lock:
                running[0] -= 1

    with PersistentREPL(subcall_fn=subcall) as repl:
        results = repl.rlm_query_batched([f"p{i}" for i in range(5)], contexts=[None, 1, 2, 3, 4])
    assert results == ["p0-None", "p1-1", "p2-2", f"{RLM_ERROR_PREFIX}child crashed", "p4-4"]
    assert peak[0] == 2


def test_rlm_query_batched_rejects_mismatched_contexts(repl: PersistentREPL) -> None:
    result = repl.execute("rlm_query_batched(['a', 'b'], ['only one'])")
    assert result.error == "ValueError: rlm_query_batched got 2 prompts but 1 contexts"
    assert repl.rlm_query_batched([]) == []


def test_rlm_query_without_subcall_fn_asks_the_lm() -> None:
    batches: list[list[str]] = []

    def lm(prompts: list[str]) -> list[str]:
        batches.append(prompts)
        return [prompt.upper() for prompt in prompts]

    with PersistentREPL(lm_callback=lm) as repl:
        result = repl.execute("print(rlm_query('one'))\nprint(rlm_query_batched(['a', '[1]']))")
    assert result.stdout == "ONE\n['A', '[1]']\n"  # the LM's text as is: not parsed like a child's answer
    assert batches == [["one"], ["a", "[1]"]]  # one LM call per helper call, as llm_query(_batched) makes


def test_rlm_query_fallback_puts_the_context_in_the_prompt() -> None:
    seen: list[str] = []

    def lm(prompts: list[str]) -> list[str]:
        seen.extend(prompts)
        return ["ok"] * len(prompts)

    with PersistentREPL(lm_callback=lm) as repl:
        assert repl.rlm_query("summarise", context="chapter 1") == "ok"
        assert repl.rlm_query_batched(["a", "b"], contexts=[None, {"k": 1}]) == ["ok", "ok"]
        assert repl.execute("rlm_query_batched(['a', 'b'], ['only one'])").error == (
            "ValueError: rlm_query_batched got 2 prompts but 1 contexts"
        )
    assert seen == ["summarise\n\nContext:\nchapter 1", "a", "b\n\nContext:\n{'k': 1}"]


def test_rlm_query_fallback_failures_become_lm_error_text() -> None:
    def down(prompts: list[str]) -> list[str]:
        raise ConnectionError("server down")

    with PersistentREPL(lm_callback=down) as repl:
        assert repl.execute("print(rlm_query('q'))").stdout == f"{LM_ERROR_PREFIX}server down\n"
        assert repl.rlm_query_batched(["a", "b"]) == [f"{LM_ERROR_PREFIX}server down"] * 2
    with PersistentREPL() as bare, pytest.raises(RuntimeError, match=r"subcall_fn=\.\.\. or lm_callback=\.\.\."):
        bare.rlm_query("x")


def test_rlm_failure_text_from_model_code() -> None:
    def failing(prompt: str, context: Any = None) -> str:
        raise RuntimeError("depth exceeded")

    with PersistentREPL(subcall_fn=failing) as repl:
        assert repl.execute("print(rlm_query('x'))").stdout == "Error: RLM query failed - depth exceeded\n"


def test_final_var_in_model_code() -> None:
    with PersistentREPL() as repl:
        assert not repl.final_value_set
        missing = repl.execute("FINAL_VAR('answer')")
        assert missing.error is not None
        assert missing.error.startswith("NameError: FINAL_VAR: no variable named")
        assert repl.final_value is None
        assert repl.execute("answer = [1, 2]\nprint(FINAL_VAR('answer'))").stdout == "[1, 2]\n"
        assert repl.final_value == "[1, 2]"
        assert repl.final_value_set
    with PersistentREPL() as by_value:
        by_value.execute("FINAL_VAR(6 * 7)")
        assert by_value.final_value == "42"


def test_show_vars(repl: PersistentREPL) -> None:
    assert repl.execute("print(SHOW_VARS())").stdout == "No variables defined yet.\n"
    repl.execute("n = 1\nnames = ['a']\n_private = 2")
    assert repl.execute("print(SHOW_VARS())").stdout == "Variables: n: int, names: list\n"


def test_lookup_text(repl: PersistentREPL) -> None:
    repl.execute("total = 12\nclass Bad:\n    def __str__(self):\n        raise ValueError\nbad = Bad()")
    assert repl.lookup_text("total") == "12"
    assert repl.lookup_text(" 'total' ") == "12"
    assert repl.lookup_text("missing") is None
    assert repl.lookup_text("bad") is None
    assert repl.lookup_text("__builtins__") is None


def test_lookup_text_is_bounded_by_the_timeout() -> None:
    with PersistentREPL(timeout=0.3) as repl:
        repl.execute("class Slow:\n    def __str__(self):\n        while True: pass\nslow = Slow()")
        assert repl.lookup_text("slow") is None


# ----------------------------------------------------------------------------------------------------- lifecycle


def test_close_removes_temp_dir_and_is_idempotent() -> None:
    repl = PersistentREPL()
    assert os.path.isdir(repl.temp_dir)
    repl.close()
    repl.close()
    assert repl.closed
    assert not os.path.exists(repl.temp_dir)
    with pytest.raises(RuntimeError, match="closed"):
        repl.execute("1")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"timeout": 0}, "timeout"), ({"max_output_chars": 0}, "max_output_chars"), ({"isolation": "vm"}, "isolation")],
)
def test_invalid_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PersistentREPL(**kwargs)


# ------------------------------------------------------------------------------------------------- process isolation


@pytest.fixture
def process_repl() -> Iterator[PersistentREPL]:
    with PersistentREPL(
        context={"numbers": [1, 2, 3]},
        lm_callback=upper_lm,
        subcall_fn=echo_subcall,
        timeout=0.5,
        isolation="process",
        allowed_imports={"signal"},
    ) as repl:
        yield repl


def test_process_repl_runs_code_and_keeps_state(process_repl: PersistentREPL) -> None:
    assert process_repl.execute("total = sum(context['numbers'])").stdout == ""
    assert process_repl.execute("print(total, context)").stdout == "6 {'numbers': [1, 2, 3]}\n"
    failed = process_repl.execute("1/0")
    assert failed.error == "ZeroDivisionError: division by zero"
    assert failed.stderr.startswith("Traceback (most recent call last):\n")
    assert process_repl.lookup_text("total") == "6"
    assert process_repl.lookup_text("nothing") is None
    assert process_repl.execute("import os").error == "ImportError: import of 'os' is not allowed in this REPL; " + (
        "allowed: ['signal']"
    )


def test_process_repl_helpers_call_back_to_the_parent(process_repl: PersistentREPL) -> None:
    assert {"llm_query", "rlm_query"} <= set(process_repl.globals)
    code = (
        "print(llm_query('a'), llm_query_batched(['b', 'c']))\n"
        "print(rlm_query('[1, 2]'), rlm_query_batched(['x', 'y'], [None, 'ctx']))"
    )
    assert process_repl.execute(code).stdout == "A ['B', 'C']\n[1, 2] ['x', 'y:ctx']\n"


def test_process_repl_rlm_query_falls_back_to_the_parents_lm() -> None:
    with PersistentREPL(lm_callback=upper_lm, isolation="process") as repl:
        assert set(HELPERS) <= set(repl.globals)
        code = "print(rlm_query('a'), rlm_query_batched(['b', 'c'], ['x', None]))"
        assert repl.execute(code).stdout == "A ['B\\n\\nCONTEXT:\\nX', 'C']\n"


def test_process_repl_final_var_reaches_the_parent(process_repl: PersistentREPL) -> None:
    process_repl.execute("answer = 'forty-two'\nFINAL_VAR('answer')")
    assert process_repl.final_value == "forty-two"


def test_process_repl_timeout_keeps_state(process_repl: PersistentREPL) -> None:
    process_repl.execute("kept = 1")
    result = process_repl.execute("while True: pass")
    assert result.timed_out
    assert process_repl.execute("print(kept)").stdout == "1\n"


def test_process_repl_kills_a_run_it_cannot_interrupt(
    process_repl: PersistentREPL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_process, "_KILL_GRACE_S", 0.3)
    process_repl.execute("kept = 1")
    started = time.monotonic()
    result = process_repl.execute("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.pause()")
    assert time.monotonic() - started < 10
    assert result.timed_out
    assert "variables defined so far are lost" in result.stderr
    restarted = process_repl.execute("print(context['numbers'])\nprint(kept)")
    assert restarted.stdout == "[1, 2, 3]\n"
    assert restarted.error == "NameError: name 'kept' is not defined"


def test_process_repl_memory_limit() -> None:
    with PersistentREPL(isolation="process", memory_limit_mb=400) as repl:
        result = repl.execute("block = bytearray(1024 * 1024 * 1024)")
        assert result.error == "MemoryError"
        assert repl.execute("print('still alive')").stdout == "still alive\n"


def test_process_repl_close_kills_the_child_and_removes_temp_dir() -> None:
    repl = PersistentREPL(isolation="process")
    backend = repl._backend
    assert backend is not None
    assert backend._child is not None
    process = backend._child.process
    repl.close()
    repl.close()
    assert process.poll() is not None
    assert not os.path.exists(repl.temp_dir)


def test_process_repl_needs_a_json_context() -> None:
    with pytest.raises(TypeError, match="JSON-serialisable"):
        PersistentREPL(context={1, 2}, isolation="process")


def test_enclosing_timeout_resets_a_process_repl() -> None:
    with PersistentREPL(isolation="process", timeout=30) as child:
        child.execute("kept = 1")

        def subcall(prompt: str, context: Any = None) -> str:
            return child.execute(prompt).stdout

        with PersistentREPL(subcall_fn=subcall, timeout=0.3) as parent:
            started = time.monotonic()
            result = parent.execute("rlm_query('while True: pass')")
            assert time.monotonic() - started < 5
        assert result.timed_out
        assert child.execute("print('fresh')").stdout == "fresh\n"
        assert child.execute("kept").error == "NameError: name 'kept' is not defined"
