"""Small offline demo datasets for every built-in environment, in the row format trainers read.

Each row has ``data_source``, ``prompt`` (chat messages), ``env_class`` (the registered id), ``reward_spec``
(``{"method": "rule", "ground_truth": ...}``), ``extra_info`` (``split``, ``index`` and env-specific details),
plus the columns an env reads from its extras (``db_id``/``data`` for ``text2sql``, ``reward_model`` for
``aime``). Rows are generated from a seed, so the same call always writes the same files.

``write_dataset`` writes JSONL, and Parquet when ``pyarrow`` is installed (``pip install 'skyrl-gym[parquet]'``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Builder = Callable[[random.Random, int], Row]

GSM8K_INSTRUCTION = "Let's think step by step and output the final answer after '####'."
AIME_INSTRUCTION = "Solve the problem. End your response with a line 'Answer: <answer>'."
LCB_INSTRUCTION = "Write a Python program that solves the task. Put the code in one ```python``` block."
SEARCH_INSTRUCTION = (
    "Answer the question. Reason inside <think> and </think> whenever you get new information. To look something "
    "up, write <search> query </search>; the results come back between <information> and </information>. Search "
    "as often as you need. When you know the answer, give it inside <answer> and </answer>, without explanation."
)
SEARCHCODE_INSTRUCTION = (
    "Solve the problem. You may call tools: <tool><python>code</python></tool> runs Python and shows what it "
    "prints; <tool><search>query</search></tool> searches a knowledge base. End with <solution>#### N</solution> "
    "where N is the final number."
)
FORMATS = ("jsonl", "parquet")


class DatasetError(ValueError):
    """A demo dataset cannot be made or written; the message says what to change."""


def _row(env_class: str, data_source: str, prompt: str, ground_truth: Any, index: int, **extra: Any) -> Row:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt}],
        "env_class": env_class,
        "reward_spec": {"method": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index},
        **extra,
    }


def _word_problem(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(["Ada", "Ben", "Chen", "Dana", "Eli", "Fatima", "Goran", "Hana"])
    item = rng.choice(["apples", "books", "marbles", "stamps", "shells"])
    a, b, c = rng.randrange(2, 50), rng.randrange(2, 30), rng.randrange(1, 10)
    question = (
        f"{name} has {a} {item}. A friend gives {name} {b} more, and then {name} gives away {c}. "
        f"How many {item} does {name} have now?"
    )
    return question, a + b - c


def gsm8k_row(rng: random.Random, index: int) -> Row:
    """A grade-school word problem whose answer is given after ``####``."""
    question, answer = _word_problem(rng)
    return _row("gsm8k", "gsm8k_demo", f"{question} {GSM8K_INSTRUCTION}", str(answer), index)


def gsm8k_multi_turn_row(rng: random.Random, index: int) -> Row:
    """The gsm8k problem, answered over up to three turns with feedback."""
    row = gsm8k_row(rng, index)
    row.update(env_class="gsm8k_multi_turn", data_source="gsm8k_multi_turn_demo", max_turns=3)
    row["extra_info"]["max_turns"] = 3
    return row


def aime_row(rng: random.Random, index: int) -> Row:
    """A competition-style integer problem; AIME reads its answer from ``reward_model``."""
    n = rng.randrange(5, 40)
    k = rng.randrange(2, 9)
    question = f"How many positive integers less than or equal to {n * k} are divisible by {k}?"
    row = _row("aime", "aime_demo", f"{question} {AIME_INSTRUCTION}", str(n), index)
    row["reward_model"] = {"style": "rule", "ground_truth": str(n)}
    return row


_LCB_TASKS: tuple[tuple[str, Callable[[list[int]], str]], ...] = (
    ("Read integers separated by spaces from one line and print their sum.", lambda xs: str(sum(xs))),
    ("Read integers separated by spaces from one line and print the largest.", lambda xs: str(max(xs))),
    (
        "Read integers separated by spaces from one line and print them sorted ascending, space separated.",
        lambda xs: " ".join(map(str, sorted(xs))),
    ),
    (
        "Read integers separated by spaces from one line and print how many are even.",
        lambda xs: str(sum(x % 2 == 0 for x in xs)),
    ),
)


def lcb_row(rng: random.Random, index: int) -> Row:
    """A stdin/stdout programming task with three tests, in LiveCodeBench's test format."""
    statement, solve = rng.choice(_LCB_TASKS)
    tests = []
    for _ in range(3):
        xs = [rng.randrange(-50, 100) for _ in range(rng.randrange(1, 8))]
        tests.append({"input": " ".join(map(str, xs)) + "\n", "output": solve(xs) + "\n", "testtype": "stdin"})
    return _row("lcb", "lcb_demo", f"{statement}\n\n{LCB_INSTRUCTION}", json.dumps(tests), index)


def text2sql_row(rng: random.Random, index: int) -> Row:
    """A question over one of the bundled sqlite databases, with its gold SQL."""
    from skyrl_gym.envs.sql.data import bundled_questions, episode

    question = rng.choice(bundled_questions())
    prompt, extras = episode(question)
    return {
        "data_source": "text2sql_demo",
        "prompt": prompt,
        "env_class": "text2sql",
        "reward_spec": extras["reward_spec"],
        "extra_info": {"index": index},
        "db_id": extras["db_id"],
        "data": extras["data"],
    }


def search_row(rng: random.Random, index: int) -> Row:
    """A single- or two-hop question over the bundled encyclopedia (served by ``skyrl-gym serve-retriever``)."""
    from skyrl_gym.retrieval.data import load_bundled_questions

    question = rng.choice(load_bundled_questions())
    prompt = f"{SEARCH_INSTRUCTION}\n\nQuestion: {question['question']}"
    row = _row("search", "search_demo", prompt, {"target": list(question["golden_answers"])}, index)
    row["extra_info"]["hops"] = question["hops"]
    return row


def searchcode_row(rng: random.Random, index: int) -> Row:
    """An arithmetic word problem, best solved with the python tool; answered as ``#### N``."""
    question, answer = _word_problem(rng)
    factor = rng.randrange(11, 99)
    question = f"{question} Then multiply that number by {factor}."
    return _row("searchcode", "searchcode_demo", f"{question}\n\n{SEARCHCODE_INSTRUCTION}", str(answer * factor), index)


BUILDERS: dict[str, Builder] = {
    "gsm8k": gsm8k_row,
    "gsm8k_multi_turn": gsm8k_multi_turn_row,
    "aime": aime_row,
    "lcb": lcb_row,
    "text2sql": text2sql_row,
    "search": search_row,
    "searchcode": searchcode_row,
}


def make_demo_dataset(env_id: str, size: int, seed: int = 0, split: str = "train") -> list[Row]:
    """``size`` demo rows for ``env_id``; the same arguments always give the same rows."""
    if env_id not in BUILDERS:
        raise DatasetError(f"no demo dataset for {env_id!r}; available: {', '.join(sorted(BUILDERS))}")
    if size < 1:
        raise DatasetError(f"size must be at least 1, got {size}")
    # The split is part of the seed so train and test rows differ.
    rng = random.Random(f"{env_id}:{split}:{seed}")
    rows = [BUILDERS[env_id](rng, index) for index in range(size)]
    for row in rows:
        row["extra_info"]["split"] = split
    return rows


def write_dataset(rows: Sequence[Row], path_stem: Path, formats: Iterable[str] = FORMATS) -> list[Path]:
    """Write ``rows`` to ``{path_stem}.jsonl`` and/or ``.parquet``; return the written paths.

    Files are written to a temporary name and renamed, so an interrupted run leaves no partial file.
    """
    formats = list(formats)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise DatasetError(f"unknown format(s) {unknown}; choose from {list(FORMATS)}")
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        target = path_stem.with_suffix(f".{fmt}")
        tmp = target.with_suffix(f".{fmt}.tmp")
        if fmt == "jsonl":
            tmp.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
        else:
            _write_parquet(rows, tmp)
        tmp.replace(target)
        written.append(target)
    return written


def _write_parquet(rows: Sequence[Row], path: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError(
            "writing Parquet needs pyarrow: pip install 'skyrl-gym[parquet]', or pass formats=['jsonl']"
        ) from exc
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
