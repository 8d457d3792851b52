r"""Answer extraction and scoring for AIME-style competition math.

Two verification modes are offered:

- Minerva mode (default): the last ``Answer: <text>`` line in the final 300 characters of the response is
  extracted, both it and the ground truth are passed through `normalize_final_answer`, and the two strings
  are compared. This follows the answer normalisation described in the Minerva paper (Lewkowycz et al.,
  2022, "Solving Quantitative Reasoning Problems with Language Models", appendix D) as used by lm-eval.
- Strict-box mode: the content of the last ``\boxed{...}`` in the final 100 characters must equal the ground
  truth exactly, with no normalisation.

`compute_score` returns ``{"score": 1.0 | -1.0, "acc": bool, "pred": str}``; the AIME environment uses
``score`` as the reward and reports ``acc`` and ``pred`` as metadata.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypedDict

# Only the tail of a response is searched: the final answer sits at the end, and bounding the input keeps
# every pattern below cheap regardless of response length.
SOLUTION_TAIL_CHARS = 300
STRICT_BOX_TAIL_CHARS = 100
INVALID_ANSWER = "[INVALID]"

# "Answer: ..." up to the end of the line. "<" also ends the answer so that chat-template tags such as
# "<|im_end|>" that follow the answer on the same line are not part of it.
ANSWER_PATTERN = r"(?i)Answer\s*:\s*([^\n<]+)"

# Plain-text replacements applied in order (Minerva appendix D). Some look odd ("an " -> "") but they are
# part of the reference normalisation, and scores are only comparable if they are kept.
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

# Units, filler words and TeX spacing removed wherever they occur (Minerva appendix D).
REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)

# TeX shorthand: "\frac12" means "\frac{1}{2}" and "\sqrt2" means "\sqrt{2}". Fixed-width patterns.
_FRAC_SHORTHAND = re.compile(r"(frac)([^{])(.)")
_SQRT_SHORTHAND = re.compile(r"(sqrt)([^{])")
# A number written with thousands separators, e.g. "-1,234,567.5".
_GROUPED_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


class AimeScore(TypedDict):
    """Result of `compute_score`.

    Attributes:
        score: 1.0 when the prediction is correct, -1.0 otherwise.
        acc: Whether the prediction is correct.
        pred: The normalised prediction (Minerva mode) or the raw boxed content (strict-box mode);
            ``"[INVALID]"`` when no answer could be extracted.
    """

    score: float
    acc: bool
    pred: str


def last_boxed_only_string(string: str) -> str | None:
    r"""Return the last ``\boxed{...}`` (or ``\fbox{...}``) expression in ``string``, braces included.

    Nested braces are matched, so ``\boxed{\frac{1}{2}}`` is returned whole. The brace-less form
    ``\boxed 5`` is also recognised and returned up to the next ``$``.

    Returns:
        The expression including its command and outer braces, or None when there is no box or the last
        box's braces are unbalanced.
    """
    braced = max(string.rfind("\\boxed{"), string.rfind("\\fbox{"))
    spaced = string.rfind("\\boxed ")
    if spaced > braced:
        return "\\boxed " + string[spaced + len("\\boxed ") :].split("$", 1)[0]
    if braced < 0:
        return None
    depth = 0
    for index in range(string.index("{", braced), len(string)):
        char = string[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return string[braced : index + 1]
    return None


def remove_boxed(s: str) -> str:
    r"""Return the content of a box produced by `last_boxed_only_string`.

    Raises:
        ValueError: If ``s`` is not a ``\boxed{...}``, ``\fbox{...}`` or ``\boxed ...`` expression.
    """
    if s.startswith("\\boxed "):
        return s[len("\\boxed ") :]
    for prefix in ("\\boxed{", "\\fbox{"):
        if s.startswith(prefix) and s.endswith("}"):
            return s[len(prefix) : -1]
    raise ValueError(f"not a boxed expression: {s[:80]!r}")


def _per_line(transform: Callable[[str], str], text: str) -> str:
    """Apply ``transform`` to each line; the reference patterns never match across a newline."""
    return "\n".join(transform(line) for line in text.split("\n"))


def _keep_inline_math(line: str) -> str:
    """Reduce a line holding ``... $x$ ...`` to ``$x$`` (the first inline-math span)."""
    first = line.find("$")
    second = line.find("$", first + 1) if first >= 0 else -1
    if second < 0:
        return line
    return "$" + line[first + 1 : second] + "$"


def _unwrap_command(line: str, command: str) -> str:
    r"""Replace each ``\command{x}`` with ``x``, where ``x`` ends at the first ``}`` (no nesting)."""
    opener = "\\" + command + "{"
    pieces: list[str] = []
    position = 0
    while (start := line.find(opener, position)) >= 0:
        close = line.find("}", start + len(opener))
        if close < 0:
            break
        pieces += [line[position:start], line[start + len(opener) : close]]
        position = close + 1
    pieces.append(line[position:])
    return "".join(pieces)


def _unwrap_boxed(line: str) -> str:
    r"""Replace ``\boxed{x}`` with ``x``, where ``x`` runs to the last ``}`` of the line."""
    start = line.find("\\boxed{")
    close = line.rfind("}")
    if start < 0 or close < start + len("\\boxed{"):
        return line
    return line[:start] + line[start + len("\\boxed{") : close] + line[close + 1 :]


def _strip_markup(line: str) -> str:
    """Keep only the mathematical content of a line: inline math, then text/bold/overline/box wrappers."""
    line = _keep_inline_math(line)
    for command in ("text", "textbf", "overline"):
        line = _unwrap_command(line, command)
    return _unwrap_boxed(line)


def _normalize_number(answer: str) -> str:
    """Drop thousands separators from a number: ``1,000`` -> ``1000``, ``-1,234.5`` -> ``-1234.5``.

    Only well-formed digit groups count, so lists and tuples such as ``3,4`` or ``(1,234)`` keep their
    commas (the Minerva reference would merge ``3,4`` into ``34``).
    """
    return answer.replace(",", "") if _GROUPED_NUMBER.fullmatch(answer) else answer


def normalize_final_answer(final_answer: str) -> str:
    r"""Normalise a final answer so that equivalent answers compare equal as strings.

    Steps, in order: keep the text after the last ``=``; apply `SUBSTITUTIONS` (which also removes all
    spaces); delete `REMOVED_EXPRESSIONS` (units and filler words); reduce ``$...$`` to its content; unwrap
    ``\text{}``, ``\textbf{}``, ``\overline{}`` and ``\boxed{}``; expand ``\frac12`` to ``\frac{1}{2}``
    and ``\sqrt2`` to ``\sqrt{2}``; remove ``$``; drop trailing periods; remove thousands separators from
    plain numbers; strip surrounding whitespace.

    Runs in time linear in the input length.

    Args:
        final_answer: An extracted answer or a ground-truth string.

    Returns:
        The normalised answer.
    """
    answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in REMOVED_EXPRESSIONS:
        answer = answer.replace(expression, "")
    answer = _per_line(_strip_markup, answer)
    answer = _FRAC_SHORTHAND.sub(r"frac{\2}{\3}", answer)
    answer = _SQRT_SHORTHAND.sub(r"sqrt{\2}", answer)
    # A sentence-ending period ("Answer: 42.") is not part of the answer.
    answer = answer.replace("$", "").strip().rstrip(".")
    return _normalize_number(answer).strip()


def extract_answer(solution_str: str) -> str | None:
    """Return the raw text of the last ``Answer: ...`` line in ``solution_str``, or None if there is none."""
    matches = re.findall(ANSWER_PATTERN, solution_str)
    return matches[-1] if matches else None


def verify_minerva(solution_str: str, ground_truth: str) -> tuple[bool, str]:
    """Compare the last ``Answer:`` of ``solution_str`` with ``ground_truth`` after normalising both.

    Returns:
        ``(correct, normalised_prediction)``; the prediction is ``"[INVALID]"`` when there is no answer.
    """
    raw = extract_answer(solution_str)
    prediction = INVALID_ANSWER if raw is None else normalize_final_answer(raw)
    return prediction == normalize_final_answer(ground_truth), prediction


def verify_strict_box(solution_str: str, ground_truth: str) -> tuple[bool, str]:
    r"""Compare the content of the last ``\boxed{}`` in ``solution_str`` with ``ground_truth`` exactly.

    The whole of ``solution_str`` is searched; `compute_score` passes only the response's tail.

    Returns:
        ``(correct, boxed_content)``; the content is ``"[INVALID]"`` when there is no complete box.
    """
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return False, INVALID_ANSWER
    prediction = remove_boxed(boxed)
    return prediction == ground_truth, prediction


def compute_score(
    solution_str: str,
    ground_truth: str,
    strict_box_verify: bool = False,
    pause_tokens_index: Sequence[int] | None = None,
) -> AimeScore:
    """Score an AIME response.

    Args:
        solution_str: The model's response.
        ground_truth: The reference answer (non-strings are compared via ``str()``).
        strict_box_verify: Use strict-box mode instead of Minerva mode (see the module docstring).
        pause_tokens_index: Strict-box mode only: character offsets of the four pause tokens in
            ``solution_str``; the box is then searched from 100 characters before the last one to the end,
            instead of in the last 100 characters.

    Returns:
        ``{"score": 1.0 or -1.0, "acc": correct, "pred": prediction}``.

    Raises:
        ValueError: If ``pause_tokens_index`` is given but does not hold exactly four offsets.
    """
    truth = str(ground_truth)
    if not strict_box_verify:
        correct, prediction = verify_minerva(solution_str[-SOLUTION_TAIL_CHARS:], truth)
    elif pause_tokens_index is None:
        correct, prediction = verify_strict_box(solution_str[-STRICT_BOX_TAIL_CHARS:], truth)
    else:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must hold 4 offsets, got {len(pause_tokens_index)}")
        window_start = max(0, pause_tokens_index[-1] - STRICT_BOX_TAIL_CHARS)
        correct, prediction = verify_strict_box(solution_str[window_start:], truth)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": prediction}
