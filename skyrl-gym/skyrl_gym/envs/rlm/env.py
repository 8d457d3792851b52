"""``BaseRLMEnv``: recursive-language-model episodes, where the model answers a query by programming a REPL.

The context (often far longer than the model's window) is never put in the prompt. It lives in the REPL variable
``context``; the model inspects it with Python, can ask a language model about pieces of it (``llm_query``) or
hand sub-tasks to a recursive copy of itself (``rlm_query``), and ends the episode with a final answer.

Action format (the model's reply on each turn):

* Python in a fenced block opened by ```` ```repl ```` and closed by ```` ``` ````. Only the *last* such block
  of a reply runs; its output comes back as the next user message.
* A final answer on a line of its own, outside the code blocks: ``FINAL(answer)`` (the answer may span lines
  up to the first line ending in ``)``), or ``FINAL_VAR(variable_name)`` to answer with the ``str()`` of a REPL
  variable. Model code may also call ``FINAL_VAR(...)`` inside the REPL.

Code runs before the final answer is looked for, so ``FINAL_VAR`` can name a variable the same reply defines.
The episode ends with the first final answer or when ``turns >= max_turns``. The reward comes at the end:
``_get_reward(final_answer)`` (override it; the default gives 1.0 for a non-empty answer), or 0.0 without one.

The ephemeral instruction. ``init`` returns a list ``[system, context description, turn instruction]`` and keeps
a reference to that very list. The turn instruction (query, turn count, what to do next) is meant to be seen
only on the turn it was written for: each ``step`` removes the previous instruction *from that list* and returns
a new one as the last observation. This relies on the caller appending the assistant reply and the returned
observations to the same list object it got from ``init`` (as SkyRL's generator does). A caller that copies
the conversation keeps every instruction instead; nothing else changes. The removal edits the conversation's
history, so a caller that tokenises turn by turn (token-in-token-out) should re-render the prompt from the list.

``extras`` keys (dataset columns and generator-injected values):

* ``max_turns`` (default 10), ``repl_timeout`` (seconds per code run, default 180).
* ``lm_callback``: ``(prompts: list[str]) -> list[str]``; enables ``llm_query``/``llm_query_batched``, and
  ``rlm_query``/``rlm_query_batched`` as plain language-model calls when there is no ``subcall_fn`` (as in
  skyrl-gym 0.4). The system prompt then lists all four helpers.
* ``subcall_fn``: ``(prompt, context=None) -> str``; makes ``rlm_query``/``rlm_query_batched`` run sub-episodes.
* ``depth``: recursion depth of this episode (0 for the root); stored for subclasses and subcall functions.
* ``extra_info.context_text``: the context. A string holding a JSON object is decoded to a ``dict``; any other
  string stays a string; a non-string value is used as is.

``env_config`` keys (deployment settings, all optional): ``repl_isolation`` (``"inline"`` or ``"process"``,
see :class:`~skyrl_gym.envs.rlm.repl.PersistentREPL`), ``repl_allowed_imports`` (module names ``import`` may
load; default none, as in skyrl-gym 0.4) and ``repl_max_output_chars`` (default 20,000).

``BaseRLMEnv`` is not registered; register a subclass (usually one overriding ``_get_reward``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from skyrl_gym.config import config_get
from skyrl_gym.envs.base_text_env import (
    BaseTextEnv,
    BaseTextEnvStepOutput,
    ConversationType,
    EpisodeSample,
    MessageType,
)
from skyrl_gym.envs.rlm.repl import DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_TIMEOUT_S, PersistentREPL, REPLResult

__all__ = ["DEFAULT_MAX_TURNS", "BaseRLMEnv", "extract_repl_blocks", "find_final_answer", "find_final_var"]

DEFAULT_MAX_TURNS: Final = 10
_FENCE: Final = "```"
_OPENING: Final = "```repl"


def extract_repl_blocks(text: str) -> list[str]:
    """The code of every ```` ```repl ```` block in ``text``, in order.

    A block opens with ```` ```repl ```` followed only by spaces up to the end of its line, and closes at the next
    ```` ``` ````. An unclosed block is ignored. Linear time, whatever the input.
    """
    return [code for code, _start, _end in _repl_blocks(text)]


def _repl_blocks(text: str) -> list[tuple[str, int, int]]:
    """``(code, start, end)`` of each repl block; ``text[start:end]`` is the whole fenced block."""
    blocks: list[tuple[str, int, int]] = []
    position = 0
    while (start := text.find(_OPENING, position)) >= 0:
        line_end = text.find("\n", start)
        if line_end < 0:
            break
        if text[start + len(_OPENING) : line_end].strip():  # e.g. ```replace: not a repl block
            position = start + len(_OPENING)
            continue
        close = text.find(_FENCE, line_end + 1)
        if close < 0:
            break  # no later block can be closed either
        blocks.append((text[line_end + 1 : close], start, close + len(_FENCE)))
        position = close + len(_FENCE)
    return blocks


def _prose(text: str) -> str:
    """``text`` without its repl blocks: where final answers are looked for."""
    pieces, position = [], 0
    for _code, start, end in _repl_blocks(text):
        pieces.append(text[position:start])
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


def find_final_var(text: str) -> str | None:
    """The variable name of the first ``FINAL_VAR(name)`` line of ``text`` (quotes stripped), or ``None``."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("FINAL_VAR(") and stripped.endswith(")"):
            return stripped[len("FINAL_VAR(") : -1].strip().strip("'\"").strip()
    return None


def find_final_answer(text: str) -> str | None:
    """The answer of the first ``FINAL(answer)`` in ``text``, stripped; ``None`` if there is none.

    ``FINAL(`` must start a line (after spaces). The answer runs to the last ``)`` of the first line, from
    there on, that ends with ``)``; so ``FINAL(f(x) = 2)`` gives ``f(x) = 2`` and answers may span lines. An
    answer that is never closed does not count (the reply was probably cut off).
    """
    lines = text.splitlines()
    for index, line in enumerate(lines):
        stripped = line.lstrip()
        if not stripped.startswith("FINAL("):
            continue
        rest = [stripped[len("FINAL(") :], *lines[index + 1 :]]
        for end, candidate in enumerate(rest):
            if candidate.rstrip().endswith(")"):
                answer = "\n".join([*rest[:end], candidate.rstrip()[:-1]])
                return answer.strip()
        return None
    return None


def load_context(extra_info: object) -> Any:
    """The episode context from ``extras["extra_info"]["context_text"]`` (``""`` when absent).

    A string that holds a JSON object is decoded to a ``dict``; other strings and non-string values are kept.
    """
    if not isinstance(extra_info, Mapping):
        return ""
    context = extra_info.get("context_text", "")
    if context is None:
        return ""
    if isinstance(context, str) and context.lstrip().startswith("{"):
        try:
            decoded = json.loads(context)
        except ValueError:
            return context
        if isinstance(decoded, dict):
            return decoded
    return context


def describe_context(context: Any) -> str:
    """One line telling the model what ``context`` is, without showing it."""
    if isinstance(context, str):
        return f"Your context is a str of {len(context):,} characters, stored in the REPL variable `context`."
    if isinstance(context, dict):
        keys = list(context)
        shown = ", ".join(repr(key) for key in keys[:10]) + (", ..." if len(keys) > 10 else "")
        size = len(json.dumps(context, default=str))
        return (
            f"Your context is a dict with {len(keys)} keys ({shown}), {size:,} characters as JSON, "
            "stored in the REPL variable `context`."
        )
    if isinstance(context, list | tuple):
        return f"Your context is a {type(context).__name__} of {len(context)} items, in the REPL variable `context`."
    return f"Your context is a {type(context).__name__}, stored in the REPL variable `context`."


class BaseRLMEnv(BaseTextEnv):
    """A text env whose actions program a :class:`~skyrl_gym.envs.rlm.repl.PersistentREPL` (module docstring).

    Attributes:
        max_turns: Turn budget (``extras["max_turns"]``, default 10).
        repl_timeout: Seconds each code run may take (``extras["repl_timeout"]``, default 180).
        lm_callback: ``extras["lm_callback"]`` or ``None``.
        subcall_fn: ``extras["subcall_fn"]`` or ``None``.
        depth: ``extras["depth"]`` (default 0).
        context: The decoded context.
        query: The task, taken from the prompt's non-system messages by ``init``.
        repl: The episode's REPL, created by ``init`` and closed by ``close``.
        conversation: The list ``init`` returned (see the module docstring).
        final_answer: The final answer once given, else ``None``.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.env_config = env_config
        self.extras = dict(extras)
        self.max_turns = int(extras.get("max_turns") or DEFAULT_MAX_TURNS)
        self.repl_timeout = float(extras.get("repl_timeout") or DEFAULT_TIMEOUT_S)
        self.lm_callback = extras.get("lm_callback")
        self.subcall_fn = extras.get("subcall_fn")
        self.depth = int(extras.get("depth") or 0)
        self.context = load_context(extras.get("extra_info"))
        self.query = ""
        self.repl: PersistentREPL | None = None
        self.conversation: ConversationType | None = None
        self.final_answer: str | None = None
        self._system_extra = ""
        self._instruction: MessageType | None = None
        self._reward = 0.0

    # ------------------------------------------------------------------------------------------------ the episode

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the episode: create the REPL and return ``[system, context description, turn instruction]``.

        The returned list is kept as :attr:`conversation`; see the module docstring for why it matters.
        """
        if self.repl is not None:
            self.repl.close()
        self.repl = self._make_repl()
        system_parts = [str(m.get("content", "")) for m in prompt if m.get("role") == "system"]
        self._system_extra = "\n\n".join(part for part in system_parts if part)
        self.query = "\n\n".join(str(m.get("content", "")) for m in prompt if m.get("role") != "system")
        self._instruction = {"role": "user", "content": self._turn_instruction()}
        self.conversation = [
            {"role": "system", "content": self._system_prompt()},
            {"role": "user", "content": describe_context(self.context)},
            self._instruction,
        ]
        return self.conversation, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Run the reply's last repl block, then end the episode on a final answer or at ``max_turns``.

        Never raises for anything in ``action``. Non-final steps return the REPL feedback and the next turn
        instruction, with reward 0.0; the final step returns no observations and the episode reward.

        Raises:
            RuntimeError: ``init`` was not called.
        """
        repl = self._require_repl()
        self.turns += 1
        self._drop_instruction()
        action = action if isinstance(action, str) else str(action)
        blocks = extract_repl_blocks(action)
        result = repl.execute(blocks[-1]) if blocks else None
        answer, problem = self._final_answer(action, repl)
        metadata: dict[str, Any] = {
            "turn": self.turns,
            "code_executed": result is not None,
            "timed_out": bool(result and result.timed_out),
        }
        if answer is not None or self.turns >= self.max_turns:
            return self._finish(answer, metadata)
        self._instruction = {"role": "user", "content": self._turn_instruction()}
        feedback = {"role": "user", "content": self._feedback(result, len(blocks), problem)}
        return {"observations": [feedback, self._instruction], "reward": 0.0, "done": False, "metadata": metadata}

    def _finish(self, answer: str | None, metadata: dict[str, Any]) -> BaseTextEnvStepOutput:
        self.final_answer = answer
        self._instruction = None
        self._reward = float(self._get_reward(answer)) if answer is not None else 0.0
        metadata["final_answer"] = answer
        return {"observations": [], "reward": self._reward, "done": True, "metadata": metadata}

    def _get_reward(self, final_answer: str) -> float:
        """The episode reward for ``final_answer``. Override it; the default is 1.0 for a non-empty answer."""
        return 1.0 if final_answer.strip() else 0.0

    def _final_answer(self, action: str, repl: PersistentREPL) -> tuple[str | None, str | None]:
        """``(answer, problem)``: the final answer if any, else a note on a ``FINAL_VAR`` that failed."""
        if repl.final_value is not None:
            return repl.final_value, None
        prose = _prose(action)
        name = find_final_var(prose)
        if name is not None:
            text = repl.lookup_text(name)
            if text is not None:
                return text, None
            problem = f"FINAL_VAR({name}) was ignored: the REPL has no variable {name!r} that converts to text."
            return None, problem
        return find_final_answer(prose), None

    def _drop_instruction(self) -> None:
        """Remove the previous turn instruction from :attr:`conversation` (by identity, else by equality)."""
        stale, self._instruction = self._instruction, None
        if stale is None or self.conversation is None:
            return
        for index in range(len(self.conversation) - 1, -1, -1):
            if self.conversation[index] is stale:
                del self.conversation[index]
                return
        for index in range(len(self.conversation) - 1, -1, -1):  # the caller may have copied the message
            if self.conversation[index] == stale:
                del self.conversation[index]
                return

    def _require_repl(self) -> PersistentREPL:
        if self.repl is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before init()")
        return self.repl

    def _make_repl(self) -> PersistentREPL:
        """The episode's REPL, configured from ``extras`` and ``env_config``. Override to customise it."""
        return PersistentREPL(
            context=self.context,
            lm_callback=self.lm_callback,
            subcall_fn=self.subcall_fn,
            timeout=self.repl_timeout,
            max_output_chars=int(config_get(self.env_config, "repl_max_output_chars", DEFAULT_MAX_OUTPUT_CHARS)),
            allowed_imports=config_get(self.env_config, "repl_allowed_imports", None),
            isolation=config_get(self.env_config, "repl_isolation", "inline"),
        )

    # --------------------------------------------------------------------------------------------- prompt texts

    def _system_prompt(self) -> str:
        """The system message. Override to change the instructions; it is called once, by ``init``."""
        repl = self._require_repl()
        lines = [
            "You answer a query with the help of a persistent Python REPL. The material you need is in the REPL "
            "variable `context`. Do not guess its content: inspect it with code.",
            "",
            "How to use the REPL:",
            "- Write Python in a block that starts with ```repl on its own line and ends with ```. Only the last "
            "such block of each reply is run.",
            "- Variables persist from turn to turn. Only what you print() is shown to you, up to "
            f"{repl.max_output_chars:,} characters per run.",
            f"- Each run may take at most {repl.timeout:g} seconds.",
            "- " + self._import_rule(),
            "- SHOW_VARS() returns the names and types of the variables you defined.",
        ]
        if self.lm_callback is not None:
            lines.append(
                "- llm_query(prompt) asks a language model and returns its answer as a str; "
                "llm_query_batched(prompts) asks many prompts at once and returns the answers in order."
            )
        if self.subcall_fn is not None:
            lines.append(
                "- rlm_query(prompt, context=None) hands a sub-task (with its own context) to a copy of you "
                "that has its own REPL; rlm_query_batched(prompts, contexts=None) runs several, answers in order."
            )
        elif self.lm_callback is not None:
            lines.append(
                "- rlm_query(prompt, context=None) and rlm_query_batched(prompts, contexts=None) ask the language "
                "model directly here, like llm_query and llm_query_batched; a context you pass is added to the prompt."
            )
        lines += [
            "",
            "When you know the answer, write it on a line of its own, outside any code block:",
            "FINAL(your answer)",
            "or, to answer with the value of a REPL variable:",
            "FINAL_VAR(variable_name)",
            f"You have {self.max_turns} turns.",
        ]
        if self._system_extra:
            lines += ["", self._system_extra]
        return "\n".join(lines)

    def _import_rule(self) -> str:
        allowed = config_get(self.env_config, "repl_allowed_imports", None)
        if allowed:
            return f"You may import only these modules: {', '.join(sorted(allowed))}. open, eval and exec are off."
        return "Import statements, open, eval, exec, compile and input are unavailable; other built-ins work."

    def _turn_instruction(self) -> str:
        """The ephemeral instruction for the next turn (``self.turns`` turns are done)."""
        turn = self.turns + 1
        header = f"Query: {self.query}\n\nTurn {turn} of {self.max_turns}."
        if turn >= self.max_turns:
            return f"{header} This is your last turn: answer now with FINAL(...) or FINAL_VAR(...)."
        if self.turns == 0:
            return f"{header} You have not looked at the context yet: explore it in the REPL before answering."
        return f"{header} Continue in the REPL, or answer with FINAL(...) or FINAL_VAR(...) if you know the answer."

    def _feedback(self, result: REPLResult | None, block_count: int, problem: str | None) -> str:
        """The user message that reports a turn's code run (or its absence) to the model."""
        if result is None:
            text = (
                "No ```repl code block found. Write Python in a ```repl block, or answer with FINAL(answer) "
                "or FINAL_VAR(variable_name) on a line of its own."
            )
        else:
            note = f" (the last of {block_count} blocks)" if block_count > 1 else ""
            text = f"REPL output{note}:\n{result.output or '(no output)'}"
        return f"{text}\n\n{problem}" if problem else text

    # -------------------------------------------------------------------------------------------------- the rest

    def get_metrics(self) -> dict[str, Any]:
        """``turns_used``, ``final_value_set`` (a final answer was given), ``final_answer`` and ``reward``."""
        return {
            "turns_used": self.turns,
            "final_value_set": self.final_answer is not None,
            "final_answer": self.final_answer,
            "reward": self._reward,
        }

    def close(self) -> None:
        """Close the REPL (removing its temporary directory and any child process). Idempotent."""
        if self.repl is not None:
            self.repl.close()

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """A two-turn episode: sum numbers from a JSON context, then answer with ``FINAL_VAR``."""
        return EpisodeSample(
            prompt=[{"role": "user", "content": "What is the sum of the numbers in the context?"}],
            extras={"extra_info": {"context_text": json.dumps({"numbers": [3, 4, 5]})}, "max_turns": 4},
            actions=("```repl\ntotal = sum(context['numbers'])\nprint(total)\n```", "FINAL_VAR(total)"),
        )
