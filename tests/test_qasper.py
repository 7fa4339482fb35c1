from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from arag.corpus.qasper import abstract_text, iter_qasper, load_qasper, paper_from_record, year_month
from arag.errors import CorpusError
from arag.text import section_as_text, section_path


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


@pytest.mark.parametrize(
    ("heading", "shown"),
    [
        # S2ORC's marks around a formula or a stand-in; a formula of one symbol or name as that.
        (
            "Submitted Systems ::: English@!START@$\\leftrightarrow $@!END@German ::: Dataset",
            "Submitted Systems ::: English↔German ::: Dataset",
        ),
        ("Experiments ::: Baselines ::: HSSC @!START@BIBREF6@!END@.", "Experiments ::: Baselines ::: HSSC."),
        ("Words ::: @!START@$k$@!END@-mers (@!START@$n$@!END@-grams)", "Words ::: k-mers (n-grams)"),
        ("Datasets ::: @!START@$VQG_{COCO}$@!END@", "Datasets ::: $VQG_{COCO}$"),
        # A formula given twice, rendered and as TeX; TeX that is not the symbol before it stays.
        ("German→\\rightarrow English", "German→English"),
        ("The Influence of λ\\lambda ", "The Influence of λ"),
        ("Results on Chinese⇒\\Rightarrow English Task", "Results on Chinese⇒English Task"),
        ("Bound x\\rightarrow y", "Bound x\\rightarrow y"),
        # A footnote glued on; empty parts of the path.
        ("ExperimentsThe code for this paper is available at https://github.com/x/y", "Experiments"),
        ("A Live System Demonstrationhttp://dmkdt3.cs.vt.edu/leafNATS", "A Live System Demonstration"),
        ("Model details :::  ::: Hyperparameters.", "Model details ::: Hyperparameters."),
        ("Introduction ::: ", "Introduction"),
        (":::  ::: ", ""),
        # A heading without any of it only loses its extra spaces.
        ("Related Work ::: Pre-trained  Language Model", "Related Work ::: Pre-trained Language Model"),
        ("The Evaluation: Hits@k and IDAT@FIRE2019", "The Evaluation: Hits@k and IDAT@FIRE2019"),
    ],
)
def test_a_section_heading_is_read_as_text(heading: str, shown: str) -> None:
    assert section_as_text(heading) == shown


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        (
            "Submitted Systems ::: Chinese→English ::: Dataset",
            "Submitted Systems › Chinese→English › Dataset",
        ),
        ("Experiments :::  ::: Results", "Experiments › Results"),
        ("Results", "Results"),
        ("Ratio 3:1 ::: A", "Ratio 3:1 › A"),
    ],
)
def test_a_heading_path_is_shown_with_arrows(stored: str, shown: str) -> None:
    assert section_path(stored) == shown


def test_the_corpus_section_headings_hold_no_marks(qasper_path: Path) -> None:
    papers = [p for p in iter_qasper(qasper_path) if not isinstance(p, CorpusError)]
    names = {(p.id, s.name) for p in papers for s in p.sections}
    assert not [n for n in names if "@!" in n[1] or not all(part.strip() for part in n[1].split(":::"))]
    assert ("1911.06191", "Submitted Systems ::: Chinese→English ::: Dataset") in names
    assert ("1909.00015", "Adaptively Sparse Transformers with α-entmax ::: Different α per head.") in names
    assert ("1606.02891", "English↔German") in names and ("1503.00841", "The Influence of λ") in names
    # The glued footnotes: a URL and a note on when the section was written.
    assert ("1807.05154", "Experiments") in names and ("1610.00479", "Related work") in names
    assert not [n for n in names if "http" in n[1] or "written in September" in n[1]]


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
