"""Okapi BM25 over an in-memory inverted index, and its on-disk format.

Scoring (Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009), for a query
``q`` and a document ``d``, summed over the *distinct* query terms ``t`` that occur in ``d``::

    idf(t)     = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))        # the Lucene form: never negative
    score(q,d) = Σ_t idf(t) · tf(t,d) · (k1 + 1) / (tf(t,d) + k1 · (1 - b + b · |d| / avgdl))

``N`` is the number of documents, ``df(t)`` the number containing ``t``, ``tf(t,d)`` the count of ``t`` in ``d``,
``|d|`` the number of terms of ``d`` (after tokenization) and ``avgdl`` the mean of ``|d|``. ``k1`` and ``b`` are
query-time parameters: the index stores raw counts, so they can be changed when loading.

On disk an index is a directory::

    meta.json          format name and version, tokenizer version, k1, b, counts
    vocabulary.json    the terms, sorted; a term's id is its position
    indptr.npy         int64[V + 1]: term t's postings are [indptr[t], indptr[t + 1])
    doc_ids.npy        int32[P]: document rows of the postings, ascending within a term
    term_freqs.npy     int32[P]: tf of the term in that document
    doc_lengths.npy    int32[N]: |d| per document row
    documents.jsonl    the corpus rows, in row order

Loading reads the arrays with ``numpy.load`` (optionally memory-mapped) and the two JSON files; nothing is
re-tokenized.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from skyrl_gym.retrieval.corpus import Document, read_corpus
from skyrl_gym.retrieval.tokenize import TOKENIZER_VERSION, tokenize

__all__ = [
    "DEFAULT_B",
    "DEFAULT_K1",
    "BM25Index",
    "IndexFormatError",
    "SearchHit",
    "build_index",
]

DEFAULT_K1: Final = 1.2
"""Term-frequency saturation: larger values let repeated terms keep adding score for longer."""

DEFAULT_B: Final = 0.75
"""Length normalisation: 0 ignores document length, 1 divides fully by relative length."""

FORMAT_NAME: Final = "skyrl-gym-bm25"
FORMAT_VERSION: Final = 1

_ARRAY_FILES: Final = ("indptr", "doc_ids", "term_freqs", "doc_lengths")

IntArray = npt.NDArray[np.integer[Any]]
RowArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class IndexFormatError(ValueError):
    """A directory does not hold an index this version can read; the message says how to rebuild it."""


@dataclasses.dataclass(frozen=True)
class SearchHit:
    """One retrieved document.

    Attributes:
        row: The document's row in the index (its position in the corpus file).
        score: Its BM25 score for the query; always > 0.
    """

    row: int
    score: float


@dataclasses.dataclass(frozen=True)
class _Postings:
    """The inverted index arrays (see the module docstring for their meaning)."""

    indptr: IntArray
    doc_ids: IntArray
    term_freqs: IntArray
    doc_lengths: IntArray


class BM25Index:
    """A BM25-searchable collection of documents. Immutable after construction, so safe to share across threads.

    Build one with :meth:`build` (from corpus rows) or :func:`build_index` (from a corpus file, saving it), and
    reopen a saved one with :meth:`load`.

    Attributes:
        documents: The corpus rows, in row order (owned by the index; treat as read-only).
        k1: The term-frequency saturation parameter.
        b: The length-normalisation parameter.
    """

    def __init__(
        self,
        documents: Sequence[Document],
        vocabulary: Sequence[str],
        postings: _Postings,
        *,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
    ) -> None:
        _check_parameters(k1, b)
        if len(postings.doc_lengths) != len(documents) or len(postings.indptr) != len(vocabulary) + 1:
            raise IndexFormatError(
                f"inconsistent index: {len(documents)} documents but {len(postings.doc_lengths)} lengths, "
                f"{len(vocabulary)} terms but {len(postings.indptr)} postings offsets"
            )
        self.documents = list(documents)
        self.k1 = float(k1)
        self.b = float(b)
        self._vocabulary = list(vocabulary)
        self._term_ids = {term: term_id for term_id, term in enumerate(self._vocabulary)}
        self._postings = postings
        lengths = postings.doc_lengths.astype(np.float64)
        mean_length = float(lengths.mean()) if len(lengths) else 0.0
        # An all-empty corpus has no postings, so avgdl only has to avoid a division by zero.
        self.avg_doc_length = mean_length if mean_length > 0 else 1.0
        # The length-dependent part of the denominator, once per document instead of once per posting.
        self._length_norm: FloatArray = self.k1 * (1.0 - self.b + self.b * lengths / self.avg_doc_length)
        doc_freqs = np.diff(postings.indptr).astype(np.float64)
        n_docs = float(len(self.documents))
        self._idf: FloatArray = np.log1p((n_docs - doc_freqs + 0.5) / (doc_freqs + 0.5))

    @property
    def num_documents(self) -> int:
        """How many documents the index holds."""
        return len(self.documents)

    @property
    def vocabulary_size(self) -> int:
        """How many distinct terms the index holds."""
        return len(self._vocabulary)

    def idf(self, term: str) -> float:
        """The idf of an (already tokenized) term; 0.0 for a term the index has never seen."""
        term_id = self._term_ids.get(term)
        return 0.0 if term_id is None else float(self._idf[term_id])

    @classmethod
    def build(cls, documents: Iterable[Document], *, k1: float = DEFAULT_K1, b: float = DEFAULT_B) -> BM25Index:
        """Index corpus rows (dicts with a string ``"contents"``) in the order given.

        Raises:
            ValueError: ``documents`` is empty, or ``k1``/``b`` are out of range.
        """
        rows: list[Document] = []
        term_docs: dict[str, list[int]] = {}
        term_counts: dict[str, list[int]] = {}
        lengths: list[int] = []
        for row_index, row in enumerate(documents):
            counts = Counter(tokenize(row["contents"]))
            rows.append(row)
            lengths.append(sum(counts.values()))
            for term, count in counts.items():
                term_docs.setdefault(term, []).append(row_index)
                term_counts.setdefault(term, []).append(count)
        if not rows:
            raise ValueError("cannot build a BM25 index from an empty corpus")
        vocabulary = sorted(term_docs)
        sizes = [len(term_docs[term]) for term in vocabulary]
        postings = _Postings(
            indptr=np.concatenate(([0], np.cumsum(sizes, dtype=np.int64))).astype(np.int64),
            doc_ids=_flatten(term_docs, vocabulary),
            term_freqs=_flatten(term_counts, vocabulary),
            doc_lengths=np.asarray(lengths, dtype=np.int32),
        )
        return cls(rows, vocabulary, postings, k1=k1, b=b)

    def scores(self, query: str) -> FloatArray:
        """The BM25 score of every document for ``query``, as a float64 array of length :attr:`num_documents`."""
        dense = np.zeros(self.num_documents, dtype=np.float64)
        rows, contributions = self._contributions(query)
        np.add.at(dense, rows, contributions)
        return dense

    def search(self, query: str, topk: int) -> list[SearchHit]:
        """The ``topk`` best documents for ``query``, best first.

        Only documents sharing at least one term with the query are returned, so there may be fewer than
        ``topk`` hits (none for a query made only of stopwords or unknown terms). Equal scores are ordered by
        row, so results are deterministic.

        Raises:
            ValueError: ``topk`` is less than 1.
        """
        if topk < 1:
            raise ValueError(f"topk must be at least 1, got {topk}")
        rows, contributions = self._contributions(query)
        if len(rows) == 0:
            return []
        # Sum contributions per document over the postings touched, never over the whole collection.
        candidates, inverse = np.unique(rows, return_inverse=True)
        totals = np.bincount(inverse, weights=contributions)
        # `candidates` is ascending, so a stable sort on -score breaks ties by row.
        best = np.argsort(-totals, kind="stable")[:topk]
        return [SearchHit(row=int(candidates[i]), score=float(totals[i])) for i in best]

    def _contributions(self, query: str) -> tuple[RowArray, FloatArray]:
        """Per posting of each distinct known query term: (document row, that term's score contribution)."""
        term_ids = sorted({self._term_ids[t] for t in tokenize(query) if t in self._term_ids})
        all_rows: list[IntArray] = []
        all_contributions: list[FloatArray] = []
        p = self._postings
        for term_id in term_ids:
            start, end = int(p.indptr[term_id]), int(p.indptr[term_id + 1])
            rows = p.doc_ids[start:end]
            tf = p.term_freqs[start:end].astype(np.float64)
            all_rows.append(rows)
            all_contributions.append(self._idf[term_id] * tf * (self.k1 + 1.0) / (tf + self._length_norm[rows]))
        if not all_rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return np.concatenate(all_rows).astype(np.int64), np.concatenate(all_contributions)

    def save(self, directory: str | Path) -> Path:
        """Write the index to ``directory`` (created if needed; existing index files are replaced).

        Returns:
            The directory, as a ``Path``.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        p = self._postings
        arrays = {"indptr": p.indptr, "doc_ids": p.doc_ids, "term_freqs": p.term_freqs, "doc_lengths": p.doc_lengths}
        for name in _ARRAY_FILES:
            np.save(out / f"{name}.npy", arrays[name], allow_pickle=False)
        (out / "vocabulary.json").write_text(json.dumps(self._vocabulary, ensure_ascii=False), encoding="utf-8")
        with open(out / "documents.jsonl", "w", encoding="utf-8") as stream:
            for row in self.documents:
                stream.write(json.dumps(row, ensure_ascii=False) + "\n")
        # meta.json last: a directory with a meta.json holds a complete index.
        (out / "meta.json").write_text(json.dumps(self._meta(), indent=2) + "\n", encoding="utf-8")
        return out

    def _meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "tokenizer_version": TOKENIZER_VERSION,
            "k1": self.k1,
            "b": self.b,
            "num_documents": self.num_documents,
            "num_terms": self.vocabulary_size,
            "num_postings": len(self._postings.doc_ids),
            "avg_doc_length": self.avg_doc_length,
        }

    @classmethod
    def load(
        cls, directory: str | Path, *, k1: float | None = None, b: float | None = None, mmap: bool = False
    ) -> BM25Index:
        """Open an index written by :meth:`save`.

        Args:
            directory: The index directory.
            k1: Override the saved ``k1``.
            b: Override the saved ``b``.
            mmap: Memory-map the postings arrays instead of reading them into memory.

        Raises:
            FileNotFoundError: ``directory`` holds no ``meta.json``.
            IndexFormatError: The index was written by an incompatible version, or its files disagree.
        """
        source = Path(directory)
        meta = _read_meta(source)
        mode: Any = "r" if mmap else None
        arrays = {name: np.load(source / f"{name}.npy", mmap_mode=mode, allow_pickle=False) for name in _ARRAY_FILES}
        vocabulary = json.loads((source / "vocabulary.json").read_text(encoding="utf-8"))
        documents = list(read_corpus(source / "documents.jsonl"))
        return cls(
            documents,
            vocabulary,
            _Postings(**arrays),
            k1=meta["k1"] if k1 is None else k1,
            b=meta["b"] if b is None else b,
        )


def build_index(
    corpus_jsonl: str | Path, out_dir: str | Path, *, k1: float = DEFAULT_K1, b: float = DEFAULT_B
) -> BM25Index:
    """Index a Search-R1 corpus file (JSON lines of ``{"id", "contents"}``, optionally gzipped) into ``out_dir``.

    Returns:
        The built index (already saved).

    Raises:
        FileNotFoundError: ``corpus_jsonl`` does not exist.
        skyrl_gym.retrieval.corpus.CorpusFormatError: A corpus row is malformed (the message names the line).
        ValueError: The corpus is empty.
    """
    index = BM25Index.build(read_corpus(corpus_jsonl), k1=k1, b=b)
    index.save(out_dir)
    return index


def _flatten(per_term: dict[str, list[int]], vocabulary: list[str]) -> IntArray:
    flat = [value for term in vocabulary for value in per_term[term]]
    return np.asarray(flat, dtype=np.int32)


def _check_parameters(k1: float, b: float) -> None:
    if not (math.isfinite(k1) and k1 >= 0):
        raise ValueError(f"k1 must be a finite number >= 0, got {k1}")
    if not (math.isfinite(b) and 0 <= b <= 1):
        raise ValueError(f"b must be between 0 and 1, got {b}")


def _read_meta(source: Path) -> dict[str, Any]:
    meta_path = source / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"no BM25 index at {source} (missing meta.json); build one with "
            f"`skyrl-gym build-index --corpus CORPUS.jsonl --index {source}`"
        )
    meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
    found = (meta.get("format"), meta.get("format_version"), meta.get("tokenizer_version"))
    expected = (FORMAT_NAME, FORMAT_VERSION, TOKENIZER_VERSION)
    if found != expected:
        raise IndexFormatError(
            f"the index at {source} has (format, format version, tokenizer version) {found}, this version of "
            f"skyrl-gym reads {expected}; rebuild it with `skyrl-gym build-index --index {source}`"
        )
    return meta
