"""Exact-match scoring for retrieval-augmented question answering (Search-R1 style).

The model ends its answer with ``<answer>...</answer>``; the content of the last such block is compared,
after SQuAD-style normalisation (`normalize_answer`), with each acceptable golden answer.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION_TABLE = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    """Normalise an answer for exact matching (SQuAD convention).

    Lower-cases, removes ASCII punctuation, replaces the articles "a", "an" and "the" with spaces, and
    collapses runs of whitespace to single spaces (trimming both ends).
    """
    text = s.lower().translate(_PUNCTUATION_TABLE)
    return " ".join(_ARTICLES.sub(" ", text).split())


def em_check(prediction: str, golden_answers: str | Iterable[Any]) -> int:
    """Check whether ``prediction`` exactly matches any golden answer after normalisation.

    Args:
        prediction: The predicted answer text.
        golden_answers: One acceptable answer, or an iterable of them (a list, tuple or numpy array as
            read from parquet). Non-string items are compared via ``str()``.

    Returns:
        1 if some golden answer matches, else 0.
    """
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    normalized_prediction = normalize_answer(prediction)
    return int(any(normalize_answer(str(golden)) == normalized_prediction for golden in golden_answers))


def extract_solution(solution_str: str) -> str | None:
    """Return the stripped content of the last ``<answer>...</answer>`` block, or None if there is none.

    Blocks are matched left to right without overlap, each ending at the first ``</answer>`` after its
    opening tag, and may span lines. Runs in time linear in the input length.
    """
    last: str | None = None
    position = 0
    while (start := solution_str.find(ANSWER_OPEN, position)) >= 0:
        content_start = start + len(ANSWER_OPEN)
        end = solution_str.find(ANSWER_CLOSE, content_start)
        if end < 0:
            break
        last = solution_str[content_start:end]
        position = end + len(ANSWER_CLOSE)
    return None if last is None else last.strip()


def compute_score(
    solution_str: str,
    ground_truth: Mapping[str, Any],
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score a response by exact match of its last ``<answer>`` block against ``ground_truth["target"]``.

    Args:
        solution_str: The response (for multi-turn episodes, the whole conversation text).
        ground_truth: A mapping whose ``"target"`` is one golden answer or an iterable of them.
        method: Accepted for signature compatibility; only exact matching is implemented.
        format_score: Reward when an answer block is present but does not match.
        score: Reward for a match.

    Returns:
        ``score`` on a match, ``format_score`` for a non-matching answer, and ``0.0`` when the response
        has no complete answer block.

    Raises:
        KeyError: If ``ground_truth`` has no ``"target"``.
    """
    del method  # kept so that callers passing it keep working
    answer = extract_solution(solution_str)
    if answer is None:
        return 0.0
    return score if em_check(answer, ground_truth["target"]) else format_score
