import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from skyrl_gym.retrieval import BM25Index, build_index_main, bundled_corpus_path, serve_main
from skyrl_gym.retrieval.__main__ import main as module_main


def test_build_index_main_indexes_the_bundled_corpus_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_index_main(["--index", str(tmp_path / "idx"), "--k1", "0.9", "--b", "0.4"]) == 0
    assert "Indexed" in capsys.readouterr().out
    index = BM25Index.load(tmp_path / "idx")
    assert (index.k1, index.b) == (0.9, 0.4)
    assert index.num_documents == len(bundled_corpus_path().read_text(encoding="utf-8").splitlines())


def test_build_index_main_reports_a_missing_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_index_main(["--corpus", str(tmp_path / "missing.jsonl"), "--index", str(tmp_path / "idx")])
    assert info.value.code == 2
    assert "does not exist" in capsys.readouterr().err


def test_build_index_main_reports_a_malformed_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(json.dumps({"id": "1", "text": "no contents"}) + "\n")
    with pytest.raises(SystemExit):
        build_index_main(["--corpus", str(corpus), "--index", str(tmp_path / "idx")])
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_build_index_main_requires_an_output(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_index_main([])
    assert "--index" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--index", "/nonexistent/index"], "skyrl-gym build-index"),
        (["--corpus", "/nonexistent/corpus.jsonl"], "does not exist"),
        (["--topk", "0"], "--topk"),
        (["--index", "a", "--corpus", "b"], "not allowed with"),
    ],
)
def test_serve_main_reports_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        serve_main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_module_main_dispatches_and_prints_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert module_main([]) == 2
    assert "usage" in capsys.readouterr().err
    assert module_main(["build", "--index", str(tmp_path / "idx")]) == 0
    assert (tmp_path / "idx" / "meta.json").is_file()


def test_serve_subprocess_answers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    assert build_index_main(["--index", str(tmp_path / "idx")]) == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "skyrl_gym.retrieval", "serve", "--index", str(tmp_path / "idx"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        url = banner.split(" at ")[1].split()[0]
        hits = requests.post(url, json={"query": "capital", "topk": 2}, timeout=10).json()["result"][0]
        assert len(hits) == 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.communicate()  # reap the pipes
