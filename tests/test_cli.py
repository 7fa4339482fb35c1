from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arag.cli.main import app
from arag.errors import CorpusError

runner = CliRunner()


def test_help_lists_the_commands() -> None:
    out = runner.invoke(app, ["--help"]).output
    for word in ("library", "papers", "corpus", "bench"):
        assert word in out
    lib = runner.invoke(app, ["library", "--help"]).output
    for word in ("build", "status", "add"):
        assert word in lib


def test_build_status_papers_round_trip(
    monkeypatch: pytest.MonkeyPatch, qasper_path: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_TOPICS__K", "2")
    res = runner.invoke(app, ["library", "build", "--max-papers", "3", "--json", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    assert "papers added" in res.output
    summary = json.loads((tmp_path / "b.json").read_text())
    assert summary["papers_added"] == 3

    status = runner.invoke(app, ["library", "status", "--json"])
    assert status.exit_code == 0, status.output
    st = json.loads(status.output)
    assert st["papers"] == 3 and st["chunks"] == summary["chunks_added"]

    listing = runner.invoke(app, ["papers", "--json"])
    rows = [json.loads(line) for line in listing.output.splitlines()]
    assert [r["id"] for r in rows] == ["1601.00901", "1601.01705", "1601.02166"]
    topic = rows[0]["topic"]
    only = runner.invoke(app, ["papers", "--json", "--topic", str(topic)])
    assert all(json.loads(line)["topic"] == topic for line in only.output.splitlines())
    assert "label" in runner.invoke(app, ["papers", "--topics"]).output
    recl = runner.invoke(app, ["library", "topics", "--recluster"])
    assert recl.exit_code == 0, recl.output
    assert json.loads(runner.invoke(app, ["papers", "--json"]).output.splitlines()[0])["topic"] is not None


def test_missing_corpus_exits_with_a_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_CORPUS__QASPER_PATH", str(tmp_path / "nowhere.jsonl.gz"))
    res = runner.invoke(app, ["library", "build"])
    assert res.exit_code == CorpusError.exit_code
    assert "nowhere.jsonl.gz" in res.output and "fix:" in res.output


def test_status_of_an_empty_library_says_what_to_do() -> None:
    res = runner.invoke(app, ["library", "status"])
    assert res.exit_code == 0
    assert "arag library build" in res.output


def test_bench_build_writes_figures(
    monkeypatch: pytest.MonkeyPatch, qasper_path: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("ARAG_EMBEDDING__PROVIDER", "hash")
    monkeypatch.setenv("ARAG_TOPICS__K", "2")
    out = tmp_path / "bench.json"
    args = ["bench", "build", "--papers", "3", "--data-dir", str(tmp_path / "lib"), "--json", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["papers"] == 3 and r["noop_papers_added"] == 0
    assert r["chunks"] == r["build"]["chunks_added"] > 0 and r["index_bytes"] > 0
    assert r["build_seconds"] > r["noop_build_seconds"] > 0


def test_bench_build_against_the_weights_model_in_the_same_run(
    monkeypatch: pytest.MonkeyPatch, qasper_path: Path, tmp_path: Path
) -> None:
    # The default embedder (dynamic int8 MiniLM) on 2 papers, then the same papers with the packaged
    # weights model: both builds timed, the ratio reported, and each model's library its own.
    monkeypatch.setenv("ARAG_TOPICS__K", "2")
    out = tmp_path / "bench.json"
    args = ["bench", "build", "--papers", "2", "--embed-sample", "40", "--baseline-build", "--json", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["build"]["chunks_added"] > 0 and r["baseline_build_seconds"] > 0
    assert r["baseline_model"] == "all-MiniLM-L6-v2-onnx-int8"
    assert r["build_speedup"] == pytest.approx(r["baseline_build_seconds"] / r["build_seconds"])
    assert r["embedding"]["baseline"] == "all-MiniLM-L6-v2-onnx-int8" and r["embedding"]["texts"] == 40
    assert "same papers, baseline model" in res.output


@pytest.mark.parametrize(
    "args",
    [
        ["search", "caf\udce9 parsing", "--no-rerank"],
        ["ask", "what is caf\udce9?", "--llm", "extractive"],
        ["chat", "hello \udcff", "--session", "s1"],
        ["search", "parsing", "--paper", "1601.\udce901705"],
    ],
)
def test_text_that_is_not_utf8_exits_8(args: list[str]) -> None:
    """Bytes of another encoding on the command line reach Python as lone surrogates."""
    res = runner.invoke(app, args)
    assert res.exit_code == 8, res.output
    assert "not UTF-8 text" in res.output and "LANG=C.UTF-8" in res.output
    assert "Traceback" not in res.output


def test_latin1_argv_in_a_real_process_exits_8(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    # Refused before anything opens: without the check the question reached the embedder's cache key.
    env = dict(os.environ, ARAG_EMBEDDING__PROVIDER="hash", ARAG_RERANK__PROVIDER="none", LC_ALL="C.UTF-8")
    res = subprocess.run(
        [sys.executable, "-m", "arag", "search", b"caf\xe9 parsing"], env=env, capture_output=True, text=True
    )
    assert res.returncode == 8, res.stderr
    assert "not UTF-8 text" in res.stderr and "Traceback" not in res.stderr


def test_the_embedder_refuses_text_it_cannot_encode() -> None:
    from arag.errors import InputError
    from arag.models.embedder import cache_key

    assert len(cache_key("m", "café")) == 64
    with pytest.raises(InputError, match="not valid Unicode"):
        cache_key("m", "caf\udce9")
