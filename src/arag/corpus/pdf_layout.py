"""Page layout of a PDF for ``arag.corpus.pdf``: text lines and blocks, columns and reading order,
block kinds (headings, captions, small print) and tables found from their captions.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pymupdf

from arag.records import Table

# find_tables() otherwise prints an advert for another package to stdout once per process.
pymupdf.no_recommend_layout()

# Ligatures expanded (no TEXT_PRESERVE_LIGATURES), images off, text outside the page dropped.
_TEXT_FLAGS = pymupdf.TEXT_PRESERVE_WHITESPACE | pymupdf.TEXT_MEDIABOX_CLIP
_BOLD_FONT = re.compile(r"bold|medi|semibold|black|heavy|\bTB\b|-B$|TB$", re.IGNORECASE)
_NUMBERED = re.compile(r"^(\d{1,2}(?:\.\d{1,2}){0,3}|[A-H](?:\.\d{1,2}){0,3})\.?\s+(?=[A-Z])")
_CUT_HEADING = re.compile(
    r"^(?:\d{1,2}\.?\s+|[A-H]\.?\s+)?(references|bibliography|acknowledge?ments?|literature cited|"
    r"works cited)\.?$",
    re.IGNORECASE,
)
_CAPTION = re.compile(r"^(table|tab\.|figure|fig\.)\s*([A-Z]?\d{1,3})\s*([:.|]?)", re.IGNORECASE)
_MARKER = re.compile(r"[\d,*\u2020\u2021\u2217\u00a7\u00b6]+")
_COMBINING = {
    "\u00a8": "\u0308",
    "\u00b4": "\u0301",
    "\u02d8": "\u0306",
    "\u02c7": "\u030c",
    "\u02dc": "\u0303",
}
_SPACING_ACCENT = re.compile("([" + "".join(_COMBINING) + r"])\s?([A-Za-z])")


@dataclass
class _Line:
    text: str
    x0: float
    y0: float
    x1: float
    y1: float
    size: float
    bold: bool
    gap: float = 0.0  # widest gap between pieces merged into this row


@dataclass
class _Block:
    page: int
    bbox: tuple[float, float, float, float]
    lines: list[_Line]
    size: float
    bold: bool
    col: str = "span"  # left | right | span
    # text | heading | caption | tablecap (a table's anchor) | small (footnotes) | region (inside a
    # figure or table) | furniture (title, running headers, page numbers)
    kind: str = "text"
    rows: list[_Line] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(r.text for r in self.rows).strip()

    @property
    def n_words(self) -> int:
        return len(self.text.split())


@dataclass
class _Page:
    number: int
    width: float
    height: float
    blocks: list[_Block]
    cols: dict[str, tuple[float, float]] = field(default_factory=dict)  # col -> (left, right)


# --------------------------------------------------------------------------- reading pages


def _read_page(page: Any) -> _Page:
    blocks: list[_Block] = []
    for raw in page.get_text("dict", flags=_TEXT_FLAGS)["blocks"]:
        if raw.get("type") != 0:
            continue
        lines: list[_Line] = []
        for ln in raw["lines"]:
            if abs(ln["dir"][1]) > 0.05:  # rotated text: arXiv stamps, axis labels
                continue
            spans = _drop_markers([s for s in ln["spans"] if s["text"].strip()])
            if not spans:
                continue
            text = _clean("".join(s["text"] for s in ln["spans"] if s in spans or not s["text"].strip()))
            chars = Counter[float]()
            bold = 0
            for s in spans:
                n = len(s["text"].strip())
                chars[round(s["size"] * 2) / 2] += n
                bold += n if (s["flags"] & 16 or _BOLD_FONT.search(s["font"])) else 0
            x0, y0, x1, y1 = ln["bbox"]
            size = chars.most_common(1)[0][0]
            lines.append(_Line(text, x0, y0, x1, y1, size, bold * 2 > sum(chars.values())))
        if not lines:
            continue
        sizes = Counter[float]()
        for ln2 in lines:
            sizes[ln2.size] += len(ln2.text)
        bold_chars = sum(len(ln2.text) for ln2 in lines if ln2.bold)
        bbox = (
            min(x.x0 for x in lines),
            min(x.y0 for x in lines),
            max(x.x1 for x in lines),
            max(x.y1 for x in lines),
        )
        blk = _Block(
            page.number, bbox, lines, sizes.most_common(1)[0][0], bold_chars * 5 >= 4 * sum(sizes.values())
        )
        blk.rows = _rows(lines)
        blocks.append(blk)
    # Pictures bound figure regions; get_image_info() gives their boxes without decoding them.
    for info in page.get_image_info():
        bb = _rect(info["bbox"])
        if bb[2] - bb[0] > 20 and bb[3] - bb[1] > 20:
            blocks.append(_Block(page.number, bb, [], 0.0, False, kind="image"))
    return _Page(page.number, page.rect.width, page.rect.height, blocks)


def _drop_markers(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop raised, smaller footnote markers ("S2ORC,¹"): digits and daggers above the baseline."""
    if len(spans) < 2:
        return spans
    main = max(spans, key=lambda s: (len(s["text"].strip()), s["size"]))
    return [
        s
        for s in spans
        if not (
            _MARKER.fullmatch(s["text"].strip())
            and s["size"] <= 0.8 * main["size"]
            and s["origin"][1] < main["origin"][1] - 0.15 * main["size"]
        )
    ]


def _clean(text: str) -> str:
    # LaTeX accents come out as a spacing accent before the letter ("F¨arber", "Mitrovi´c").
    text = _SPACING_ACCENT.sub(lambda m: m.group(2) + _COMBINING[m.group(1)], text)
    text = unicodedata.normalize("NFC", text).replace("\u00ad", "")
    return re.sub(r"\s+", " ", text).strip()


def _rows(lines: list[_Line]) -> list[_Line]:
    """Merge PyMuPDF lines that share a baseline (justified text is often split at wide gaps)."""
    groups: list[list[_Line]] = []
    for ln in lines:
        if groups and abs(groups[-1][0].y1 - ln.y1) < 0.4 * ln.size:
            groups[-1].append(ln)
        else:
            groups.append([ln])
    rows: list[_Line] = []
    for group in groups:
        group.sort(key=lambda x: x.x0)
        gap = max((b.x0 - a.x1 for a, b in zip(group, group[1:], strict=False)), default=0.0)
        rows.append(
            _Line(
                " ".join(x.text for x in group),
                group[0].x0,
                min(x.y0 for x in group),
                max(x.x1 for x in group),
                max(x.y1 for x in group),
                max(x.size for x in group),
                all(x.bold for x in group),
                gap,
            )
        )
    return rows


def _join_rows(rows: list[_Line], vocab: set[str]) -> str:
    text = ""
    for r in rows:
        text = _join(text, r.text, vocab) if text else r.text
    return text


def _join(a: str, b: str, vocab: set[str]) -> str:
    """Join two lines, undoing end-of-line hyphenation unless the document suggests a compound."""
    head = re.search(r"([^\W\d_]+)-$", a)
    if head is None:
        return f"{a} {b}"
    tail = re.match(r"[^\W\d_]+", b)
    if tail is None:
        return a + b
    h, t = head.group(1), tail.group(0)
    if (h + t).lower() in vocab:
        return a[:-1] + b
    # "machine-readable", "non-English": a known compound, two whole words, or a capitalised tail.
    if (
        f"{h}-{t}".lower() in vocab
        or not t[0].islower()
        or (len(h) >= 4 and h.lower() in vocab and t.lower() in vocab)
    ):
        return a + b
    return a[:-1] + b


# --------------------------------------------------------------------------- layout


def _classify(pg: _Page, body: float) -> None:
    """Columns, captions, headings and small print (footnotes) of one page."""
    live = [b for b in pg.blocks if b.kind not in ("furniture", "image")]
    for b in live:
        b.col = _column(b.bbox, pg)
    in_cols = sum(len(b.text) for b in live if b.col != "span")
    if in_cols < 0.4 * max(1, sum(len(b.text) for b in live)):
        for b in live:
            b.col = "span"
    for col in ("left", "right", "span"):
        bl = [b for b in live if b.col == col and b.n_words >= 6]
        if bl:
            left = Counter(round(r.x0) for b in bl for r in b.rows).most_common(1)[0][0]
            right = Counter(round(r.x1) for b in bl for r in b.rows).most_common(1)[0][0]
            pg.cols[col] = (float(left), float(max(right, left + 50)))
    for b in pg.blocks:
        if b.kind == "image":
            b.col = _column(b.bbox, pg)
    for b in live:
        if _is_caption(b, body):
            b.kind = "caption"
        elif b.size < body - 1.4:
            b.kind = "small"  # footnotes, figure labels, small print
        elif _is_heading(b, body, pg):
            b.kind = "heading"


def _column(bbox: tuple[float, float, float, float], pg: _Page) -> str:
    mid = pg.width / 2
    if bbox[0] < mid - 10 and bbox[2] > mid + 10:
        return "span"
    if pg.cols and "left" not in pg.cols and "right" not in pg.cols:
        return "span"  # a one-column page
    return "left" if bbox[2] <= mid + 10 else "right"


def _is_caption(b: _Block, body: float) -> bool:
    m = _CAPTION.match(b.text)
    if not m or len(b.rows) > 15:
        return False
    first = b.lines[0]
    return m.group(3) == ":" or b.size < body - 0.3 or first.bold or (m.group(3) == "." and b.n_words <= 3)


def _is_heading(b: _Block, body: float, pg: _Page) -> bool:
    text = b.text
    if len(b.rows) > 3 or len(text) > 150 or b.n_words > 18 or not re.search(r"[A-Za-z]{2}", text):
        return False
    if re.fullmatch(r"abstract", text, re.IGNORECASE) or _CUT_HEADING.match(text):
        return True
    styled = b.bold or b.size >= body + 0.9 or (text.isupper() and len(text) > 3)
    if _NUMBERED.match(text):
        rest = _NUMBERED.sub("", text)
        return styled and not re.search(r"[.,;]$", text) and len(rest.split()) <= 16
    left, right = pg.cols.get(b.col, (b.bbox[0], b.bbox[2]))
    # A bold run-in ("Findings. We ...") fills its line; a heading line stays short.
    short = all(r.x1 - r.x0 < 0.85 * (right - left) for r in b.rows)
    return styled and short and len(b.rows) <= 2 and b.n_words <= 10 and not re.search(r"[.:,;]$", text)


def _is_boundary(b: _Block, body: float, pg: _Page) -> bool:
    """Where a figure or table region ends: prose, captions, section-like headings, other regions."""
    if b.kind in ("caption", "tablecap", "region"):
        return True
    if b.kind == "heading":
        return bool(_NUMBERED.match(b.text)) or b.size >= body + 0.9 or bool(_CUT_HEADING.match(b.text))
    return _is_prose(b, body, pg)


def _is_prose(b: _Block, body: float, pg: _Page) -> bool:
    """Body-size text in rows that fill most of their column with normally spaced words."""
    if abs(b.size - body) > 0.6 or b.kind in ("caption", "heading"):
        return False
    left, right = pg.cols.get(b.col, (b.bbox[0], b.bbox[2]))
    good = [r for r in b.rows if len(r.text.split()) >= 4 and r.gap <= 1.3 * r.size]
    wide = [r for r in good if r.x1 - r.x0 >= 0.6 * (right - left)]
    return len(wide) >= max(1, len(b.rows) // 2)


def _reading_order(pg: _Page) -> list[_Block]:
    """Full-width blocks split the page into bands; in each band the left column precedes the right."""
    skip = ("furniture", "small", "region", "image")
    blocks = sorted((b for b in pg.blocks if b.kind not in skip), key=lambda b: b.bbox[1])
    out: list[_Block] = []
    band: list[_Block] = []
    for b in blocks:
        if b.col == "span":
            out += _flush(band)
            band = []
            out.append(b)
        else:
            band.append(b)
    return out + _flush(band)


def _flush(band: list[_Block]) -> list[_Block]:
    left = sorted((b for b in band if b.col == "left"), key=lambda b: b.bbox[1])
    right = sorted((b for b in band if b.col == "right"), key=lambda b: b.bbox[1])
    return left + right


# --------------------------------------------------------------------------- figures and tables

Rect = tuple[float, float, float, float]


def _extract_tables(page: Any, pg: _Page, body: float, vocab: set[str]) -> list[tuple[_Block, Table]]:
    """Tables of one page, each anchored at its caption block; figure interiors become regions.

    Booktabs tables have no vertical rules, so besides ``find_tables()`` on the whole page each
    "Table N" caption's neighbourhood (the non-prose blocks beside it) is parsed on its own.
    """
    caps = sorted((b for b in pg.blocks if b.kind == "caption"), key=lambda b: b.bbox[1])
    regions: dict[int, tuple[Rect, list[_Block]]] = {}
    for cap in caps:  # top to bottom; a block claimed by one caption bounds the next one's region
        region = _caption_region(pg, cap, body)
        if region is not None:
            regions[id(cap)] = region
            for m in region[1]:
                m.kind = "region"
    table_caps = [c for c in caps if c.text.lower().startswith("tab") and id(c) in regions]
    ruled: list[tuple[Rect, list[list[str]]]] = []
    # find_tables costs 0.1-0.4 s a page: only pages with a "Table N" caption pay for it.
    if table_caps:
        ruled = [(_rect(t.bbox), _cells(t.extract())) for t in page.find_tables().tables]
    found: list[tuple[_Block, Table, Rect]] = []
    for cap in table_caps:
        rect = regions[id(cap)][0]
        match = next(((bb, r) for bb, r in ruled if _overlap(bb, rect) > 0.5 and not _degenerate(r)), None)
        rows = match[1] if match else _region_rows(page, rect)
        if rows is None or _degenerate(rows):
            continue
        cap.kind = "tablecap"
        span = _union(rect, match[0]) if match else rect
        found.append(
            (
                cap,
                Table(caption=_join_rows(cap.rows, vocab), text=_table_text(rows), page=pg.number + 1),
                span,
            )
        )
    for bb, rows in ruled:
        if _degenerate(rows) or any(_overlap(bb, r) > 0.2 for r, _ in regions.values()):
            continue  # a figure's drawing, or a table already parsed from its caption
        anchor = _Block(pg.number, bb, [], body, False, col=_column(bb, pg), kind="tablecap")
        pg.blocks.append(anchor)
        found.append((anchor, Table(caption=None, text=_table_text(rows), page=pg.number + 1), bb))
    for _, _, span in found:
        for b in pg.blocks:
            if b.kind in ("text", "small", "heading") and _center_in(b.bbox, span):
                b.kind = "region"
    return [(anchor, table) for anchor, table, _ in found]


def _rect(bb: Any) -> Rect:
    return (float(bb[0]), float(bb[1]), float(bb[2]), float(bb[3]))


def _union(a: Rect, b: Rect) -> Rect:
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def _caption_region(pg: _Page, cap: _Block, body: float) -> tuple[Rect, list[_Block]] | None:
    """The figure/table beside a caption: the non-prose blocks up to the nearest prose, above or below.

    Above is tried first: a footnote under a caption must not pull the region below it.
    """
    lefts = [c[0] for c in pg.cols.values()] or [cap.bbox[0]]
    rights = [c[1] for c in pg.cols.values()] or [cap.bbox[2]]
    x0, x1 = pg.cols[cap.col] if cap.col in pg.cols and cap.col != "span" else (min(lefts), max(rights))
    x0, x1 = min(x0, cap.bbox[0]), max(x1, cap.bbox[2])
    for above in (True, False):
        cands = [
            b
            for b in pg.blocks
            if b is not cap
            and b.kind != "furniture"
            and b.bbox[2] > x0 + 2
            and b.bbox[0] < x1 - 2
            and (b.bbox[3] <= cap.bbox[1] + 2 if above else b.bbox[1] >= cap.bbox[3] - 2)
        ]
        cands.sort(key=lambda b: -b.bbox[3] if above else b.bbox[1])
        members: list[_Block] = []
        stop: _Block | None = None
        for b in cands:
            if _is_boundary(b, body, pg):
                stop = b
                break
            members.append(b)
        # The short last line of a paragraph hangs just below its prose: it is not figure content.
        while above and stop is not None and members:
            top = members[-1]
            if abs(top.size - body) > 0.6 or top.bbox[1] - stop.bbox[3] >= 0.8 * body:
                break
            stop = members.pop()
        near = members[0].bbox if members else None
        if near is not None and (cap.bbox[1] - near[3] if above else near[1] - cap.bbox[3]) < 4 * body:
            rect = (
                min(b.bbox[0] for b in members) - 1,
                min(b.bbox[1] for b in members) - 1,
                max(b.bbox[2] for b in members) + 1,
                max(b.bbox[3] for b in members) + 1,
            )
            return rect, members
    return None


def _region_rows(page: Any, rect: Rect) -> list[list[str]] | None:
    """Cells of an unruled table: words grouped into rows by baseline, into cells by wide gaps.

    (``find_tables(strategy="text")`` was tried here: slower, and it cuts words across cells.)
    """
    words = page.get_text("words", clip=rect, flags=_TEXT_FLAGS)
    return _word_rows(words) if words else None


def _word_rows(words: list[Any]) -> list[list[str]]:
    lines: list[list[Any]] = []
    for w in sorted(words, key=lambda w: ((w[1] + w[3]) / 2, w[0])):
        yc = (w[1] + w[3]) / 2
        if lines and abs(yc - (lines[-1][0][1] + lines[-1][0][3]) / 2) <= 0.45 * (w[3] - w[1]):
            lines[-1].append(w)
        else:
            lines.append([w])
    rows: list[list[str]] = []
    for line in lines:
        cells: list[str] = []
        last_x1 = -1e9
        for w in sorted(line, key=lambda w: w[0]):
            if cells and w[0] - last_x1 <= 0.8 * (w[3] - w[1]):
                cells[-1] += " " + _clean(w[4])
            else:
                cells.append(_clean(w[4]))
            last_x1 = w[2]
        rows.append(cells)
    return rows


def _cells(rows: list[list[Any]]) -> list[list[str]]:
    return [[_clean(str(c)) if c is not None else "" for c in row] for row in rows]


def _degenerate(rows: list[list[str]]) -> bool:
    cells = [c for row in rows for c in row]
    width = max((len(r) for r in rows), default=0)
    return len(rows) < 2 or width < 2 or sum(bool(c) for c in cells) < 0.4 * len(cells)


def _table_text(rows: list[list[str]]) -> str:
    return "\n".join(" | ".join(row) for row in rows if any(row))


def _overlap(a: Rect, b: Rect) -> float:
    """Share of ``a``'s area that lies inside ``b``."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    area = (a[2] - a[0]) * (a[3] - a[1])
    return max(0.0, w) * max(0.0, h) / area if area > 0 else 0.0


def _center_in(b: Rect, r: Rect) -> bool:
    cx, cy = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
    return r[0] <= cx <= r[2] and r[1] <= cy <= r[3]
