"""A real retrieval service for the ``search`` envs: BM25 over a Search-R1 corpus, served over HTTP.

::

    from skyrl_gym.retrieval import RetrievalServer, build_index, bundled_corpus_path

    index = build_index(bundled_corpus_path(), "/tmp/bm25")        # or BM25Index.load("/tmp/bm25")
    with RetrievalServer(index, port=0) as server:
        env = skyrl_gym.make("search", env_config={"search_url": server.url}, extras=...)

From the command line: ``skyrl-gym build-index`` / ``skyrl-gym serve-retriever`` or, equivalently,
``python -m skyrl_gym.retrieval build ...`` / ``python -m skyrl_gym.retrieval serve ...``.
"""

from skyrl_gym.retrieval.bm25 import DEFAULT_B, DEFAULT_K1, BM25Index, IndexFormatError, SearchHit, build_index
from skyrl_gym.retrieval.cli import build_index_main, serve_main
from skyrl_gym.retrieval.corpus import CorpusFormatError, Document, read_corpus
from skyrl_gym.retrieval.data import bundled_corpus_path, bundled_questions_path, load_bundled_questions
from skyrl_gym.retrieval.server import RetrievalServer
from skyrl_gym.retrieval.tokenize import tokenize

__all__ = [
    "DEFAULT_B",
    "DEFAULT_K1",
    "BM25Index",
    "CorpusFormatError",
    "Document",
    "IndexFormatError",
    "RetrievalServer",
    "SearchHit",
    "build_index",
    "build_index_main",
    "bundled_corpus_path",
    "bundled_questions_path",
    "load_bundled_questions",
    "read_corpus",
    "serve_main",
    "tokenize",
]
