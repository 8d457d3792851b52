import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from skyrl_gym.retrieval import BM25Index, CorpusFormatError, IndexFormatError, build_index, read_corpus, tokenize

# Three documents, avgdl = (2 + 3 + 4) / 3 = 3, N = 3.
TINY = [
    {"id": "d0", "contents": "apple banana"},
    {"id": "d1", "contents": "apple apple cherry"},
    {"id": "d2", "contents": "banana cherry cherry date"},
]


@pytest.fixture
def tiny() -> BM25Index:
    return BM25Index.build(TINY, k1=1.5, b=0.75)


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --- tokenizer ---------------------------------------------------------------------------------------------------


def test_tokenize_lowercases_splits_and_drops_stopwords() -> None:
    assert tokenize("The Ovel River's source, in 1820!") == ["ovel", "river", "source", "1820"]
    assert tokenize("snake_case and CamelCase") == ["snake", "case", "camelcase"]
    assert tokenize("Who is the? ... of") == []
    assert tokenize("Zürich straße") == ["zürich", "straße"]


# --- scoring, checked against values computed by hand ------------------------------------------------------------


def test_idf_by_hand(tiny: BM25Index) -> None:
    # df(apple) = 2: ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln(1.6)
    assert tiny.idf("apple") == pytest.approx(0.4700036292)
    # df(date) = 1: ln(1 + 2.5 / 1.5) = ln(8/3)
    assert tiny.idf("date") == pytest.approx(0.9808292530)
    assert tiny.idf("unknown") == 0.0


def test_scores_by_hand(tiny: BM25Index) -> None:
    scores = tiny.scores("apple")
    # d0: tf=1, |d|=2: norm = 1.5 * (0.25 + 0.75 * 2/3) = 1.125; 1 * 2.5 / 2.125 = 1.17647...; × ln 1.6
    # d1: tf=2, |d|=3: norm = 1.5;                             2 * 2.5 / 3.5   = 1.42857...; × ln 1.6
    np.testing.assert_allclose(scores, [0.5529454461, 0.6714337560, 0.0], rtol=1e-9)


def test_multi_term_query_sums_terms_and_counts_each_distinct_term_once(tiny: BM25Index) -> None:
    # "date cherry": d2 has cherry (tf=2, |d|=4) and date (tf=1).
    #   norm(d2) = 1.5 * (0.25 + 0.75 * 4/3) = 1.875
    #   cherry: idf = ln 1.6;  2 * 2.5 / 3.875 = 1.290322... -> 0.6064563
    #   date:   idf = ln(8/3); 1 * 2.5 / 2.875 = 0.869565... -> 0.8528950
    # d1 has cherry (tf=1, |d|=3): 1 * 2.5 / 2.5 = 1 -> ln 1.6 = 0.4700036
    expected = [0.0, 0.4700036292, 0.6064562958 + 0.8528950026]
    np.testing.assert_allclose(tiny.scores("date cherry"), expected, rtol=1e-6)
    np.testing.assert_allclose(tiny.scores("date cherry cherry DATE"), expected, rtol=1e-6)


def test_search_ranks_best_first_and_only_returns_matching_documents(tiny: BM25Index) -> None:
    hits = tiny.search("apple", topk=10)
    assert [h.row for h in hits] == [1, 0]
    assert hits[0].score == pytest.approx(0.6714337560)
    assert [h.row for h in tiny.search("apple", topk=1)] == [1]
    assert tiny.search("the of and", topk=3) == []
    assert tiny.search("zebra", topk=3) == []


def test_search_breaks_ties_by_row() -> None:
    index = BM25Index.build([{"contents": "same words"}, {"contents": "other"}, {"contents": "same words"}])
    hits = index.search("same", topk=3)
    assert [h.row for h in hits] == [0, 2]
    assert hits[0].score == hits[1].score


def test_parameters_change_scores_as_the_formula_says() -> None:
    # With b = 0 length does not matter; with k1 = 0 only presence does (score = idf).
    no_length = BM25Index.build(TINY, k1=1.5, b=0.0)
    assert no_length.scores("apple")[0] == pytest.approx(math.log(1.6) * 2.5 / 2.5)
    presence = BM25Index.build(TINY, k1=0.0, b=0.75)
    np.testing.assert_allclose(presence.scores("apple"), [math.log(1.6), math.log(1.6), 0.0])


@pytest.mark.parametrize(("k1", "b"), [(-1.0, 0.5), (1.2, 1.5), (float("nan"), 0.5)])
def test_invalid_parameters_are_rejected(k1: float, b: float) -> None:
    with pytest.raises(ValueError, match=r"^(k1|b) must be"):
        BM25Index.build(TINY, k1=k1, b=b)


def test_topk_must_be_positive(tiny: BM25Index) -> None:
    with pytest.raises(ValueError, match="topk"):
        tiny.search("apple", topk=0)


def test_empty_corpus_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Index.build([])


def test_documents_with_no_terms_are_fine() -> None:
    index = BM25Index.build([{"contents": "the of"}, {"contents": ""}])
    assert index.search("anything", topk=2) == []
    index = BM25Index.build([{"contents": "the"}, {"contents": "river"}])
    assert [h.row for h in index.search("river", topk=2)] == [1]


# --- on-disk round trip ------------------------------------------------------------------------------------------


def test_build_index_writes_a_directory_that_loads_back_identically(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", TINY)
    built = build_index(corpus, tmp_path / "index", k1=1.5, b=0.75)
    names = {p.name for p in (tmp_path / "index").iterdir()}
    assert names == {
        "meta.json",
        "vocabulary.json",
        "indptr.npy",
        "doc_ids.npy",
        "term_freqs.npy",
        "doc_lengths.npy",
        "documents.jsonl",
    }
    meta = json.loads((tmp_path / "index" / "meta.json").read_text())
    assert meta["num_documents"] == 3
    assert (meta["k1"], meta["b"]) == (1.5, 0.75)
    for mmap in (False, True):
        loaded = BM25Index.load(tmp_path / "index", mmap=mmap)
        assert loaded.documents == built.documents
        assert (loaded.k1, loaded.b, loaded.vocabulary_size) == (1.5, 0.75, built.vocabulary_size)
        for query in ("apple", "banana cherry", "date", "nothing"):
            np.testing.assert_array_equal(loaded.scores(query), built.scores(query))
            assert loaded.search(query, 3) == built.search(query, 3)


def test_load_can_override_parameters(tmp_path: Path) -> None:
    BM25Index.build(TINY, k1=1.5, b=0.75).save(tmp_path)
    loaded = BM25Index.load(tmp_path, k1=0.0)
    assert (loaded.k1, loaded.b) == (0.0, 0.75)
    np.testing.assert_allclose(loaded.scores("apple"), [math.log(1.6), math.log(1.6), 0.0])


def test_extra_document_fields_survive_the_round_trip(tmp_path: Path) -> None:
    rows = [{"id": "x", "contents": "alpha", "title": "A", "meta": {"n": 1}}]
    BM25Index.build(rows).save(tmp_path)
    assert BM25Index.load(tmp_path).documents == rows


def test_loading_a_missing_index_says_how_to_build_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="skyrl-gym build-index"):
        BM25Index.load(tmp_path / "nope")


def test_loading_an_incompatible_index_is_rejected(tmp_path: Path) -> None:
    BM25Index.build(TINY).save(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta["tokenizer_version"] = 999
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="rebuild"):
        BM25Index.load(tmp_path)


# --- corpus files ------------------------------------------------------------------------------------------------


def test_read_corpus_reads_gzip_skips_blank_lines_and_defaults_ids(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write('{"contents": "first"}\n\n{"id": 7, "contents": "second"}\n')
    assert list(read_corpus(path)) == [{"id": "0", "contents": "first"}, {"id": "7", "contents": "second"}]


@pytest.mark.parametrize(
    ("line", "message"),
    [("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object"), ('{"id": "1"}', '"contents"')],
)
def test_malformed_corpus_rows_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"contents": "fine"}\n' + line + "\n")
    with pytest.raises(CorpusFormatError, match=message) as info:
        list(read_corpus(path))
    assert "bad.jsonl:2" in str(info.value)
