"""Answer extraction and scoring for GSM8K.

A GSM8K response is expected to end with ``#### <number>``. Scoring is exact string equality between the
extracted number (with ``,`` and ``$`` removed) and the dataset's ground-truth string.
"""

from __future__ import annotations

import re
from typing import Literal

ExtractionMethod = Literal["strict", "flexible"]

# The marker the prompt asks for, followed by a number-like run. The character class has no overlap with
# the marker, so matching stays linear even on very long responses.
_STRICT_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
# Any number-like run anywhere in the text (used by the lenient "flexible" method).
_NUMBER_LIKE = re.compile(r"\-?[0-9\.\,]+")


def _clean_number(raw: str) -> str:
    """Drop thousands separators and dollar signs so ``$1,000`` and ``1000`` compare equal."""
    return raw.replace(",", "").replace("$", "")


def extract_solution(solution_str: str, method: ExtractionMethod = "strict") -> str | None:
    """Extract the final numeric answer from a GSM8K response.

    Args:
        solution_str: The model's response.
        method: ``"strict"`` reads the number after the first ``#### `` marker (the format the prompt asks
            for). ``"flexible"`` ignores the marker and takes the last number-like run in the text that
            contains a digit.

    Returns:
        The answer with ``,`` and ``$`` removed, or None when nothing matches. No other normalisation is
        applied: ``"#### 72."`` yields ``"72."``, exactly as the reference scorer does.

    Raises:
        ValueError: If ``method`` is neither ``"strict"`` nor ``"flexible"``.
    """
    if method == "strict":
        match = _STRICT_ANSWER.search(solution_str)
        if match is None:
            return None
        raw: str = match[1]
        return _clean_number(raw) if "," in raw else raw  # "$" cannot occur: the pattern's class excludes it
    if method == "flexible":
        for candidate in reversed(_NUMBER_LIKE.findall(solution_str)):
            # Runs such as "." or "," (sentence punctuation) match the pattern but are not answers.
            if any(ch.isdigit() for ch in candidate):
                return _clean_number(candidate)
        return None
    raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: ExtractionMethod = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score a GSM8K response against its ground-truth answer.

    Args:
        solution_str: The model's response.
        ground_truth: The reference answer string (e.g. ``"72"``); non-strings are compared via ``str()``.
        method: Extraction method, see `extract_solution`.
        format_score: Reward for a well-formed but wrong answer.
        score: Reward for a correct answer.

    Returns:
        ``score`` if the extracted answer equals ``ground_truth`` exactly, ``format_score`` if an answer was
        extracted but differs, and the integer ``0`` if no answer could be extracted.
    """
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0
    return score if answer == str(ground_truth) else format_score
