import time

import numpy as np
import pytest

from skyrl_gym.envs.search.utils import compute_score, em_check, extract_solution, normalize_answer


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Paris", "paris"),
        ("  The   Eiffel Tower. ", "eiffel tower"),
        ("a cat, an owl and the dog!", "cat owl and dog"),
        ("Théâtre", "théâtre"),
        ("U.S.A.", "usa"),
        ("then", "then"),  # articles only as whole words
        ("The", ""),
        ("", ""),
        ("tab\tand\nnewline", "tab and newline"),
        ("«quoted»", "«quoted»"),  # only ASCII punctuation is removed
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_em_check_single_and_list() -> None:
    assert em_check("The Paris", "paris") == 1
    assert em_check("Lyon", "paris") == 0
    assert em_check("lyon", ["Paris", "Lyon"]) == 1
    assert em_check("Marseille", ["Paris", "Lyon"]) == 0
    assert em_check("x", []) == 0


def test_em_check_accepts_tuples_arrays_and_non_strings() -> None:
    assert em_check("b", ("a", "b")) == 1
    assert em_check("Lyon", np.array(["Paris", "Lyon"])) == 1
    assert em_check("1998", [1998]) == 1


def test_em_check_is_exact_not_substring() -> None:
    assert em_check("Paris France", "Paris") == 0
    assert em_check("Paris", "Paris France") == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer> Paris </answer>", "Paris"),
        ("<answer>first</answer> then <answer>second</answer>", "second"),
        ("<answer>multi\nline\n</answer>", "multi\nline"),
        ("<answer></answer>", ""),
        ("<answer>closed</answer><answer>unclosed", "closed"),
        ("<answer>a<answer>b</answer>", "a<answer>b"),
        ("no tags", None),
        ("<answer>unclosed", None),
        ("</answer><answer>", None),
        ("", None),
    ],
)
def test_extract_solution(text: str, expected: str | None) -> None:
    assert extract_solution(text) == expected


def test_compute_score() -> None:
    assert compute_score("<answer>Paris</answer>", {"target": "paris"}) == 1.0
    assert compute_score("<answer>Paris</answer>", {"target": ["Lyon", "Paris"]}) == 1.0
    assert compute_score("<answer>Rome</answer>", {"target": ["Lyon", "Paris"]}) == 0.0
    assert compute_score("no answer", {"target": "Paris"}) == 0.0


def test_compute_score_uses_last_answer_of_history() -> None:
    history = (
        "Example: <answer>Beijing</answer>\n<search>capital of france</search>\n"
        "<information>Paris is the capital.</information>\n<answer>Paris</answer>"
    )
    assert compute_score(history, {"target": "Paris"}) == 1.0
    assert compute_score(history, {"target": "Beijing"}) == 0.0


def test_compute_score_custom_rewards_and_method() -> None:
    assert compute_score("<answer>x</answer>", {"target": "y"}, format_score=0.2) == 0.2
    assert compute_score("<answer>y</answer>", {"target": "y"}, method="strict", score=3.0) == 3.0


def test_compute_score_requires_target() -> None:
    with pytest.raises(KeyError):
        compute_score("<answer>x</answer>", {"answers": "x"})


@pytest.mark.parametrize(
    "hostile",
    ["<answer>" * 15_000, "<answer>" + "x" * 100_000, "</answer>" * 12_000, "<answer>a</answer>" * 6_000],
)
def test_long_inputs_do_not_hang(hostile: str) -> None:
    start = time.perf_counter()
    extract_solution(hostile)
    compute_score(hostile, {"target": "a"})
    normalize_answer(hostile)
    assert time.perf_counter() - start < 2.0
