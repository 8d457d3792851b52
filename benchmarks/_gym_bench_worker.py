"""One benchmark measurement in one interpreter: run a row's episodes through whichever ``skyrl_gym`` is installed.

``benchmarks/gym_bench.py`` runs this script twice per row and repeat, once with this repository's venv
(``--impl ours``) and once with a separate venv holding PyPI's skyrl-gym 0.4.0 (``--impl upstream``), and compares
the two. It imports nothing but the standard library and ``skyrl_gym``, so both venvs can run it unchanged, and it
refuses to run if the ``skyrl_gym`` it imported is not the one ``--expect-root`` names.

    <venv>/bin/python -s -P _gym_bench_worker.py --impl ours --row gsm8k --n 2000 --expect-root DIR --json

Each episode is built from a fixed list (episode ``i`` uses entry ``i % len(list)``), so both implementations see
the same episodes. The timed part of an episode is make + init + the step the row measures; afterwards each distinct
episode is played once more to its end (untimed), so that multi-step rows get a final reward. The worker reports a
signature (each step's reward, done flag and observation text) of every timed and every finished episode, which the
parent compares across implementations. With ``--cpu-file`` (a cgroup's CPU usage file,
the worker and everything it starts being in that cgroup) it also reports the CPU seconds the timed part used, sandboxed
and forked processes included. Output: one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.metadata
import io
import json
import os
import pstats
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import skyrl_gym

# -P keeps this directory off the front of sys.path, so that nothing here can shadow skyrl_gym; the one module taken
# from it, _machine, is found at the end of the path.
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from _machine import read_cpu_seconds

Signature = list[list[Any]]  # one [reward, done, observation text] per step


# --- Episodes ---------------------------------------------------------------------------------------------------------

GSM8K_EPISODES = [
    # (action, ground truth): correct, correct with separators, wrong number, no "#### N" at all.
    ("3 * 12 = 36 pencils, and 36 - 7 = 29.\n#### 29", "29"),
    ("She earns 18 * 60 = 1,080 dollars.\n#### 1,080", "1080"),
    ("Half of 50 is 25, plus 4.\n#### 30", "29"),
    ("The answer is seventy-two.", "72"),
    ("Each box holds 8, so 5 boxes hold 40.\n#### $40", "40"),
]

LCB_TESTS = [
    {"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin", "metadata": {}},
    {"input": "1\n-5\n", "output": "-5\n", "testtype": "stdin", "metadata": {}},
    {"input": "4\n10 20 30 40\n", "output": "100\n", "testtype": "stdin", "metadata": {}},
]
LCB_ACTION = (
    "Read N, then the N numbers, and print their sum.\n"
    "```python\nn = int(input())\nnumbers = list(map(int, input().split()))\nprint(sum(numbers[:n]))\n```"
)

PYTHON_TOOL_ACTION = "<tool><python>print(6*7)</python></tool>"
PYTHON_TOOL_SOLUTION = "<think>The tool printed 42.</think>\n<solution>#### 42</solution>"

# (db_id, exploratory <sql> query, final <solution> query, gold SQL), on the bundled databases through a
# spider-layout directory. Rewards: 1.0 (right), 0.0 (wrong rows), 1.0, -1.0 (malformed: no <think> before it).
SQL_EPISODES = [
    ("bookstore", "SELECT COUNT(*) FROM books", "SELECT COUNT(*) FROM books", "SELECT COUNT(*) FROM books"),
    ("school", "SELECT * FROM students LIMIT 5", "SELECT COUNT(*) FROM teachers", "SELECT COUNT(*) FROM students"),
    (
        "bookstore",
        "SELECT genre, COUNT(*) FROM books GROUP BY genre",
        "SELECT genre, MAX(price) FROM books GROUP BY genre",
        "SELECT genre, MAX(price) FROM books GROUP BY genre",
    ),
    ("flights", "SELECT * FROM airports", None, "SELECT COUNT(*) FROM airports"),
]


# --- What one episode does, per row -----------------------------------------------------------------------------------


def _step_signature(out: Any) -> list[Any]:
    text = "\n".join(str(message["content"]) for message in out["observations"])
    return [float(out["reward"]), bool(out["done"]), text]


def gsm8k_episode(index: int, context: dict[str, Any], finish: bool) -> tuple[float, Signature]:
    action, answer = GSM8K_EPISODES[index % len(GSM8K_EPISODES)]
    start = time.perf_counter()
    env = skyrl_gym.make("gsm8k", extras={"reward_spec": {"method": "rule", "ground_truth": answer}})
    env.init([{"role": "user", "content": "Solve the problem. End with '#### <number>'."}])
    out = env.step(action)
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed, [_step_signature(out)]


def lcb_episode(index: int, context: dict[str, Any], finish: bool) -> tuple[float, Signature]:
    start = time.perf_counter()
    env = skyrl_gym.make("lcb", extras={"reward_spec": {"ground_truth": context["lcb_ground_truth"]}})
    env.init([{"role": "user", "content": "Print the sum of N integers."}])
    out = env.step(LCB_ACTION)
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed, [_step_signature(out)]


def python_tool_episode(index: int, context: dict[str, Any], finish: bool) -> tuple[float, Signature]:
    """Timed: make + init + the python tool call. With ``finish``, then the answer step (it carries the reward)."""
    start = time.perf_counter()
    env = skyrl_gym.make("searchcode", extras={"reward_spec": {"ground_truth": "42"}, "max_turns": 3})
    env.init([{"role": "user", "content": "What is 6 * 7? Use the python tool."}])
    steps = [env.step(PYTHON_TOOL_ACTION)]
    elapsed = time.perf_counter() - start
    if finish:
        steps.append(env.step(PYTHON_TOOL_SOLUTION))
    env.close()
    return elapsed, [_step_signature(out) for out in steps]


def text2sql_episode(index: int, context: dict[str, Any], finish: bool) -> tuple[float, Signature]:
    """Timed: make + init + one ``<sql>`` step. With ``finish``, then the ``<solution>`` step (with the reward)."""
    db_id, query, solution, gold = SQL_EPISODES[index % len(SQL_EPISODES)]
    extras = {"db_id": db_id, "data": "spider", "reward_spec": {"ground_truth": gold}, "max_turns": 3}
    start = time.perf_counter()
    env = skyrl_gym.make("text2sql", env_config=context["sql_config"], extras=extras)
    env.init([{"role": "user", "content": "Answer with SQL."}])
    steps = [env.step(f"<think>Look at the data first.</think>\n<sql>{query}</sql>")]
    elapsed = time.perf_counter() - start
    if finish:
        thought = "<think>Now I know.</think>\n" if solution else ""  # no <think>: a malformed episode
        steps.append(env.step(f"{thought}<solution>{solution or gold}</solution>"))
    env.close()
    return elapsed, [_step_signature(out) for out in steps]


@dataclass(frozen=True)
class Row:
    """A benchmark row: the episode function, how many distinct episodes it cycles through, and how many
    episodes run at once (1: sequential)."""

    episode: Callable[[int, dict[str, Any], bool], tuple[float, Signature]]
    distinct: int
    concurrency: int = 1
    runs_code: bool = False


ROWS: dict[str, Row] = {
    "gsm8k": Row(gsm8k_episode, len(GSM8K_EPISODES)),
    "lcb": Row(lcb_episode, 1, runs_code=True),
    "lcb_x8": Row(lcb_episode, 1, concurrency=8, runs_code=True),
    "python_tool": Row(python_tool_episode, 1, runs_code=True),
    "python_tool_x8": Row(python_tool_episode, 1, concurrency=8, runs_code=True),
    "text2sql": Row(text2sql_episode, len(SQL_EPISODES)),
}


# --- Measuring --------------------------------------------------------------------------------------------------------


def run_sequential(row: Row, n: int, context: dict[str, Any]) -> tuple[float, list[Signature]]:
    """Run episodes 0..n-1 one after another; the time is the sum of their timed parts."""
    total = 0.0
    signatures = []
    for index in range(n):
        elapsed, signature = row.episode(index, context, False)
        total += elapsed
        signatures.append(signature)
    return total, signatures


def run_concurrent(row: Row, n: int, context: dict[str, Any]) -> tuple[float, list[Signature]]:
    """Run episodes 0..n-1 on ``row.concurrency`` threads; the time is the wall clock from first start to last end."""
    with ThreadPoolExecutor(row.concurrency) as pool:
        start = time.perf_counter()
        results = list(pool.map(lambda index: row.episode(index, context, False), range(n)))
        wall = time.perf_counter() - start
    return wall, [signature for _, signature in results]


def measure(row: Row, n: int, context: dict[str, Any]) -> tuple[float, list[Signature]]:
    runner = run_sequential if row.concurrency == 1 else run_concurrent
    return runner(row, n, context)


def check_import(expect_root: str) -> str:
    """The imported ``skyrl_gym`` file, after checking it lies under ``expect_root`` (no shadowing either way)."""
    location = os.path.realpath(skyrl_gym.__file__ or "")
    root = os.path.realpath(expect_root)
    if os.path.commonpath([location, root]) != root:
        raise SystemExit(f"skyrl_gym was imported from {location}, not from under {root}: refusing to measure")
    return location


def build_context(sql_data: str, workdir: str) -> dict[str, Any]:
    """What the episode functions share: the lcb ground truth and a spider-layout directory for text2sql."""
    spider = os.path.join(workdir, "spider", "database")
    for db_id in sorted({episode[0] for episode in SQL_EPISODES}):
        os.makedirs(os.path.join(spider, db_id), exist_ok=True)
        link = os.path.join(spider, db_id, f"{db_id}.sqlite")
        if not os.path.exists(link):
            os.symlink(os.path.join(sql_data, db_id, f"{db_id}.sqlite"), link)
    return {
        "lcb_ground_truth": json.dumps(LCB_TESTS),
        # Upstream reads env_config.db_path as an attribute; ours accepts any object with that attribute.
        "sql_config": types.SimpleNamespace(db_path=workdir),
    }


def sandbox_info(impl: str, row: Row) -> dict[str, Any]:
    """Our sandbox's isolation mode (and, on rows that used it, the executor's settings); read after measuring."""
    if impl != "ours":
        return {}
    from skyrl_gym.sandbox import get_default_executor, isolation_mode

    info: dict[str, Any] = {"isolation": isolation_mode()}
    if row.runs_code:
        info["executor"] = repr(get_default_executor())
    return info


def profile_text(profiler: cProfile.Profile, limit: int) -> str:
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(limit)
    stream.write("\n")
    stats.sort_stats("tottime").print_stats(limit)
    return stream.getvalue()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=("ours", "upstream"), required=True)
    parser.add_argument("--row", choices=sorted(ROWS), required=True)
    parser.add_argument("--n", type=int, required=True, help="timed episodes per repeat")
    parser.add_argument("--warmup", type=int, default=2, help="untimed episodes before the first repeat")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--expect-root", required=True, help="skyrl_gym must be imported from under this directory")
    parser.add_argument("--sql-data", required=True, help="directory of the bundled {db_id}/{db_id}.sqlite files")
    parser.add_argument("--cpu-file", help="cgroup CPU usage file to read before and after each timed run")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile the timed runs, keep N lines")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object (the default)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    location = check_import(args.expect_root)
    row = ROWS[args.row]
    with tempfile.TemporaryDirectory(prefix="gym-bench-") as workdir:
        context = build_context(args.sql_data, workdir)
        warmup = max(args.warmup, row.concurrency if row.concurrency > 1 else 0)
        if warmup:
            measure(row, warmup, context)
        profiler = cProfile.Profile() if args.profile else None
        seconds, cpu_seconds, signatures = [], [], []
        for _ in range(args.repeats):
            cpu_before = read_cpu_seconds(args.cpu_file)
            if profiler is not None:
                profiler.enable()
            elapsed, sigs = measure(row, args.n, context)
            if profiler is not None:
                profiler.disable()
            cpu_after = read_cpu_seconds(args.cpu_file)
            seconds.append(elapsed)
            signatures.append(sigs)
            if cpu_before is not None and cpu_after is not None:
                cpu_seconds.append(cpu_after - cpu_before)
        # Untimed: each distinct episode played to its end, for the rewards of the final steps.
        finished = [row.episode(index, context, True)[1] for index in range(row.distinct)]
        info = sandbox_info(args.impl, row)
    result = {
        "impl": args.impl,
        "row": args.row,
        "n": args.n,
        "warmup": warmup,
        "concurrency": row.concurrency,
        "seconds": seconds,
        "rates": [args.n / s if s > 0 else float("inf") for s in seconds],
        "cpu_ms_per_episode": [1000 * cpu / args.n for cpu in cpu_seconds],
        "signatures": signatures,
        "finished": finished,
        "skyrl_gym_file": location,
        "skyrl_gym_version": importlib.metadata.version("skyrl-gym"),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "threads_at_end": threading.active_count(),
        **info,
    }
    if profiler is not None:
        result["profile"] = profile_text(profiler, args.profile)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
