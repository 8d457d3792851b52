r"""Multi-turn chat templating, token in / token out, without re-rendering earlier turns.

A multi-turn trajectory is one growing token sequence::

    prompt ids (template, generation prompt)  → generated ids → observation ids → generated ids → …

The generated ids are exactly what the engine sampled; they are never decoded and re-encoded. Only the
observation messages an env returns are rendered, with the *fixed base conversation* trick: render a fixed
``[system, user, assistant]`` conversation followed by the new messages, and keep only the part after the base
conversation's last end-of-turn token. Rendering the new messages alone would not work: many templates insert a
default system message when the first message is not a system one (Qwen2.5), or group consecutive tool messages
depending on the previous message's role. Ending the base on an assistant turn puts the template in the same state
it is in after the model's reply, so the ids appended equal those a full re-render of the conversation would have
at that position: no drift between what the model saw and what the trainer trains on.

End of turn. After the model's reply the template expects the end-of-turn token (``<|im_end|>`` for ChatML and
Qwen, ``<|eot_id|>`` for Llama 3); the observation ids start right after it (with ChatML: ``"\n<|im_start|>user…"``).

- The model stopped by sampling the end-of-turn token: it is the last generated id, trained like any other.
- It stopped on a stop string or ran out of tokens: there is no end-of-turn token. When another turn follows, the
  generator appends one as a *non-generated* token (loss mask 0, log-probability 0.0) so the next observation
  renders as the template would render it. When the episode ends there, nothing is appended: the trainer should
  not learn an end of turn the model never produced, and no observation needs it.

:func:`ChatEncoder.needs_end_of_turn` says which case applies. Templates must render the end-of-turn token as a
special (added) token, so that text can be cut right after it without changing how the rest tokenizes; every
common chat model's template does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["ChatEncoder", "decode", "encode", "find_end_of_turn_token_id", "render"]

Message = Mapping[str, Any]

# Stand-ins for the part of the conversation that precedes new observations. The system message is explicit so
# that templates with a default system prompt do not insert theirs; the second form is for templates that reject
# the system role.
_BASE_CONVERSATIONS: tuple[tuple[dict[str, str], ...], ...] = (
    (
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "I am a user."},
        {"role": "assistant", "content": "I am an assistant."},
    ),
    (
        {"role": "user", "content": "I am a user."},
        {"role": "assistant", "content": "I am an assistant."},
    ),
)
_SENTINEL = "SKYRLENDOFTURNPROBE"


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The chat template applied to ``messages`` as text (``chat_template_kwargs`` go to the template)."""
    text = tokenizer.apply_chat_template(
        [dict(message) for message in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **dict(chat_template_kwargs or {}),
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
    return text


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Ids of rendered template text; special tokens come from the text, none are added."""
    return [int(token) for token in tokenizer.encode(text, add_special_tokens=False)]


def decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
    """Text of one id sequence."""
    text = tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
    if not isinstance(text, str):  # decode returns a list only for batched input
        raise TypeError(f"decode returned {type(text).__name__}, expected str")
    return text


def find_end_of_turn_token_id(
    tokenizer: PreTrainedTokenizerBase, chat_template_kwargs: Mapping[str, Any] | None = None
) -> int:
    """The token the template puts right after an assistant message's content.

    Found by rendering a probe assistant message and reading the first token after it, so it works for ChatML
    (``<|im_end|>``), Llama 3 (``<|eot_id|>``), Gemma (``<end_of_turn>``) and the like. Falls back to the
    tokenizer's EOS token when the template renders no special (added) token right after the content.

    Raises:
        ValueError: Neither the template nor the tokenizer defines one.
    """
    probe = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": _SENTINEL}]
    text = render(tokenizer, probe, add_generation_prompt=False, chat_template_kwargs=chat_template_kwargs)
    suffix = text[text.rfind(_SENTINEL) + len(_SENTINEL) :] if _SENTINEL in text else ""
    suffix_ids = encode(tokenizer, suffix)
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    if suffix_ids and suffix_ids[0] in special:
        return suffix_ids[0]
    eos = tokenizer.eos_token_id
    if isinstance(eos, int):
        return eos
    raise ValueError("Cannot tell the end-of-turn token: the chat template renders none and there is no EOS token")


class ChatEncoder:
    """Token ids for a growing conversation: the prompt once, then only the new observation messages.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        chat_template_kwargs: Extra template variables (``tools``, ``enable_thinking``, …) used in every render.
        end_of_turn_token_id: Override the detected end-of-turn token (see :func:`find_end_of_turn_token_id`).

    Attributes:
        end_of_turn_token_id: The token that closes an assistant turn.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        end_of_turn_token_id: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if end_of_turn_token_id is None:
            end_of_turn_token_id = find_end_of_turn_token_id(tokenizer, self.chat_template_kwargs)
        self.end_of_turn_token_id = end_of_turn_token_id
        self._end_of_turn_text = decode(tokenizer, [end_of_turn_token_id], skip_special_tokens=False)
        self._base, self._base_prefix = self._find_base()

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Ids of the whole initial conversation, ending with the generation prompt."""
        return encode(self.tokenizer, self._render(messages, add_generation_prompt=True))

    def observation_ids(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> list[int]:
        r"""Ids to append after an assistant turn that ended with the end-of-turn token.

        Args:
            messages: The env's new messages (may be empty: then only the generation prompt, if any).
            add_generation_prompt: Open the next assistant turn; False when no turn follows.

        Returns:
            Everything a full render of ``[...history, assistant reply, *messages]`` has after the reply's
            end-of-turn token (with ChatML: ``"\n<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n"``).
        """
        text = self._render([*self._base, *messages], add_generation_prompt=add_generation_prompt)
        if not text.startswith(self._base_prefix):
            raise ValueError(
                "The chat template renders the base conversation differently when messages follow it; "
                "observation ids cannot be sliced off a fixed prefix with this template."
            )
        return encode(self.tokenizer, text[len(self._base_prefix) :])

    def needs_end_of_turn(self, generated_ids: Sequence[int]) -> bool:
        """True when a turn's generated ids do not end with the end-of-turn token (stop string, length, empty)."""
        return not generated_ids or generated_ids[-1] != self.end_of_turn_token_id

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids without special tokens: what an env sees as the model's action."""
        return decode(self.tokenizer, ids, skip_special_tokens=True)

    def _render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return render(
            self.tokenizer,
            messages,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def _find_base(self) -> tuple[tuple[dict[str, str], ...], str]:
        """The first base conversation the template accepts, and its text up to its last end-of-turn token."""
        errors: list[str] = []
        for base in _BASE_CONVERSATIONS:
            try:
                text = self._render(base, add_generation_prompt=False)
            except Exception as exc:  # a template may reject the system role; try the next base
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            cut = text.rfind(self._end_of_turn_text)
            if cut >= 0:
                return base, text[: cut + len(self._end_of_turn_text)]
            errors.append(f"the end-of-turn token {self._end_of_turn_text!r} does not appear in {text!r}")
        raise ValueError(f"Cannot render a base conversation with this chat template: {'; '.join(errors)}")
