"""arXiv identifiers: recognising one, stripping what people paste around it, linking to it."""

from __future__ import annotations

import re

# New style (2106.09685) and old style (cs/0101001, math.GT/0309136), with an optional version.
ARXIV_ID = re.compile(r"^(?:\d{4}\.\d{4,5}|[a-z][a-z.\-]*/\d{7})(?:v\d+)?$", re.I)
_PREFIX = re.compile(r"^(?:arxiv:|https?://arxiv\.org/(?:abs|pdf)/)", re.I)


def bare_arxiv_id(text: str) -> str:
    """``text`` without an ``arXiv:`` prefix, an abs/pdf URL around it, or a ``.pdf`` suffix."""
    return _PREFIX.sub("", text.strip()).removesuffix(".pdf")


def is_arxiv_id(text: str) -> bool:
    """Whether ``text`` is an arXiv id as it stands (no prefix)."""
    return bool(ARXIV_ID.match(text))


def arxiv_url(paper_id: str) -> str | None:
    """The arXiv page of a paper id; None for ids that are not arXiv ids (PDFs added by hand)."""
    return f"https://arxiv.org/abs/{paper_id}" if is_arxiv_id(paper_id) else None
