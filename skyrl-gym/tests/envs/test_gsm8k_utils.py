import time

import pytest

from skyrl_gym.envs.gsm8k.utils import compute_score, extract_solution


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("#### -5", "-5"),
        ("#### 1,000", "1000"),
        ("#### 1,234,567", "1234567"),
        ("#### 3.75", "3.75"),
        ("#### -0.5", "-0.5"),
        ("The total is #### 72 dollars", "72"),
        ("#### 72.", "72."),  # a sentence-ending period is kept, as in the reference scorer
        ("####72", None),  # the marker needs its space
        ("#### $72", None),  # the number must follow the marker directly
        ("# 72", None),
        ("", None),
        ("no answer here", None),
        ("#### 12\n#### 13", "12"),  # the first marker wins
        ("#### ٧٢", None),  # only ASCII digits
    ],
)
def test_extract_solution_strict(response: str, expected: str | None) -> None:
    assert extract_solution(response) == expected
    assert extract_solution(response, method="strict") == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("first 3 then 4 and finally 5.", "5."),
        ("answer: $1,000", "1000"),
        ("It costs -7 dollars.", "-7"),
        ("ends with punctuation ... .", None),
        ("12, then a comma ,", "12"),
        ("", None),
        ("no digits", None),
    ],
)
def test_extract_solution_flexible(response: str, expected: str | None) -> None:
    assert extract_solution(response, method="flexible") == expected


def test_extract_solution_rejects_unknown_method() -> None:
    with pytest.raises(ValueError, match="strict"):
        extract_solution("#### 1", method="loose")  # type: ignore[arg-type]


def test_compute_score_correct_and_wrong() -> None:
    assert compute_score("so #### 72", "72") == 1.0
    assert compute_score("so #### 71", "72") == 0.0
    assert compute_score("so #### 1,000", "1000") == 1.0


def test_compute_score_no_answer_is_integer_zero() -> None:
    result = compute_score("I do not know", "72")
    assert result == 0
    assert isinstance(result, int)


def test_compute_score_custom_rewards() -> None:
    assert compute_score("#### 3", "3", format_score=0.1, score=2.0) == 2.0
    assert compute_score("#### 4", "3", format_score=0.1, score=2.0) == 0.1
    assert compute_score("no marker", "3", format_score=0.1, score=2.0) == 0


def test_compute_score_is_exact_string_equality() -> None:
    assert compute_score("#### 72.0", "72") == 0.0
    assert compute_score("#### 072", "72") == 0.0
    assert compute_score("#### 72.", "72") == 0.0


def test_compute_score_flexible() -> None:
    assert compute_score("The answer is 18.", "18.", method="flexible") == 1.0
    assert compute_score("The answer is 18", "18", method="flexible") == 1.0
    assert compute_score("nothing numeric", "18", method="flexible") == 0


def test_compute_score_non_string_ground_truth() -> None:
    assert compute_score("#### 18", 18) == 1.0  # type: ignore[arg-type]


def test_compute_score_unicode_and_noise() -> None:
    assert compute_score("🙂 résultat: #### 42 ✓", "42") == 1.0


@pytest.mark.parametrize(
    "hostile",
    [
        "#### " + "1" * 100_000,
        "####" * 25_000,
        "#### " + "1," * 50_000,
        "-" * 100_000,
        "1." * 50_000 + "x",
    ],
)
def test_long_inputs_do_not_hang(hostile: str) -> None:
    start = time.perf_counter()
    compute_score(hostile, "1")
    extract_solution(hostile, method="flexible")
    assert time.perf_counter() - start < 2.0
