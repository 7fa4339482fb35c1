from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from arag.corpus.qasper import abstract_text, iter_qasper, load_qasper, paper_from_record, year_month
from arag.errors import CorpusError


@pytest.mark.parametrize(
    ("arxiv_id", "expected"),
    [
        ("1912.01214", (2019, 12)),
        ("1601.00901", (2016, 1)),
        ("2004.04906v3", (2020, 4)),
        ("2101.12345", (2021, 1)),
        ("1913.00001", (None, None)),  # no 13th month
        ("hep-th/9901001", (None, None)),
        ("pdf:paper-1234abcd", (None, None)),
    ],
)
def test_year_month_from_arxiv_id(arxiv_id: str, expected: tuple[int | None, int | None]) -> None:
    assert year_month(arxiv_id) == expected


def test_an_abstracts_paragraphs_and_a_titles_latex_are_read_as_text() -> None:
    # S2ORC's " ::: " between an abstract's paragraphs, and a structured abstract's headings.
    assert abstract_text("like clustering.  ::: In this publication, we  ") == (
        "like clustering. In this publication, we"
    )
    assert abstract_text("BACKGROUND ::: We built it. :::  :::  ::: RESULTS ::: It works. :::") == (
        "Background: We built it. Results: It works."
    )
    assert abstract_text("No paragraphs here: a colon stays.") == "No paragraphs here: a colon stays."
    rec = {
        "id": "2003.10564",
        "title": r"Improving Yor\`ub\'a Diacritic Restoration",
        "abstract": "First. ::: Second.",
        "sections": [{"section": "Intro", "paragraphs": ["Text."]}],
    }
    paper = paper_from_record(rec)
    assert (paper.title, paper.abstract) == ("Improving Yorùbá Diacritic Restoration", "First. Second.")


def test_the_corpus_titles_and_abstracts_hold_no_markup(qasper_path: Path) -> None:
    # Every paper of the default library, as read: no LaTeX left in a title, no " ::: " in an abstract.
    papers = [p for p in iter_qasper(qasper_path) if not isinstance(p, CorpusError)]
    assert len(papers) == 1585
    assert not [p.title for p in papers if "\\" in p.title or "{" in p.title or "$" in p.title]
    assert not [p.id for p in papers if ":::" in p.abstract]
    titles = {p.id: p.title for p in papers}
    assert titles["1804.00982"] == "360° Stance Detection"
    assert titles["1803.07771"].startswith("ρ-hot Lexicon Embedding")
    assert titles["2001.11381"] == "Generación automática de frases literarias en español"


def test_loads_real_papers_with_sections(qasper_path: Path) -> None:
    papers, failures = load_qasper(qasper_path, max_papers=5)
    assert failures == []
    assert [p.id for p in papers][:2] == ["1601.00901", "1601.01705"]
    first = papers[0]
    assert first.title == "Joint learning of ontology and semantic parser from text"
    assert first.year == 2016 and first.month == 1
    assert first.source == "qasper"
    assert first.sections[0].name == "Introduction"
    assert all(s.paragraphs for p in papers for s in p.sections)
    assert first.content_hash() == papers[0].content_hash()
    assert len({p.content_hash() for p in papers}) == 5


def test_select_by_ids(qasper_path: Path) -> None:
    papers, _ = load_qasper(qasper_path, paper_ids=["1601.01705", "1601.00901"])
    assert sorted(p.id for p in papers) == ["1601.00901", "1601.01705"]


def test_bad_lines_are_reported_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "papers.jsonl.gz"
    good = {
        "id": "1801.00001",
        "title": "A",
        "abstract": "x",
        "sections": [{"section": "S", "paragraphs": ["p"]}],
    }
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(good) + "\n")
        fh.write("{not json\n")
        fh.write(json.dumps({"id": "1801.00002", "abstract": "no title"}) + "\n")
    items = list(iter_qasper(path))
    assert [type(i).__name__ for i in items] == ["Paper", "CorpusError", "CorpusError"]
    papers, failures = load_qasper(path)
    assert [p.id for p in papers] == ["1801.00001"]
    assert len(failures) == 2 and "papers.jsonl.gz:2" in str(failures[0])


def test_missing_file_says_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(CorpusError) as exc:
        load_qasper(tmp_path / "absent.jsonl.gz")
    msg = str(exc.value)
    assert "absent.jsonl.gz" in msg and "ARAG_CORPUS__QASPER_PATH" in msg and "fix:" in msg


def test_truncated_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "papers.jsonl.gz"
    raw = gzip.compress(b'{"id": "1801.00001", "title": "A"}\n' * 2000)
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CorpusError, match="corrupt or truncated"):
        load_qasper(path)
