"""PDFs made to hurt a parser, small on disk: many pages, or one page whose compressed content
stream inflates to a text layer of millions of glyphs (memory and time)."""

from __future__ import annotations

from pathlib import Path

import pymupdf

_LINE = "Retrieval augmented generation grounds answers in passages of papers."


def page_bomb(path: Path, pages: int) -> Path:
    """A PDF of ``pages`` pages with one line of prose each (about 37 kB per 100 pages)."""
    doc = pymupdf.open()
    for i in range(pages):
        page = doc.new_page()
        page.insert_text((72, 72), f"{_LINE} Page {i + 1}.", fontsize=10)
    doc.save(path, garbage=3, deflate=True)
    doc.close()
    return path


def inflation_bomb(path: Path, inflated_mb: float) -> Path:
    """One page whose content stream draws the same line again and again: ``inflated_mb`` MB once
    decompressed, about 4 kB per MB on disk. Text extraction keeps every glyph it draws: 5 MB took
    arag's parser 8 s; 100 MB (a 408 kB file) passes the default 2,048 MB memory limit."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), _LINE, fontsize=10)
    xref = page.get_contents()[0]
    once = doc.xref_stream(xref)
    doc.update_stream(xref, once * max(1, int(inflated_mb * 1024 * 1024 // len(once))))
    doc.save(path, deflate=True)
    doc.close()
    return path
