"""The tokenizer shared by index building and querying.

Both sides must tokenize identically, so this is the one place that decides what a term is: a maximal run of
Unicode letters and digits, lower-cased, minus a short list of English function words.
"""

from __future__ import annotations

import re

__all__ = ["STOPWORDS", "TOKENIZER_VERSION", "tokenize"]

TOKENIZER_VERSION = 1
"""Bumped whenever :func:`tokenize` changes, so an index built by another version is rejected on load."""

# Letters and digits only: `_` is a word character for `\w` but never a useful term on its own.
_TERM = re.compile(r"[^\W_]+")

STOPWORDS: frozenset[str] = frozenset(
    # Written as text: one quoted string per line would be 60 lines long.
    """
    a an and are as at be been by did do does for from had has have he her his how i if in into is it its
    of on or s she so t than that the their them then there these they this to was were what when where
    which while who whom whose why will with
    """.split()  # noqa: SIM905
)
"""Function words dropped from documents and queries: they carry no topic and only slow scoring down.

Kept short on purpose: question words ("who", "which") go, but content-bearing words such as "first", "river"
or "born" stay, because questions about the bundled corpus are phrased with them.
"""


def tokenize(text: str) -> list[str]:
    """Split ``text`` into index terms, in order, duplicates kept.

    Example: ``tokenize("The Ovel River's source, in 1820!")`` is ``["ovel", "river", "source", "1820"]``.
    """
    return [term for term in _TERM.findall(text.lower()) if term not in STOPWORDS]
