"""``arag train answers`` end to end on a few papers: examples, train, export, check, install, load,
read; and the answer specialists in the agent with that reader.

A 1-layer reader trained for a few steps: its numbers mean nothing; the plumbing (files, card,
checksum, reproducibility, spans copied from the passage, the graph's specialists step, the CLI) is
what is checked."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arag.agent import build_agent
from arag.cli.main import app
from arag.errors import ModelError
from arag.library.manage import build_library, open_retrieval
from arag.models.onnx_files import file_sha256
from arag.models.reader import CARD_FILE, CLASSES, MODEL_FILE, OnnxReader, ReaderCard, get_reader
from arag.settings import Settings, get_settings
from arag.train.reader import ReaderConfig
from arag.train.reader_pipeline import train_answers

pytestmark = pytest.mark.real_models

# 1909.00694 and 2003.07723 are held-out papers (one in ten): their questions measure the reader.
PAPERS = ["1909.00694", "2003.07723", "1705.09665", "1908.06606", "1811.00942", "1805.02400"]
CFG = ReaderConfig(layers=1, max_length=128, epochs=1.0, batch=8, threads=1)
SPAN_QUESTION = (
    "In the paper 'Minimally Supervised Learning of Affective Events Using Discourse Relations': "
    "How big is the Japanese data?"
)


@pytest.fixture(scope="module")
def questions(tmp_path_factory: pytest.TempPathFactory, shared_dir: Path) -> Path:
    src = shared_dir / "benchmarks" / "qasper" / "questions_train.json"
    items = [q for q in json.loads(src.read_text()) if q["paper_id"] in PAPERS]
    path = tmp_path_factory.mktemp("questions") / "questions_train.json"
    path.write_text(json.dumps(items))
    return path


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory, qasper_path: Path) -> Settings:
    s = get_settings(
        data_dir=tmp_path_factory.mktemp("reader-lib"),
        corpus={"paper_ids": PAPERS},
        embedding={"provider": "hash"},
        rerank={"provider": "none"},
        llm={"provider": "extractive"},
        topics={"k": 2},
    )
    build_library(s)
    return s


@pytest.fixture(scope="module")
def trained(lib: Settings, questions: Path, qasper_path: Path) -> ReaderCard:
    return train_answers(lib, CFG, questions_path=questions, corpus_path=qasper_path, limit=24)


def test_the_reader_and_its_card_are_installed(lib: Settings, trained: ReaderCard) -> None:
    folder = lib.reader_dir
    assert (folder / MODEL_FILE).is_file() and (folder / CARD_FILE).is_file()
    assert file_sha256(folder / MODEL_FILE) == trained.onnx_sha256
    assert trained.layers == 1 and trained.data["train_questions"] == 24
    assert trained.data["held_out_questions"] >= 1
    held = trained.held_out[trained.held_out["chosen"]]
    assert held["pairs"] > 0 and 0.0 <= held["class_accuracy"] <= 1.0
    assert trained.thresholds == {}  # fit later, on the agent's answers (--calibrate)


def test_readings_are_probabilities_and_spans_copied_from_the_passage(
    lib: Settings, trained: ReaderCard
) -> None:
    reader = get_reader(lib)
    assert isinstance(reader, OnnxReader)
    passages = [
        "We collected 100 million sentences of Japanese web text as the raw corpus.",
        "The seed lexicon consists of 15 positive words and 15 negative words.",
        "",
    ]
    readings = reader.read("How big is the Japanese data?", passages)
    assert len(readings) == 3
    for r, p in zip(readings, passages, strict=True):
        assert len(r.probs) == len(CLASSES) and math.isclose(sum(r.probs), 1.0, abs_tol=1e-5)
        assert p[r.start : r.end] == r.span
        assert 0.0 <= r.span_prob <= 1.0
    assert reader.read("q", []) == []


def test_a_tampered_reader_is_refused(lib: Settings, trained: ReaderCard, tmp_path: Path) -> None:
    copy = tmp_path / "reader"
    shutil.copytree(lib.reader_dir, copy)
    with (copy / MODEL_FILE).open("ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ModelError, match="does not match the sha256"):
        OnnxReader(copy)
    with pytest.raises(ModelError, match="arag train answers"):
        OnnxReader(tmp_path / "nothing")


def test_training_again_gives_the_same_reader(
    lib: Settings, trained: ReaderCard, questions: Path, qasper_path: Path, tmp_path: Path
) -> None:
    again = get_settings(data_dir=tmp_path, corpus={"paper_ids": PAPERS})
    card = train_answers(again, CFG, questions_path=questions, corpus_path=qasper_path, limit=24)
    assert card.onnx_sha256 == trained.onnx_sha256


def test_the_specialists_replace_a_span_answer_with_the_readers_span(
    lib: Settings, trained: ReaderCard
) -> None:
    reader = get_reader(lib)
    assert reader is not None
    # Every rule on at its loosest: a span question's short answer is the reader's span.
    reader.thresholds = {"span": 0.0, "yes_no": 0.0, "answer": 0.0, "abstain": -math.inf}
    retrieval = open_retrieval(lib)
    try:
        agent = build_agent(lib, retrieval.reranking(), None, reader=reader)
        a = agent.run(SPAN_QUESTION)
    finally:
        retrieval.close()
    assert a.answer_type == "span"
    step = next(e for e in a.events if e.node == "specialists")
    assert step.decision.startswith(("span:", "answered from the reader", "kept"))
    if not a.abstained:
        assert any(a.short_answer in c.text for c in a.chunks), a.short_answer


def test_without_a_fit_reader_the_answer_ends_at_the_verifier(lib: Settings, trained: ReaderCard) -> None:
    off = lib.model_copy(update={"reader": lib.reader.model_copy(update={"provider": "none"})})
    assert get_reader(off) is None
    unfit = get_reader(lib)  # installed, thresholds never fit: it would change nothing, so it is not run
    assert unfit is not None and unfit.thresholds == {}
    retrieval = open_retrieval(lib)
    try:
        for settings, reader in ((off, None), (lib, unfit)):
            a = build_agent(settings, retrieval.reranking(), None, reader=reader).run(SPAN_QUESTION)
            assert [e.node for e in a.events][-1] == "verifier"
    finally:
        retrieval.close()


def test_train_answers_cli_installs_then_declines_to_retrain(
    questions: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARAG_DATA_DIR", str(tmp_path))
    args = ["train", "answers", "--questions", str(questions), "--limit", "8", "--layers", "1"]
    args += ["--max-length", "96", "--epochs", "0.5", "--threads", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert (
        "held-out QASPER train papers" in r.output and (tmp_path / "models" / "reader" / CARD_FILE).is_file()
    )
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and "--force retrains it" in r.output
