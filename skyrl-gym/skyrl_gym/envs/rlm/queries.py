"""The queries model code in a REPL can make: ``llm_query``, ``rlm_query`` and their batched forms.

:class:`ModelQueries` is a base class of :class:`~skyrl_gym.envs.rlm.repl.PersistentREPL`: its methods are what
the REPL's scaffold binds under those names (see :mod:`skyrl_gym.envs.rlm.repl` for what model code sees). They
use only the REPL's ``lm_callback`` and ``subcall_fn``, and never raise into model code for a failed call: the
failure comes back as an error text (see :func:`~skyrl_gym.envs.rlm.results.lm_texts`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from skyrl_gym.envs.rlm.results import LMCallback, SubcallFn, lm_texts, subcall_value

__all__ = ["ModelQueries", "fallback_prompt", "parse_child_answer"]

_RLM_CALLBACKS: Final = "subcall_fn=... or lm_callback"  # what rlm_query needs, for its error message
_SUBCALL_WORKERS: Final = 2  # rlm_query_batched runs at most this many sub-episodes at once


def fallback_prompt(prompt: Any, context: Any = None) -> str:
    """The ``llm_query`` prompt of an ``rlm_query`` without ``subcall_fn``: the prompt, then the context if any."""
    if context is None:
        return str(prompt)
    return f"{prompt}\n\nContext:\n{context}"


def parse_child_answer(answer: Any) -> Any:
    """A child's answer as a Python value: ``ast.literal_eval`` of a string when it is a literal, else as is."""
    if not isinstance(answer, str):
        return answer
    try:
        return ast.literal_eval(answer)
    except Exception:  # literal_eval raises several types (and MemoryError/RecursionError on huge input)
        return answer


class ModelQueries:
    """``llm_query``, ``llm_query_batched``, ``rlm_query`` and ``rlm_query_batched`` over two callbacks.

    Attributes:
        lm_callback: Answers prompts for ``llm_query``/``llm_query_batched``, and for ``rlm_query`` without
            ``subcall_fn``; ``None``: those queries raise RuntimeError.
        subcall_fn: Runs sub-episodes for ``rlm_query``/``rlm_query_batched``; ``None``: the language model
            answers them instead.
    """

    lm_callback: LMCallback | None
    subcall_fn: SubcallFn | None

    def llm_query(self, prompt: Any, model: str | None = None) -> str:
        """Ask the language model one prompt (``str(prompt)``); failures come back as an error text.

        ``model`` is accepted for skyrl-gym 0.4 code and ignored: ``lm_callback`` decides which model answers.
        """
        callback = self._require(self.lm_callback, "llm_query", "lm_callback")
        return lm_texts(callback, [str(prompt)])[0]

    def llm_query_batched(self, prompts: Iterable[Any], model: str | None = None) -> list[str]:
        """Ask the language model many prompts in one call; answers in prompt order, failures per item.

        ``model`` is ignored, as in :meth:`llm_query`.
        """
        callback = self._require(self.lm_callback, "llm_query_batched", "lm_callback")
        return lm_texts(callback, [str(prompt) for prompt in prompts])

    def rlm_query(self, prompt: Any, context: Any = None, *, model: str | None = None) -> Any:
        """Run a recursive sub-episode on ``prompt`` (and its own ``context``); return its parsed answer.

        Without ``subcall_fn`` the language model answers instead (see the module docstring): the result is its
        text, and ``context``, if given, is appended to the prompt. ``model`` is ignored.

        Raises:
            RuntimeError: The REPL has neither ``subcall_fn`` nor ``lm_callback``.
        """
        if self.subcall_fn is None:
            self._require(self.lm_callback, "rlm_query", _RLM_CALLBACKS)
            return self.llm_query(fallback_prompt(prompt, context))
        return parse_child_answer(subcall_value(self.subcall_fn, str(prompt), context))

    def rlm_query_batched(
        self,
        prompts: Iterable[Any],
        contexts: Iterable[Any] | None = None,
        *,
        model: str | None = None,
        context_list: Iterable[Any] | None = None,
    ) -> list[Any]:
        """Run sub-episodes, two at a time, and return their parsed answers in prompt order.

        A failed sub-episode yields an ``RLM_ERROR_PREFIX`` text in its slot; the others are unaffected. Without
        ``subcall_fn`` all prompts go to the language model in one ``llm_query_batched`` call instead (contexts
        appended as in :meth:`rlm_query`). ``context_list`` is skyrl-gym 0.4's name for ``contexts``; ``model``
        is ignored.

        Raises:
            ValueError: ``contexts`` is given with a different length than ``prompts``.
            TypeError: Both ``contexts`` and ``context_list`` are given.
            RuntimeError: The REPL has neither ``subcall_fn`` nor ``lm_callback``.
        """
        if contexts is not None and context_list is not None:
            raise TypeError("rlm_query_batched takes contexts or context_list, not both")
        if self.subcall_fn is None:
            self._require(self.lm_callback, "rlm_query_batched", _RLM_CALLBACKS)
        prompt_list = list(prompts)
        given = contexts if contexts is not None else context_list
        context_values = [None] * len(prompt_list) if given is None else list(given)
        if len(context_values) != len(prompt_list):
            raise ValueError(f"rlm_query_batched got {len(prompt_list)} prompts but {len(context_values)} contexts")
        pairs = zip(prompt_list, context_values, strict=True)
        if self.subcall_fn is None:
            return self.llm_query_batched([fallback_prompt(prompt, context) for prompt, context in pairs])
        return self._run_subcalls([(str(prompt), context) for prompt, context in pairs])

    def _run_subcalls(self, calls: list[tuple[str, Any]]) -> list[Any]:
        """``rlm_query`` of each ``(prompt, context)``, two at a time; the answers in order."""
        if not calls:
            return []
        pool = ThreadPoolExecutor(max_workers=min(_SUBCALL_WORKERS, len(calls)), thread_name_prefix="rlm-sub")
        try:
            futures = [pool.submit(self.rlm_query, prompt, context) for prompt, context in calls]
            return [future.result() for future in futures]
        finally:
            # No waiting: if a timeout interrupts this call, the sub-episodes still running finish unobserved.
            pool.shutdown(wait=False, cancel_futures=True)

    # skyrl-gym 0.4's names for the helpers; code written against it compares the scaffold with these.
    _llm_query = llm_query
    _llm_query_batched = llm_query_batched
    _rlm_query = rlm_query
    _rlm_query_batched = rlm_query_batched

    @staticmethod
    def _require(callback: Any, helper: str, argument: str) -> Any:
        if callback is None:
            raise RuntimeError(f"{helper} needs PersistentREPL({argument}=...)")
        return callback
