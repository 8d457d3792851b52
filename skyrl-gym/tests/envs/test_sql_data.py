import json
import sqlite3
from pathlib import Path

import pytest

import skyrl_gym
from skyrl_gym.envs.sql.data import (
    BUNDLED,
    DB_IDS,
    SYSTEM_PROMPT,
    bundled_db_file,
    bundled_db_path,
    bundled_questions,
    episode,
    schema_sql,
)
from skyrl_gym.envs.sql.data.build import DEFAULT_SEED, QUESTIONS, build_all, build_database, main
from skyrl_gym.envs.sql.utils import execute_sql

DATA_DIR = Path(bundled_db_path()).parent


def dump(db_file: Path | str) -> list[str]:
    conn = sqlite3.connect(Path(db_file).as_uri() + "?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def written_by_this_sqlite(db_file: Path) -> bool:
    """Whether the file header names the running SQLite library as its last writer (bytes 96-99)."""
    major, minor, patch = sqlite3.sqlite_version_info
    version = int.from_bytes(db_file.read_bytes()[96:100], "big")
    return version == major * 1_000_000 + minor * 1_000 + patch


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("regenerated")
    build_all(out)
    return out


def test_layout_and_size() -> None:
    assert Path(bundled_db_path()) == DATA_DIR / "databases"
    for db_id in DB_IDS:
        assert Path(bundled_db_file(db_id)) == DATA_DIR / "databases" / db_id / f"{db_id}.sqlite"
        assert Path(bundled_db_file(db_id)).is_file()
    total = sum(p.stat().st_size for p in DATA_DIR.rglob("*") if p.suffix in (".sqlite", ".jsonl"))
    assert total < 1_000_000


@pytest.mark.parametrize("db_id", DB_IDS)
def test_shipped_databases_equal_a_fresh_build(fresh: Path, db_id: str) -> None:
    shipped = Path(bundled_db_file(db_id))
    rebuilt = fresh / "databases" / db_id / f"{db_id}.sqlite"
    assert dump(shipped) == dump(rebuilt)
    if written_by_this_sqlite(shipped):
        # Same library, same statements: the files must be identical byte for byte.
        assert shipped.read_bytes() == rebuilt.read_bytes()


def test_shipped_questions_equal_a_fresh_build(fresh: Path) -> None:
    assert (DATA_DIR / "questions.jsonl").read_bytes() == (fresh / "questions.jsonl").read_bytes()


def test_build_is_deterministic_and_seeded(tmp_path: Path) -> None:
    first, second, other = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "c.sqlite"
    build_database("school", first)
    build_database("school", second)
    build_database("school", other, seed=DEFAULT_SEED + 1)
    assert first.read_bytes() == second.read_bytes()
    assert dump(first) != dump(other)


def test_build_replaces_existing_files_and_cli(tmp_path: Path) -> None:
    target = tmp_path / "databases" / "flights" / "flights.sqlite"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"not a database")
    main(["--out", str(tmp_path)])
    assert dump(target) == dump(bundled_db_file("flights"))
    assert (tmp_path / "questions.jsonl").is_file()


@pytest.mark.parametrize("db_id", DB_IDS)
def test_databases_are_consistent(db_id: str) -> None:
    conn = sqlite3.connect(Path(bundled_db_file(db_id)).as_uri() + "?mode=ro", uri=True)
    try:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert len(tables) >= 3
        for table in tables:
            (count,) = conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
            assert 20 <= count <= 200, (table, count)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        with_foreign_keys = [t for t in tables if conn.execute(f"PRAGMA foreign_key_list({t})").fetchall()]
        assert len(with_foreign_keys) >= 2
    finally:
        conn.close()


def test_questions_file_matches_the_source_list() -> None:
    questions = bundled_questions()
    assert len(questions) >= 30
    assert [(q["db_id"], q["question"], q["sql"]) for q in questions] == list(QUESTIONS)
    for line in (DATA_DIR / "questions.jsonl").read_text(encoding="utf-8").splitlines():
        assert set(json.loads(line)) == {"db_id", "question", "sql"}
    assert {q["db_id"] for q in questions} == set(DB_IDS)
    assert len({q["question"] for q in questions}) == len(questions)


@pytest.mark.parametrize("question", bundled_questions(), ids=lambda q: q["question"][:40])
def test_every_gold_query_runs_and_returns_rows(question: dict[str, str]) -> None:
    rows = execute_sql(bundled_db_file(question["db_id"]), question["sql"], timeout=10)
    assert rows


def test_schema_and_episode() -> None:
    schema = schema_sql("school")
    assert schema.startswith("CREATE TABLE departments")
    assert schema.count("CREATE TABLE") == 5
    with pytest.raises(FileNotFoundError):
        schema_sql("nope")
    question = bundled_questions()[-1]
    prompt, extras = episode(question, max_turns=3)
    assert prompt[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert question["question"] in prompt[1]["content"]
    assert "CREATE TABLE airports" in prompt[1]["content"]
    assert extras == {
        "db_id": question["db_id"],
        "data": BUNDLED,
        "reward_spec": {"method": "rule", "ground_truth": question["sql"]},
        "max_turns": 3,
    }
    env = skyrl_gym.make("text2sql", extras=extras)
    assert env.init(prompt)[0] == prompt
