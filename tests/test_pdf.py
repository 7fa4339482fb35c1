"""PDF ingestion: a synthetic two-column paper with exact expectations, the three shared real
PDFs, and broken files (corrupt, empty, image-only) that must be reported, not raised."""

from __future__ import annotations

import hashlib
import logging
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pymupdf
import pytest

from arag.corpus.pdf import IngestFailure, paper_from_pdf, paper_id_for, papers_from_paths
from arag.errors import IngestError
from arag.records import Paper
from arag.settings import PdfSettings
from arag.stress.bombs import inflation_bomb, page_bomb

# --------------------------------------------------------------------------- synthetic PDFs

_LEFT, _RIGHT = 54.0, 318.0  # the two columns' left edges on a 612 pt wide page


def _text(page: pymupdf.Page, x: float, y: float, s: str, size: float = 10.0, font: str = "helv") -> None:
    page.insert_text((x, y), s, fontsize=size, fontname=font)


def _lines(page: pymupdf.Page, x: float, y: float, rows: list[str], indent: bool = True) -> None:
    for i, row in enumerate(rows):
        _text(page, x + (10 if indent and i == 0 else 0), y + 12 * i, row)


def _synthetic_paper(path: Path) -> Path:
    """Four two-column pages: title, abstract, a paragraph running across the column break with
    hyphenation, a footnote, running headers, page numbers, a table, then references and an appendix."""
    doc = pymupdf.open()
    for _ in range(4):
        doc.new_page(width=612, height=792)
    pages = [doc[i] for i in range(4)]
    for n, page in enumerate(pages, start=1):
        _text(page, 302, 760, str(n))
        if n > 1:
            _text(page, 230, 40, "Synthetic Columns: A Test Paper", 9)
    p1, p2, p3, p4 = pages
    _text(p1, 150, 90, "Synthetic Columns: A Test Paper", 18, "hebo")
    _text(p1, 270, 115, "Ada Lovelace", 11)
    _text(p1, _LEFT, 160, "Abstract", 12, "hebo")
    abstract = [
        "We describe a synthetic paper that checks how",
        "a parser orders two columns, removes running",
        "headers and footnotes, and finds its tables.",
    ]
    _lines(p1, _LEFT, 180, abstract, indent=False)
    _text(p1, _LEFT, 240, "1   Introduction", 12, "hebo")
    intro = [
        "Parsing papers is an old problem with many",
        "facets: reading order, headings and tables all",
        "matter. A machine-readable text is the gold",
        "standard for retrieval, and it needs machine-",
    ]
    _lines(p1, _LEFT, 260, intro)
    _text(p1, _LEFT, 700, "1 This footnote should not appear in the body.", 7)
    right = ["readable columns in the right order. This sen-", "tence ends the first paragraph of the paper."]
    _lines(p1, _RIGHT, 160, right, indent=False)
    second = [
        "A second paragraph starts with an indent and",
        "mentions the references of prior work without",
        "being a heading at all.",
    ]
    _lines(p1, _RIGHT, 184, second)
    _text(p2, _LEFT, 120, "2   Method", 12, "hebo")
    _lines(
        p2,
        _LEFT,
        140,
        ["We measure the parser on a small table of", "scores, shown below, and on the text around it."],
    )
    for i, (model, score) in enumerate([("Model", "Score"), ("Alpha", "0.91"), ("Beta", "0.85")]):
        _text(p2, _LEFT + 20, 190 + 12 * i, model, 9)
        _text(p2, _LEFT + 150, 190 + 12 * i, score, 9)
    _text(p2, _LEFT, 240, "Table 1: Scores of the two synthetic models.", 9)
    _lines(
        p2,
        _LEFT,
        265,
        ["The table above lists two models and their", "scores on the synthetic benchmark of columns."],
    )
    _text(p2, _RIGHT, 120, "2.1   Details", 11, "hebo")
    _lines(
        p2,
        _RIGHT,
        140,
        ["Every detail of the method is kept simple so", "that the expected output can be written down."],
    )
    _text(p3, _LEFT, 120, "3   Conclusion", 12, "hebo")
    _lines(
        p3,
        _LEFT,
        140,
        ["Columns, headers and tables can be handled", "with a few careful layout rules in the parser."],
    )
    _text(p3, _RIGHT, 120, "References", 12, "hebo")
    refs = ["A. Author. 2020. A paper. In Proceedings of", "the Synthetic Conference, pages 1-9."]
    _lines(p3, _RIGHT, 140, refs, indent=False)
    more = ["B. Author. 2021. Another paper. In Proceedings", "of the Second Synthetic Conference."]
    _lines(p4, _LEFT, 120, more, indent=False)
    _text(p4, _RIGHT, 120, "A   Appendix", 12, "hebo")
    _lines(
        p4,
        _RIGHT,
        140,
        ["This appendix text comes after the references", "and is dropped together with them."],
    )
    doc.set_metadata({"author": "Ada Lovelace; Charles Babbage", "creationDate": "D:20210304120000Z"})
    doc.save(path)
    return path


def _plain_pdf(path: Path, title: str | None) -> Path:
    """One page of same-size text (no visual title), optionally with a metadata title."""
    doc = pymupdf.open()
    page = doc.new_page()
    for i in range(6):
        _text(page, 72, 100 + 14 * i, f"Line {i} of a plain document without any large title text.")
    if title:
        doc.set_metadata({"title": title})
    doc.save(path)
    return path


def _headingless_pdf(path: Path) -> Path:
    """One column, no headings: an author line, then paragraphs."""
    doc = pymupdf.open()
    page = doc.new_page()
    _text(page, 72, 80, "Ada Lovelace, Analytical Engine Society, London")
    _lines(page, 72, 110, _NOTE[0])
    _lines(page, 72, 190, _NOTE[1])
    doc.save(path)
    return path


_NOTE = [
    [
        "This note has no section headings at all, so its first substantial paragraph",
        "stands in for the abstract. It has several sentences and more than forty words,",
        "which is what separates it from an author line or an affiliation. The rest of",
        "the note becomes a single section called Body.",
    ],
    ["A second paragraph follows with an indented first line. It is the body.", "Nothing else is here."],
]


def _image_only_pdf(path: Path) -> Path:
    doc = pymupdf.open()
    page = doc.new_page()
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 64, 64), False)
    pix.set_rect(pix.irect, (200, 30, 30))
    page.insert_image(pymupdf.Rect(72, 72, 500, 500), pixmap=pix)
    doc.save(path)
    return path


def _body(paper: Paper) -> str:
    return "\n".join(p for s in paper.sections for p in s.paragraphs)


# --------------------------------------------------------------------------- synthetic: exact results


def test_synthetic_two_column_paper(tmp_path: Path) -> None:
    paper = paper_from_pdf(_synthetic_paper(tmp_path / "Synthetic Paper.pdf"))
    assert paper.title == "Synthetic Columns: A Test Paper"
    assert paper.abstract == (
        "We describe a synthetic paper that checks how a parser orders two columns, removes running "
        "headers and footnotes, and finds its tables."
    )
    assert [(s.name, s.paragraphs) for s in paper.sections] == [
        (
            "Introduction",
            [
                # left column first, across the column break; "machine-" + "readable" keeps its hyphen
                # (the document spells it so elsewhere), "sen-" + "tence" loses it.
                "Parsing papers is an old problem with many facets: reading order, headings and tables all "
                "matter. A machine-readable text is the gold standard for retrieval, and it needs "
                "machine-readable columns in the right order. This sentence ends the first paragraph of "
                "the paper.",
                # "references" inside a sentence does not cut the paper
                "A second paragraph starts with an indent and mentions the references of prior work "
                "without being a heading at all.",
            ],
        ),
        (
            "Method",
            [
                "We measure the parser on a small table of scores, shown below, and on the text around it.",
                "The table above lists two models and their scores on the synthetic benchmark of columns.",
            ],
        ),
        (
            "Details",
            ["Every detail of the method is kept simple so that the expected output can be written down."],
        ),
        (
            "Conclusion",
            ["Columns, headers and tables can be handled with a few careful layout rules in the parser."],
        ),
    ]
    assert [t.model_dump() for t in paper.tables] == [
        {
            "caption": "Table 1: Scores of the two synthetic models.",
            "text": "Model | Score\nAlpha | 0.91\nBeta | 0.85",
            "page": 2,
            "section": "Method",
        }
    ]
    body = _body(paper)
    for gone in ("footnote", "In Proceedings", "appendix", "Alpha", "Synthetic Columns"):
        assert gone not in body  # footnote, references, appendix, table cells, running header
    assert not re.search(r"(^|\n)\d+(\n|$)", body)  # page numbers
    assert paper.authors == ["Ada Lovelace", "Charles Babbage"]
    assert paper.year == 2021
    assert paper.source == "pdf" and paper.source_path == str(tmp_path / "Synthetic Paper.pdf")


def test_paper_id_is_slug_plus_content_hash(tmp_path: Path) -> None:
    assert paper_id_for(Path("My Paper (v2).pdf"), b"abc") == "pdf:my-paper-v2-ba7816bf"
    path = _synthetic_paper(tmp_path / "a.pdf")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
    assert paper_from_pdf(path).id == f"pdf:a-{digest}" == paper_from_pdf(path).id
    other = _plain_pdf(tmp_path / "b.pdf", None)
    assert paper_from_pdf(other).id != paper_from_pdf(path).id


def test_title_falls_back_to_metadata_then_file_stem(tmp_path: Path) -> None:
    assert paper_from_pdf(_plain_pdf(tmp_path / "plain.pdf", "Metadata Title")).title == "Metadata Title"
    assert paper_from_pdf(_plain_pdf(tmp_path / "no-title.pdf", None)).title == "no-title"


def test_document_without_headings_is_one_body_section(tmp_path: Path) -> None:
    paper = paper_from_pdf(_headingless_pdf(tmp_path / "note.pdf"))
    assert paper.abstract == " ".join(_NOTE[0])
    assert [(s.name, s.paragraphs) for s in paper.sections] == [("Body", [" ".join(_NOTE[1])])]


# --------------------------------------------------------------------------- broken files


@pytest.fixture()
def mixed_dir(tmp_path: Path) -> Path:
    (tmp_path / "x.pdf").write_bytes(random.Random(7).randbytes(4096))
    (tmp_path / "empty.pdf").write_bytes(b"")
    good = _synthetic_paper(tmp_path / "good.pdf").read_bytes()
    (tmp_path / "cut.pdf").write_bytes(good[: len(good) * 2 // 3])  # a download cut short
    _image_only_pdf(tmp_path / "scan.pdf")
    (tmp_path / "sub").mkdir()
    _synthetic_paper(tmp_path / "sub" / "nested.PDF")
    (tmp_path / "notes.txt").write_text("not a pdf")
    return tmp_path


def test_bad_files_are_reported_while_good_ones_ingest(
    mixed_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = mixed_dir / "missing.pdf"
    with caplog.at_level(logging.WARNING, logger="arag.corpus.pdf"):
        papers, failures = papers_from_paths([mixed_dir, mixed_dir / "good.pdf", missing])
    # sorted, recursive, *.pdf in any case, each file once
    assert [Path(p.source_path or "").name for p in papers] == ["good.pdf", "nested.PDF"]
    assert all(p.title == "Synthetic Columns: A Test Paper" for p in papers)
    reasons = {Path(f.path).name: f.reason for f in failures}
    assert set(reasons) == {"cut.pdf", "empty.pdf", "scan.pdf", "x.pdf", "missing.pdf"}
    assert "truncated" in reasons["cut.pdf"]
    assert "empty (0 bytes)" in reasons["empty.pdf"]
    assert "no extractable text" in reasons["scan.pdf"] and "scanned/image-only" in reasons["scan.pdf"]
    assert "not a PDF" in reasons["x.pdf"]
    assert "no such file" in reasons["missing.pdf"]
    assert all(isinstance(f, IngestFailure) and "fix:" in f.reason for f in failures)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 5 and all("skipping" in w for w in warned)


@pytest.mark.parametrize(
    ("name", "what"), [("x.pdf", "not a PDF"), ("empty.pdf", "empty"), ("cut.pdf", "truncated")]
)
def test_paper_from_pdf_raises_ingest_error(mixed_dir: Path, name: str, what: str) -> None:
    with pytest.raises(IngestError) as err:
        paper_from_pdf(mixed_dir / name)
    assert what in err.value.what
    assert err.value.where == str(mixed_dir / name) and err.value.fix


def test_image_only_pdf_is_refused_as_a_scan(mixed_dir: Path) -> None:
    with pytest.raises(IngestError, match="scanned/image-only") as err:
        paper_from_pdf(mixed_dir / "scan.pdf")
    assert "OCR" in (err.value.fix or "")


# --------------------------------------------------------------------------- the three shared PDFs


@dataclass(frozen=True)
class Expected:
    title: list[str]  # words the detected title must contain
    abstract: str  # how the abstract starts
    intro: str  # how the Introduction's first paragraph starts
    intro_order: list[str]  # paragraph openings that must appear in this order
    year: int
    table_row: str  # a row of one captioned table
    table_only: str  # text found only inside a table, never in the body


REAL = {
    "papermage_2020.acl-main.447.pdf": Expected(
        title=["S2ORC", "Semantic Scholar Open Research Corpus"],
        abstract="We introduce S2ORC",
        intro="Academic papers are an increasingly important textual domain",
        # the first column's paragraphs, then the second column's first
        intro_order=[
            "Academic papers are",
            "Different types of resources",
            "Yet, existing corpora",
            "In this paper",
        ],
        year=2020,
        table_row="Papers w/ PDF | 28.9M (35.6%)",
        table_only="28.9M (35.6%)",
    ),
    "papermage_2023.eacl-main.121.pdf": Expected(
        title=["Guidelines for Human Evaluation of Faithfulness", "Long-form Summarization"],
        abstract="While human evaluation remains best practice",
        # runs from the bottom of the left column ("sum-") to the top of the right one ("maries")
        intro="Human judgments are considered the gold standard for evaluating model-generated summaries "
        "(Kryscinski et al., 2019",
        intro_order=["Human judgments", "To better understand", "To move towards"],
        year=2023,
        table_row="SuperPAL (2021) | 0.61 | 0.68 | 0.77",
        table_only="MultiVers-FEVER",
    ),
    "papermage_2203.00130v1.pdf": Expected(
        title=["Paper Plain", "Medical Research Papers Approachable to Healthcare Consumers"],
        abstract="When seeking information not covered in patient-friendly documents",
        intro="A strong public health system depends on the timely dissemination of medical findings",
        intro_order=["A strong public health", "However, it is one thing", "In this paper, we ask"],
        year=2022,
        table_row="Relevance (1–5) | -0.193 | 0.9133",
        table_only="0.9133",
    ),
}


@pytest.fixture(scope="module")
def real_papers(shared_dir: Path) -> dict[str, tuple[Paper, float, str]]:
    """Each shared PDF parsed once: the paper, the seconds it took, and PyMuPDF's raw text."""
    out = {}
    for name in REAL:
        path = shared_dir / "pdfs" / name
        if not path.is_file():
            pytest.skip(f"{path} is missing")
        start = time.perf_counter()
        paper = paper_from_pdf(path)
        seconds = time.perf_counter() - start
        with pymupdf.open(path) as doc:
            raw = re.sub(r"\s+", " ", " ".join(page.get_text() for page in doc))
        out[name] = (paper, seconds, raw)
    return out


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_pdf_front_matter(real_papers: dict[str, tuple[Paper, float, str]], name: str) -> None:
    paper, seconds, _ = real_papers[name]
    want = REAL[name]
    assert all(word in paper.title for word in want.title), paper.title
    assert paper.abstract.startswith(want.abstract), paper.abstract[:200]
    assert 400 < len(paper.abstract) < 2500
    assert paper.year == want.year
    assert paper.id.startswith("pdf:papermage-") and paper.source == "pdf"
    assert seconds < 20, f"parsing {name} took {seconds:.1f} s"


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_pdf_reading_order(real_papers: dict[str, tuple[Paper, float, str]], name: str) -> None:
    paper, _, _ = real_papers[name]
    want = REAL[name]
    intro = next(s for s in paper.sections if s.name == "Introduction")
    assert intro.paragraphs[0].startswith(want.intro), intro.paragraphs[0][:200]
    text = "\n".join(intro.paragraphs)
    positions = [text.find(start) for start in want.intro_order]
    assert -1 not in positions and positions == sorted(positions), positions
    assert paper.title not in _body(paper)  # title and running headers are not body text


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_pdf_references_are_cut(real_papers: dict[str, tuple[Paper, float, str]], name: str) -> None:
    paper, _, raw = real_papers[name]
    names = [s.name for s in paper.sections]
    assert "Conclusion" in names  # not cut too early
    cut = r"(references|bibliography|acknowledge?ments?|appendix)\b"
    assert not [n for n in names if re.match(cut, n, re.IGNORECASE)], names
    body = _body(paper)
    # the raw text has reference-list entries; the body has none
    assert raw.count("In Proceedings") >= 3 and body.count("In Proceedings") == 0
    assert body.count("arXiv preprint arXiv:") == 0
    entries = sum(1 for s in paper.sections for p in s.paragraphs if re.match(r"\[\d+\] [A-Z]", p))
    assert entries == 0


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_pdf_tables(real_papers: dict[str, tuple[Paper, float, str]], name: str) -> None:
    paper, _, _ = real_papers[name]
    want = REAL[name]
    captioned = [t for t in paper.tables if (t.caption or "").startswith("Table")]
    assert captioned, [t.caption for t in paper.tables]
    assert any(want.table_row in t.text for t in captioned)
    assert all(t.page and t.text.count(" | ") >= 2 for t in paper.tables)
    assert want.table_only not in _body(paper)  # the table's region is not body text


# --------------------------------------------------------------------------- limits (PDF bombs)


def test_a_pdf_over_the_page_cap_is_refused_naming_the_setting(tmp_path: Path) -> None:
    page_bomb(tmp_path / "a-many.pdf", 40)
    good = _synthetic_paper(tmp_path / "b-good.pdf")
    papers, failures = papers_from_paths([tmp_path], PdfSettings(max_pages=30))
    assert [Path(p.source_path or "").name for p in papers] == [good.name]  # the batch goes on
    (failure,) = failures
    assert "has 40 pages (at most 30)" in failure.reason and "ARAG_PDF__MAX_PAGES" in failure.reason


def test_a_parse_over_its_memory_or_time_is_stopped_in_the_child(tmp_path: Path) -> None:
    """Parsing runs in a child process: a file that inflates past the memory limit, or parses past
    the time limit, fails there with the limit and its setting; the caller and the next file are
    unharmed."""
    bomb = inflation_bomb(tmp_path / "a-bomb.pdf", 5)
    good = _synthetic_paper(tmp_path / "b-good.pdf")
    assert bomb.stat().st_size < 40_000
    papers, failures = papers_from_paths([tmp_path], PdfSettings(parse_memory_mb=64))
    assert [Path(p.source_path or "").name for p in papers] == [good.name]
    (failure,) = failures
    assert "needs more than 64 MB of memory" in failure.reason, failure.reason
    assert "ARAG_PDF__PARSE_MEMORY_MB" in failure.reason
    papers, failures = papers_from_paths([tmp_path], PdfSettings(parse_timeout_s=0.5))
    assert [Path(p.source_path or "").name for p in papers] == [good.name]  # a fresh child
    (failure,) = failures
    assert "took longer than 0.5 s" in failure.reason and "ARAG_PDF__PARSE_TIMEOUT_S" in failure.reason


def test_papers_from_paths_reads_its_limits_from_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`arag library add` and POST /ingest call it without limits: the settings' pdf group applies."""
    monkeypatch.setenv("ARAG_PDF__MAX_PAGES", "5")
    _, failures = papers_from_paths([page_bomb(tmp_path / "many.pdf", 6)])
    assert "has 6 pages (at most 5)" in failures[0].reason
