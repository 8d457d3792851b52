import json
from pathlib import Path

import pytest

from skyrl_gym.envs.search.utils import em_check
from skyrl_gym.retrieval import (
    BM25Index,
    bundled_corpus_path,
    bundled_questions_path,
    load_bundled_questions,
    read_corpus,
)
from skyrl_gym.retrieval.data import make_corpus


@pytest.fixture(scope="module")
def corpus() -> list[dict[str, str]]:
    return list(read_corpus(bundled_corpus_path()))


def test_shipped_files_equal_a_fresh_regeneration(tmp_path: Path) -> None:
    corpus_path, questions_path = make_corpus.write(tmp_path)
    assert corpus_path.read_bytes() == bundled_corpus_path().read_bytes()
    assert questions_path.read_bytes() == bundled_questions_path().read_bytes()


def test_generation_is_deterministic_and_depends_on_the_seed() -> None:
    assert make_corpus.generate() == make_corpus.generate()
    assert make_corpus.generate(seed=1) != make_corpus.generate()


def test_bundled_files_are_small() -> None:
    total = bundled_corpus_path().stat().st_size + bundled_questions_path().stat().st_size
    assert total < 2 * 1024 * 1024


def test_corpus_is_in_search_r1_format(corpus: list[dict[str, str]]) -> None:
    assert 300 <= len(corpus) <= 1000
    assert [row["id"] for row in corpus] == [str(n) for n in range(len(corpus))]
    titles = []
    for row in corpus:
        assert set(row) == {"id", "contents"}
        title, _, text = row["contents"].partition("\n")
        assert title.startswith('"')
        assert title.endswith('"')
        assert text
        titles.append(title)
    assert len(set(titles)) == len(titles)


def test_questions_are_answerable_from_their_supporting_documents(corpus: list[dict[str, str]]) -> None:
    questions = load_bundled_questions()
    assert 90 <= len(questions) <= 120
    assert len({q["id"] for q in questions}) == len(questions)
    assert {q["hops"] for q in questions} == {1, 2}
    assert sum(q["hops"] == 2 for q in questions) >= 30
    for question in questions:
        assert len(question["supporting_ids"]) == question["hops"]
        last_hop = corpus[int(question["supporting_ids"][-1])]["contents"]
        assert any(answer in last_hop for answer in question["golden_answers"]), question
        assert em_check(question["golden_answers"][0], question["golden_answers"])


def test_multi_hop_questions_chain_through_the_first_document(corpus: list[dict[str, str]]) -> None:
    for question in load_bundled_questions():
        if question["hops"] == 2:
            first, second = (corpus[int(i)]["contents"] for i in question["supporting_ids"])
            bridge = second.partition("\n")[0].strip('"')
            assert bridge in first, question


def test_bm25_finds_the_supporting_document_of_single_hop_questions(corpus: list[dict[str, str]]) -> None:
    index = BM25Index.build(corpus)
    single = [q for q in load_bundled_questions() if q["hops"] == 1]
    found = sum(q["supporting_ids"][0] in {corpus[h.row]["id"] for h in index.search(q["question"], 3)} for q in single)
    assert found / len(single) >= 0.9


def test_question_rows_have_the_documented_fields() -> None:
    with open(bundled_questions_path(), encoding="utf-8") as lines:
        first = json.loads(next(lines))
    assert list(first) == ["id", "question", "golden_answers", "hops", "supporting_ids"]
