import time

import pytest

from skyrl_gym.envs.aime.utils import (
    INVALID_ANSWER,
    compute_score,
    extract_answer,
    last_boxed_only_string,
    normalize_final_answer,
    remove_boxed,
    verify_minerva,
    verify_strict_box,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("42", "42"),
        (" 42 ", "42"),
        ("42.", "42"),
        ("x = 42", "42"),
        ("a + b = c = 17", "17"),
        ("$42$", "42"),
        ("The answer is $42$.", "42"),
        ("\\$5", "5"),
        ("\\boxed{42}", "42"),
        ("$\\boxed{42}$", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\dfrac34", "\\dfrac{3}{4}"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("2\\sqrt3", "2\\sqrt{3}"),
        ("\\sqrt{3}", "\\sqrt{3}"),
        ("\\text{(B)}", "(B)"),
        ("\\textbf{7}", "7"),
        ("\\mbox{7}", "7"),
        ("\\overline{12}", "12"),
        ("1,000", "1000"),
        ("1,000,000", "1000000"),
        ("-1,234", "-1234"),
        ("1,234.5", "1234.5"),
        ("(1,234)", "(1,234)"),  # an ordered pair keeps its comma
        ("3, 4", "3,4"),  # a list, not a grouped number
        ("1,0,0", "1,0,0"),
        ("12,34", "12,34"),
        ("10 dollars", "10"),
        ("25 cm", "25"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("5 \\text{ inches}", "5"),
        ("\\$1{,}000", "1000"),
        ("a 5", "5"),
        ("2 \\text{ and } 3", "2,3"),
        ("", ""),
        ("π/2", "π/2"),
    ],
)
def test_normalize_final_answer(raw: str, expected: str) -> None:
    assert normalize_final_answer(raw) == expected


def test_normalize_is_idempotent_on_plain_numbers() -> None:
    for value in ["0", "7", "123", "999", "-3", "2.5"]:
        assert normalize_final_answer(normalize_final_answer(value)) == value


def test_normalize_keeps_newlines_local() -> None:
    # Inline math and \text are reduced per line, as the reference regular expressions do.
    assert normalize_final_answer("$1$ x\n\\text{y}") == "1\ny"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "\\boxed{42}"),
        ("\\boxed{1} then \\boxed{2}", "\\boxed{2}"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}} end", "\\boxed{\\frac{1}{\\sqrt{2}}}"),
        ("\\fbox{9}", "\\fbox{9}"),
        ("\\boxed 5$ more", "\\boxed 5"),
        ("\\boxed{unclosed", None),
        ("no box", None),
        ("", None),
    ],
)
def test_last_boxed_only_string(text: str, expected: str | None) -> None:
    assert last_boxed_only_string(text) == expected


@pytest.mark.parametrize(
    ("boxed", "content"),
    [("\\boxed{42}", "42"), ("\\boxed{}", ""), ("\\fbox{x}", "x"), ("\\boxed 5", "5"), ("\\boxed{{a}}", "{a}")],
)
def test_remove_boxed(boxed: str, content: str) -> None:
    assert remove_boxed(boxed) == content


@pytest.mark.parametrize("not_boxed", ["42", "\\boxed{42", "boxed{42}", ""])
def test_remove_boxed_rejects_other_text(not_boxed: str) -> None:
    with pytest.raises(ValueError, match="not a boxed expression"):
        remove_boxed(not_boxed)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("work\nAnswer: 42", "42"),
        ("answer:17", "17"),
        ("ANSWER :  5 apples", "5 apples"),
        ("Answer: 1\nmore\nAnswer: 2", "2"),
        ("Answer: 42<|im_end|>", "42"),
        ("Answer: 42</s>", "42"),
        ("Answer:\n7", "7"),
        ("the answer is 42", None),
        ("", None),
    ],
)
def test_extract_answer(response: str, expected: str | None) -> None:
    assert extract_answer(response) == expected


def test_compute_score_correct() -> None:
    result = compute_score("Let me think.\nAnswer: 204", "204")
    assert result == {"score": 1.0, "acc": True, "pred": "204"}


def test_compute_score_wrong_is_minus_one() -> None:
    result = compute_score("Answer: 203", "204")
    assert result == {"score": -1.0, "acc": False, "pred": "203"}


def test_compute_score_without_answer_is_invalid() -> None:
    result = compute_score("I think it is 204", "204")
    assert result == {"score": -1.0, "acc": False, "pred": INVALID_ANSWER}


def test_compute_score_normalises_both_sides() -> None:
    assert compute_score("Answer: $\\boxed{1,000}$.", "1000")["acc"] is True
    assert compute_score("Answer: 1000", "\\boxed{1,000}")["acc"] is True
    assert compute_score("Answer: \\frac12", "\\frac{1}{2}")["acc"] is True
    assert compute_score("Answer: 60 degrees", "60")["acc"] is True
    assert compute_score("Answer: x = 5", "5")["acc"] is True


def test_compute_score_cuts_chat_end_tags() -> None:
    assert compute_score("Answer: 33<|im_end|>", "33")["acc"] is True


def test_compute_score_only_reads_last_300_characters() -> None:
    early_answer = "Answer: 12\n" + "filler " * 60
    assert compute_score(early_answer, "12")["pred"] == INVALID_ANSWER
    late_answer = "filler " * 60 + "\nAnswer: 12"
    assert compute_score(late_answer, "12")["acc"] is True


def test_compute_score_uses_last_answer() -> None:
    assert compute_score("Answer: 1\nwait, no.\nAnswer: 2", "2")["score"] == 1.0
    assert compute_score("Answer: 2\nwait, no.\nAnswer: 1", "2")["score"] == -1.0


def test_compute_score_leading_zeros_are_not_normalised() -> None:
    assert compute_score("Answer: 042", "42")["acc"] is False


def test_compute_score_accepts_integer_ground_truth() -> None:
    assert compute_score("Answer: 7", 7)["acc"] is True  # type: ignore[arg-type]


def test_strict_box_mode() -> None:
    assert compute_score("so \\boxed{42}", "42", strict_box_verify=True) == {
        "score": 1.0,
        "acc": True,
        "pred": "42",
    }
    # No normalisation in strict mode: the boxed text must equal the ground truth exactly.
    assert compute_score("so \\boxed{42.}", "42", strict_box_verify=True)["acc"] is False
    assert compute_score("Answer: 42", "42", strict_box_verify=True)["pred"] == INVALID_ANSWER
    # Only the last 100 characters are searched.
    assert compute_score("\\boxed{42}" + "x" * 100, "42", strict_box_verify=True)["acc"] is False


def test_strict_box_with_pause_tokens() -> None:
    text = "\\boxed{42}" + "x" * 150 + "<pause>" + "y" * 20
    last_pause = text.index("<pause>")
    assert compute_score(text, "42", strict_box_verify=True)["acc"] is False
    # With pause tokens the window starts 100 characters before the last pause token.
    assert compute_score(text, "42", strict_box_verify=True, pause_tokens_index=[0, 0, 0, 40])["acc"] is True
    assert compute_score(text, "42", strict_box_verify=True, pause_tokens_index=[0, 0, 0, last_pause])["acc"] is False
    with pytest.raises(ValueError, match="4 offsets"):
        compute_score(text, "42", strict_box_verify=True, pause_tokens_index=[1, 2])


def test_verify_helpers() -> None:
    assert verify_minerva("Answer: 5", "5") == (True, "5")
    assert verify_strict_box("\\boxed{5}", "5") == (True, "5")
    assert verify_strict_box("5", "5") == (False, INVALID_ANSWER)


@pytest.mark.parametrize(
    "hostile",
    [
        "\\text{" * 20_000,
        "$" * 100_000,
        "\\boxed{" * 15_000,
        "{" * 100_000,
        "frac" * 25_000,
        "Answer:" + " " * 100_000,
        "a" * 100_000 + "=" * 10,
        "\\text{a" + "}" * 100_000,
        ("Answer: " + "1" * 50 + "\n") * 2_000,
    ],
)
def test_long_inputs_do_not_hang(hostile: str) -> None:
    start = time.perf_counter()
    normalize_final_answer(hostile)
    compute_score(hostile, hostile)
    compute_score(hostile, "1", strict_box_verify=True)
    last_boxed_only_string(hostile)
    assert time.perf_counter() - start < 2.0
