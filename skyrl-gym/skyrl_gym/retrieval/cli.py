"""Command-line entry points: ``skyrl-gym build-index`` and ``skyrl-gym serve-retriever``.

Both take ``argv`` (without the program name) and return an exit status; argument and input errors exit with
status 2 and a message saying what to change, as argparse does.
"""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from skyrl_gym.retrieval.bm25 import DEFAULT_B, DEFAULT_K1, BM25Index, IndexFormatError, build_index
from skyrl_gym.retrieval.corpus import CorpusFormatError, read_corpus
from skyrl_gym.retrieval.data import bundled_corpus_path
from skyrl_gym.retrieval.server import MAX_TOPK, RetrievalServer

__all__ = ["build_index_main", "serve_main"]


def _add_bm25_arguments(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    # When serving a saved index, k1/b default to the values saved with it, hence defaults=False there.
    parser.add_argument("--k1", type=float, default=DEFAULT_K1 if defaults else None, help="BM25 k1")
    parser.add_argument("--b", type=float, default=DEFAULT_B if defaults else None, help="BM25 b")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skyrl-gym build-index",
        description='Build a BM25 index from a Search-R1 corpus (JSON lines of {"id", "contents"}, .gz allowed).',
    )
    parser.add_argument("--corpus", type=Path, default=None, help="corpus file (default: the bundled demo corpus)")
    parser.add_argument("--index", type=Path, required=True, help="output directory for the index")
    _add_bm25_arguments(parser, defaults=True)
    return parser


def build_index_main(argv: Sequence[str] | None = None) -> int:
    """``skyrl-gym build-index --index DIR [--corpus FILE] [--k1 K1] [--b B]``: index a corpus into ``DIR``."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    corpus = args.corpus if args.corpus is not None else bundled_corpus_path()
    started = time.perf_counter()
    try:
        index = build_index(corpus, args.index, k1=args.k1, b=args.b)
    except FileNotFoundError:
        parser.error(f"corpus file {corpus} does not exist")
    except (CorpusFormatError, ValueError, OSError) as exc:
        parser.error(str(exc))
    elapsed = time.perf_counter() - started
    print(
        f"Indexed {index.num_documents} documents ({index.vocabulary_size} terms) from {corpus} "
        f"into {args.index} in {elapsed:.2f}s"
    )
    return 0


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skyrl-gym serve-retriever",
        description="Serve BM25 retrieval over HTTP with the Search-R1 API (POST /retrieve, GET /health). "
        "Without --index or --corpus, serves the bundled demo corpus.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--index", type=Path, default=None, help="an index directory from `skyrl-gym build-index`")
    source.add_argument("--corpus", type=Path, default=None, help="a corpus file, indexed in memory at start-up")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default: %(default)s)")
    parser.add_argument(
        "--topk", type=int, default=3, help="results per query when a request gives no topk (default: %(default)s)"
    )
    _add_bm25_arguments(parser, defaults=False)
    parser.add_argument("--log-level", default="WARNING", help="logging level, e.g. INFO (default: %(default)s)")
    return parser


def _load_index(parser: argparse.ArgumentParser, args: argparse.Namespace) -> BM25Index:
    try:
        if args.index is not None:
            return BM25Index.load(args.index, k1=args.k1, b=args.b)
        corpus = args.corpus if args.corpus is not None else bundled_corpus_path()
        if not Path(corpus).is_file():
            parser.error(f"corpus file {corpus} does not exist")
        k1 = DEFAULT_K1 if args.k1 is None else args.k1
        b = DEFAULT_B if args.b is None else args.b
        return BM25Index.build(read_corpus(corpus), k1=k1, b=b)
    except (FileNotFoundError, IndexFormatError, CorpusFormatError, ValueError) as exc:
        parser.error(str(exc))


def _bind(parser: argparse.ArgumentParser, index: BM25Index, args: argparse.Namespace) -> RetrievalServer:
    if not 1 <= args.topk <= MAX_TOPK:
        parser.error(f"--topk must be between 1 and {MAX_TOPK}, got {args.topk}")
    try:
        return RetrievalServer(index, host=args.host, port=args.port, default_topk=args.topk)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            parser.error(f"{args.host}:{args.port} is already in use; pick another --port (0 picks a free one)")
        parser.error(f"cannot listen on {args.host}:{args.port}: {exc}")


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGINT/SIGTERM while the block runs (signals can only be caught on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve_main(argv: Sequence[str] | None = None) -> int:
    """``skyrl-gym serve-retriever [--index DIR | --corpus FILE] [--host H] [--port P] [--topk K]``.

    Prints one line with the ``/retrieve`` URL once it accepts requests, then serves until SIGINT or SIGTERM,
    and exits 0 after closing every connection.
    """
    parser = _serve_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    index = _load_index(parser, args)
    server = _bind(parser, index, args)
    stop = threading.Event()
    with _stop_on_signals(stop):
        server.start()
        print(f"Serving {index.num_documents} documents at {server.url} (GET {server.base_url}/health)", flush=True)
        try:
            # A timed wait keeps the main thread responsive to signals on every platform.
            while not stop.wait(timeout=0.5):
                pass
        finally:
            server.stop()
    print("Retrieval server stopped", file=sys.stderr, flush=True)
    return 0
