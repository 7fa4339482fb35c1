"""Local PDFs -> ``Paper``: reading order, sections, abstract and tables with PyMuPDF.

Layout heuristics target born-digital research papers (one or two columns). Footnotes (small
type), running headers, page numbers, figure interiors and everything from the References /
Acknowledgments heading on are left out of the body text.
Reading pages, columns, block kinds and tables live in ``arag.corpus.pdf_layout``.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymupdf
from pydantic import BaseModel, ConfigDict

from arag.corpus.pdf_layout import (
    _CUT_HEADING,
    _NUMBERED,
    _Block,
    _classify,
    _clean,
    _extract_tables,
    _join,
    _join_rows,
    _Page,
    _read_page,
    _reading_order,
)
from arag.corpus.pdf_worker import PdfParser, serve_parses
from arag.errors import IngestError
from arag.records import Paper, Section, Table
from arag.settings import PdfSettings, get_settings
from arag.text import STOPWORDS

log = logging.getLogger(__name__)

MIN_TEXT_CHARS = 100
# Below this share of common English words (of the first 20 pages' words) a text is not prose: QASPER's
# papers have 0.30 to 0.49 but for one at 0.08 (mostly tables); random letters make about 0.005.
MIN_FUNCTION_WORD_SHARE = 0.04
_ABSTRACT_RUN_IN = re.compile(r"^abstract\s*[.:\u2014\u2013-]?\s*", re.IGNORECASE)
_TERMINAL = re.compile(r"[.!?:][\"'\u201d\u2019)\]]*$")
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


class IngestFailure(BaseModel):
    """One file that could not be ingested, and why."""

    model_config = ConfigDict(frozen=True)

    path: str
    reason: str


@dataclass
class _Para:
    kind: str  # text | heading | caption | table
    text: str
    block: _Block | None = None
    table: Table | None = None


# --------------------------------------------------------------------------- public API


def paper_from_pdf(path: Path, *, max_pages: int | None = None) -> Paper:
    """Parse one PDF into a ``Paper`` in this process; raises ``IngestError`` when the file cannot be
    used, or has more than ``max_pages`` pages. Files from users go through :func:`papers_from_paths`,
    which parses in a child process under limits."""
    path = Path(path)
    data = _read_bytes(path)
    # MuPDF opens images and other formats given a .pdf name; a PDF starts with %PDF- in its first KiB.
    if b"%PDF-" not in data[:1024]:
        raise IngestError(
            "not a PDF (no %PDF- signature at its start)",
            where=str(path),
            fix="check what the file is (`file PATH`); convert it to PDF or leave it out",
        )
    try:
        doc = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # PyMuPDF raises several types for damaged files
        raise IngestError(
            f"not a readable PDF: {exc}", where=str(path), fix="re-download or re-export the PDF"
        ) from exc
    with doc:
        if doc.needs_pass:
            raise IngestError("the PDF is password-protected", where=str(path), fix="remove the password")
        if doc.page_count == 0:
            raise IngestError("the PDF has no pages", where=str(path), fix="re-export the PDF")
        if max_pages is not None and doc.page_count > max_pages:
            raise IngestError(
                f"the PDF has {doc.page_count:,} pages (at most {max_pages:,})",
                where=str(path),
                fix="add the paper without its appendices or scans, or raise ARAG_PDF__MAX_PAGES",
            )
        if doc.is_repaired and b"%%EOF" not in data[-2048:]:
            # MuPDF salvages what it can of a cut-off file; half a paper is worse than none.
            raise IngestError(
                "the PDF is truncated (damaged, and its end-of-file marker is missing)",
                where=str(path),
                fix="download the file again; the copy is incomplete",
            )
        try:
            return _parse(doc, path, data)
        except IngestError:
            raise
        except Exception as exc:  # a damaged page or an unexpected layout must not stop a batch
            raise IngestError(
                f"could not parse the PDF ({type(exc).__name__}: {exc})",
                where=str(path),
                fix="check that the file opens in a PDF viewer; re-export it if it does not",
            ) from exc


def papers_from_paths(
    paths: Sequence[Path], limits: PdfSettings | None = None
) -> tuple[list[Paper], list[IngestFailure]]:
    """Ingest PDFs and folders of PDFs (recursive, sorted); bad files are logged and collected. Each
    file is parsed in a child process under ``limits`` (pages, memory, time; default: the settings'
    ``pdf`` group): ``arag library add`` and ``POST /ingest`` both come here."""
    limits = limits if limits is not None else get_settings().pdf
    papers: list[Paper] = []
    failures: list[IngestFailure] = []
    files = _expand(paths, failures)
    if not files:
        return papers, failures
    with PdfParser(limits) as parser:
        for file in files:
            try:
                papers.append(parser.parse(file))
            except IngestError as exc:
                failures.append(IngestFailure(path=str(file), reason=str(exc)))
                log.warning("skipping %s: %s", file, exc)
    return papers, failures


def _expand(paths: Iterable[Path], failures: list[IngestFailure]) -> list[Path]:
    seen: set[Path] = set()
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() == ".pdf")
        elif p.exists():
            found = [p]
        else:
            reason = f"no such file or folder: {p}\n  fix: check the path"
            failures.append(IngestFailure(path=str(p), reason=reason))
            log.warning("skipping %s: does not exist", p)
            continue
        for f in found:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                out.append(f)
    return out


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise IngestError(f"cannot read the file: {exc}", where=str(path), fix="check the path") from exc
    if not data:
        raise IngestError("the file is empty (0 bytes)", where=str(path), fix="re-download the PDF")
    return data


def paper_id_for(path: Path, data: bytes) -> str:
    """``pdf:<slug of stem>-<sha256[:8]>``: stable for the same file content and name."""
    slug = re.sub(r"[^a-z0-9]+", "-", path.stem.lower()).strip("-") or "paper"
    return f"pdf:{slug}-{hashlib.sha256(data).hexdigest()[:8]}"


# --------------------------------------------------------------------------- parsing


def _parse(doc: Any, path: Path, data: bytes) -> Paper:
    pages = [_read_page(page) for page in doc]
    n_chars = sum(len(b.text) for pg in pages for b in pg.blocks)
    if n_chars < MIN_TEXT_CHARS:
        raise IngestError(
            f"no extractable text ({n_chars} characters): looks like a scanned/image-only PDF",
            where=str(path),
            fix="run OCR on it first (e.g. ocrmypdf) and ingest the OCRed file",
        )
    _check_prose(pages, path)
    body = _body_size(pages)
    _drop_furniture(pages)
    title, title_blocks = _find_title(pages[0], doc.metadata or {}, path)
    for b in title_blocks:
        b.kind = "furniture"
    vocab = _vocabulary(pages)
    tables: list[tuple[_Block, Table]] = []
    flow: list[_Block] = []
    for pg in pages:
        _classify(pg, body)
    # Nothing after the reference list is kept: its pages need no table search.
    last = next(
        (pg.number for pg in pages for b in pg.blocks if b.kind == "heading" and _CUT_HEADING.match(b.text)),
        None,
    )
    for pg in pages:
        if last is None or pg.number <= last:
            tables += _extract_tables(doc[pg.number], pg, body, vocab)
        flow += _reading_order(pg)
    paras = _paragraphs(flow, pages, body, vocab, tables)
    paras = _cut_back_matter(paras)
    abstract, sections, placed = _structure(paras)
    meta = doc.metadata or {}
    return Paper(
        id=paper_id_for(path, data),
        title=title,
        abstract=abstract,
        sections=sections,
        tables=placed,
        authors=_authors(meta.get("author") or ""),
        year=_year(meta.get("creationDate") or ""),
        source="pdf",
        source_path=str(path),
    )


def _check_prose(pages: list[_Page], path: Path) -> None:
    """An IngestError for text that does not read as English prose (random characters, a dump of
    numbers): any paper's running text is a third or more common function words ('the', 'of', ...)."""
    words = re.findall(r"[A-Za-z]+", " ".join(b.text for pg in pages[:20] for b in pg.blocks))[:20_000]
    if len(words) < 50:
        return  # too little to judge: the length checks downstream decide
    share = sum(w.lower() in STOPWORDS for w in words) / len(words)
    if share < MIN_FUNCTION_WORD_SHARE:
        raise IngestError(
            f"the text does not read as prose ({share:.0%} common English words, a paper has 8% or more):"
            " noise, or not a paper in English",
            where=str(path),
            fix="leave the file out; if it is a paper, check that its text layer is not garbled",
        )


def _body_size(pages: list[_Page]) -> float:
    sizes = Counter[float]()
    for pg in pages:
        for b in pg.blocks:
            for ln in b.lines:
                sizes[ln.size] += len(ln.text)
    return sizes.most_common(1)[0][0]


def _furniture_key(text: str) -> str:
    return re.sub(r"\d+", "#", text.lower()).strip()


def _drop_furniture(pages: list[_Page]) -> None:
    """Drop page numbers and running headers/footers (text repeated in the margins of many pages)."""
    seen: Counter[str] = Counter()
    for pg in pages:
        keys = {_furniture_key(b.text) for b in pg.blocks if b.rows and _in_margin(b, pg)}
        seen.update(keys)
    threshold = max(3, int(0.3 * len(pages)))
    for pg in pages:
        for b in pg.blocks:
            lone_number = re.fullmatch(r"[\divxlc]{1,5}", b.text.strip(), re.IGNORECASE) is not None
            repeated = b.rows and _in_margin(b, pg) and seen[_furniture_key(b.text)] >= threshold
            if lone_number or repeated:
                b.kind = "furniture"


def _in_margin(b: _Block, pg: _Page) -> bool:
    return b.bbox[3] < 0.12 * pg.height or b.bbox[1] > 0.9 * pg.height


def _find_title(page: _Page, meta: dict[str, Any], path: Path) -> tuple[str, list[_Block]]:
    cands = [b for b in page.blocks if b.kind == "text" and b.bbox[1] < 0.45 * page.height]
    lines = [(ln, b) for b in cands for ln in b.lines if len(_WORD.findall(ln.text)) >= 1]
    if lines:
        top = max(ln.size for ln, _ in lines)
        picked = [(ln, b) for ln, b in lines if ln.size >= top - 0.5]
        text = _clean(" ".join(ln.text for ln, _ in sorted(picked, key=lambda p: (p[0].y0, p[0].x0))))
        if top > _median_size(page) + 1 and 3 <= len(text) <= 300:
            blocks = [b for b in cands if any(b is pb for _, pb in picked)]
            return text, blocks
    title = _clean(str(meta.get("title") or ""))
    if len(title) >= 3 and not re.search(r"\.(docx?|tex|pdf)$|^untitled", title, re.IGNORECASE):
        return title, []
    return path.stem, []


def _median_size(page: _Page) -> float:
    sizes = sorted(ln.size for b in page.blocks for ln in b.lines)
    return sizes[len(sizes) // 2] if sizes else 0.0


def _vocabulary(pages: list[_Page]) -> set[str]:
    """Words of the document, without the pieces of words hyphenated at a line end."""
    vocab: set[str] = set()
    for pg in pages:
        for b in pg.blocks:
            broken = False
            for r in b.rows:
                words = re.findall(r"[^\W\d_]+(?:-[^\W\d_]+)*-?", r.text)
                if broken and words:
                    words = words[1:]
                broken = bool(words) and words[-1].endswith("-")
                vocab.update(w.lower() for w in words if not w.endswith("-"))
    return vocab


# --------------------------------------------------------------------------- paragraphs and sections


def _paragraphs(
    flow: list[_Block], pages: list[_Page], body: float, vocab: set[str], tables: list[tuple[_Block, Table]]
) -> list[_Para]:
    """Blocks in reading order -> paragraphs; a paragraph may run across blocks, columns and pages."""
    by_anchor = {id(a): t for a, t in tables}
    paras: list[_Para] = []
    cur: _Para | None = None
    for b in flow:
        if b.kind == "tablecap":
            paras.append(_Para("table", "", b, by_anchor[id(b)]))
            continue
        text = _join_rows(b.rows, vocab)
        prev = paras[-1] if paras else None
        if b.kind == "heading" and prev is not None and prev.kind == "heading" and _wraps(prev.block, b):
            prev.text, prev.block = f"{prev.text} {text}", b  # a heading broken over two blocks
            continue
        if b.kind in ("heading", "caption"):
            paras.append(_Para(b.kind, text, b))
            # A caption sits inside the flow; the paragraph it interrupts goes on after it.
            cur = None if b.kind == "heading" else cur
            continue
        if cur is not None and cur.block is not None and _continues(cur.block, cur.text, b, pages, body):
            cur.text = _join(cur.text, text, vocab)
            cur.block = b
        else:
            cur = _Para("text", text, b)
            paras.append(cur)
    return [p for p in paras if p.kind == "table" or p.text]


def _continues(prev: _Block, prev_text: str, b: _Block, pages: list[_Page], body: float) -> bool:
    if abs(prev.size - b.size) > 0.6 or not b.rows or not prev.rows:
        return False
    if re.search(r"[^\W\d_]-$", prev_text):
        return True  # a word hyphenated across blocks, columns or pages
    first, last = b.rows[0], prev.rows[-1]
    same = prev.page == b.page and prev.col == b.col
    left, _ = pages[b.page].cols.get(b.col, (b.bbox[0], b.bbox[2]))
    # An indent (or out-dent) starts a paragraph; list items with hanging indents go on mid-sentence.
    # A one-line block holding an indented first line is measured against the column edge.
    indented_first = len(prev.rows) == 1 and 2.5 < last.x0 - left < 18
    shifted = abs(first.x0 - (last.x0 if same and not indented_first else left)) > 2.5
    if not _TERMINAL.search(prev_text):
        return not (shifted and first.text[:1].isupper())
    if shifted:
        return False
    pleft, pright = pages[prev.page].cols.get(prev.col, (prev.bbox[0], prev.bbox[2]))
    full = last.x1 >= pright - 0.06 * (pright - pleft)
    return full and (not same or -2 < first.y0 - last.y1 < 0.8 * body)


def _wraps(prev: _Block | None, b: _Block) -> bool:
    if prev is None or prev.page != b.page or _NUMBERED.match(b.text) or not prev.rows:
        return False
    return abs(prev.size - b.size) < 0.6 and 0 <= b.bbox[1] - prev.bbox[3] < 0.6 * b.size


def _cut_back_matter(paras: list[_Para]) -> list[_Para]:
    """Drop everything from the References / Bibliography / Acknowledgments heading on."""
    for i, p in enumerate(paras):
        if i == 0:
            continue
        if p.kind == "heading" and _CUT_HEADING.match(p.text):
            return paras[:i]
        run_in = p.kind == "text" and p.block is not None and p.block.rows and p.block.rows[0].bold
        if run_in and re.match(r"acknowledge?ments?\b", p.text, re.IGNORECASE):
            return paras[:i]
    return paras


def _section_name(heading: str) -> str:
    name = _NUMBERED.sub("", heading).strip() or heading
    if name.isupper():
        words = name.lower().split()
        small = {"a", "an", "and", "as", "at", "for", "in", "of", "on", "or", "the", "to", "with", "vs"}
        name = " ".join(w if (i and w in small) else w[:1].upper() + w[1:] for i, w in enumerate(words))
    return name


def _structure(paras: list[_Para]) -> tuple[str, list[Section], list[Table]]:
    """Abstract, sections (front matter before the first heading is left out) and placed tables."""
    headings = [i for i, p in enumerate(paras) if p.kind == "heading"]
    abstract, used = "", -1  # used: the last paragraph index that belongs to the front matter
    abs_heading = next(
        (i for i in headings if re.fullmatch(r"abstract[.:]?", paras[i].text, re.IGNORECASE)), None
    )
    if abs_heading is not None:
        nxt = next((i for i in headings if i > abs_heading), None)
        if nxt is None:  # no heading after it: the abstract is one paragraph
            nxt = next(
                (i + 1 for i in range(abs_heading + 1, len(paras)) if paras[i].kind == "text"), len(paras)
            )
        abstract = " ".join(p.text for p in paras[abs_heading + 1 : nxt] if p.kind == "text")
        used = nxt - 1
    else:
        texts = [(i, p) for i, p in enumerate(paras) if p.kind == "text"]
        run_in = next(
            ((i, p) for i, p in texts if _ABSTRACT_RUN_IN.match(p.text) and len(p.text) > 100), None
        )
        # The first substantial paragraph: several sentences, not an author or affiliation list.
        pick = run_in or next(
            (
                (i, p)
                for i, p in texts
                if len(p.text.split()) >= 40 and len(re.findall(r"[.!?](?:\s|$)", p.text)) >= 2
            ),
            None,
        )
        if pick is not None:
            abstract = _ABSTRACT_RUN_IN.sub("", pick[1].text) if pick is run_in else pick[1].text
            pick[1].kind = "used"
            used = pick[0] if not headings else -1
    sections: list[tuple[str, list[str]]] = []
    tables: list[Table] = []
    start = next((i for i in headings if i > used), None)
    if start is None:  # no section headings found: everything after the abstract is one section
        sections.append(("Body", []))
        start = used + 1
    for i, p in enumerate(paras):
        if p.kind == "table" and p.table is not None:
            name = sections[-1][0] if sections else None
            tables.append(p.table.model_copy(update={"section": name}))
        elif i < start:
            continue
        elif p.kind == "heading":
            sections.append((_section_name(p.text), []))
        elif p.kind in ("text", "caption") and sections:
            sections[-1][1].append(p.text)
    return abstract, [Section(name=n, paragraphs=ps) for n, ps in sections if ps], tables


def _authors(meta_author: str) -> list[str]:
    parts = re.split(r"\s*;\s*|\s+and\s+|\s*,\s*", meta_author.strip()) if meta_author.strip() else []
    return [p for p in (x.strip() for x in parts) if 2 <= len(p) <= 60 and re.search(r"[A-Za-z]", p)]


def _year(creation_date: str) -> int | None:
    m = re.match(r"(?:D:)?(\d{4})", creation_date)
    year = int(m.group(1)) if m else None
    return year if year is not None and 1900 <= year <= 2100 else None


if __name__ == "__main__":  # the child process of PdfParser
    import sys

    serve_parses(paper_from_pdf, int(sys.argv[1]), int(sys.argv[2]))
