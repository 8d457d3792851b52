"""What a REPL run and its language-model calls give back, shared by the REPL and its child-process backend.

:class:`REPLResult` is the outcome of one run; :func:`cap_text` caps its output. :func:`lm_texts` and
:func:`subcall_value` answer ``llm_query`` and ``rlm_query`` calls, turning failures into text for the model
(``LM_ERROR_PREFIX``, ``RLM_ERROR_PREFIX``): a failed call never raises into model code. All of these are
re-exported by :mod:`skyrl_gym.envs.rlm.repl`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

from skyrl_gym.error import Error

__all__ = [
    "LM_ERROR_PREFIX",
    "RLM_ERROR_PREFIX",
    "CappedText",
    "LMCallback",
    "REPLResult",
    "REPLStartError",
    "SubcallFn",
    "cap_text",
    "lm_texts",
    "subcall_value",
]

LMCallback = Callable[[list[str]], list[str]]
"""Answers a batch of prompts: ``lm_callback(prompts) -> responses``, one response per prompt, in order.

A response may also be an exception instance (or ``None``) to report that one item failed."""

SubcallFn = Callable[..., Any]
"""Runs a recursive sub-episode: ``subcall_fn(prompt, context=None) -> str`` (the child's final answer).

Called as ``subcall_fn(prompt)`` when model code gives no context, else ``subcall_fn(prompt, context)``."""

LM_ERROR_PREFIX: Final = "Error: LM query failed - "
RLM_ERROR_PREFIX: Final = "Error: RLM query failed - "


class REPLStartError(Error, RuntimeError):
    """The child process of ``PersistentREPL(isolation="process")`` did not start; the message says why."""


@dataclasses.dataclass(frozen=True)
class REPLResult:
    """What one :meth:`PersistentREPL.execute` call produced.

    Attributes:
        stdout: Everything model code printed, capped (see :mod:`skyrl_gym.envs.rlm.repl`).
        stderr: The traceback of an uncaught exception, or the timeout message; ``""`` after a clean run.
        error: A one-line summary such as ``"ZeroDivisionError: division by zero"``; ``None`` after a clean run.
        timed_out: The run exceeded the timeout.
        still_running: The run timed out and could not be stopped; it keeps running in a background thread.
        execution_time: Wall-clock seconds the run took (up to the timeout for a run that timed out).
    """

    stdout: str
    stderr: str = ""
    error: str | None = None
    timed_out: bool = False
    still_running: bool = False
    execution_time: float = 0.0

    @property
    def output(self) -> str:
        """``stdout`` followed by ``stderr``: the text to show the model."""
        if not self.stderr:
            return self.stdout
        if self.stdout and not self.stdout.endswith("\n"):
            return f"{self.stdout}\n{self.stderr}"
        return self.stdout + self.stderr


class CappedText:
    """A write-only text buffer that keeps the first ``limit`` characters and counts the rest."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[str] = []
        self._size = 0
        self._dropped = 0

    def write(self, text: str) -> int:
        """Keep what fits of ``text``; return its whole length, as a text stream's ``write`` does."""
        room = self._limit - self._size
        kept = text[: max(room, 0)]
        if kept:
            self._parts.append(kept)
            self._size += len(kept)
        self._dropped += len(text) - len(kept)
        return len(text)

    def getvalue(self) -> str:
        """The kept text, followed by a one-line note of how much was dropped (if anything was)."""
        text = "".join(self._parts)
        if self._dropped:
            text += f"\n... [output truncated: {self._dropped} more characters]\n"
        return text


def cap_text(text: str, limit: int) -> str:
    """``text`` cut to its first ``limit`` characters plus a truncation note, as the REPL caps its output."""
    buffer = CappedText(limit)
    buffer.write(text)
    return buffer.getvalue()


def lm_texts(lm_callback: LMCallback, prompts: list[str]) -> list[str]:
    """Answer ``prompts`` with one ``lm_callback`` call; failures become ``LM_ERROR_PREFIX`` texts, per item.

    A raising callback or a response list of the wrong length fails every item; an exception instance or
    ``None`` in the responses fails only its own item. Never raises an ``Exception``.
    """
    if not prompts:
        return []
    try:
        responses = list(lm_callback(list(prompts)))
    except Exception as exc:  # any callback failure is reported to the model as text
        return [f"{LM_ERROR_PREFIX}{exc}"] * len(prompts)
    if len(responses) != len(prompts):
        why = f"the LM callback returned {len(responses)} responses for {len(prompts)} prompts"
        return [f"{LM_ERROR_PREFIX}{why}"] * len(prompts)
    return [_lm_text(response) for response in responses]


def _lm_text(response: object) -> str:
    if isinstance(response, BaseException):
        return f"{LM_ERROR_PREFIX}{response}"
    if response is None:
        return f"{LM_ERROR_PREFIX}no response"
    return response if isinstance(response, str) else str(response)


def subcall_value(subcall_fn: SubcallFn, prompt: str, context: Any = None) -> Any:
    """Run one sub-episode; return its answer, or an ``RLM_ERROR_PREFIX`` text if ``subcall_fn`` raised."""
    try:
        return subcall_fn(prompt) if context is None else subcall_fn(prompt, context)
    except Exception as exc:  # a failed child is reported to the model as text
        return f"{RLM_ERROR_PREFIX}{exc}"
