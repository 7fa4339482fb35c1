"""Questions that ask for a research tool around one paper rather than an answer: "summarise
1912.01214", "related work for 'Joint learning of ontology and semantic parser from text'". A pure
rule: the tool and the words that name the paper; the caller resolves those words to a paper of the
library and, when they name none, answers the question as research as usual."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from arag.retrieval.resolve import PaperRef, PaperResolver

PaperTool = Literal["summary", "related"]
ToolRoute = Literal["summary", "related", "research"]

_END = r"\s*[?.!]*\s*$"
_PAPER = r"(?:(?:the|this)\s+(?:paper|article|work)\s*(?:called|titled|named)?\s*:?\s*)?"
_SUMMARY = re.compile(
    r"^\s*(?:please\s+|can\s+you\s+|could\s+you\s+)?"
    r"(?:summari[sz]e|sum\s+up|give\s+(?:me\s+)?a\s+summary\s+of|(?:a\s+)?summary\s+of|tl;?dr\s*(?:of|for)?:?)"
    rf"\s+{_PAPER}(?P<target>.+?){_END}",
    re.I,
)
_RELATED = re.compile(
    r"^\s*(?:please\s+|can\s+you\s+|could\s+you\s+)?(?:(?:find|show|list|give)\s+(?:me\s+)?|"
    r"what\s+(?:is|are)\s+|what's\s+)?(?:the\s+)?"
    r"(?:related\s+(?:work|papers?)|papers?\s+(?:related|similar)|similar\s+papers?)\s+(?:for|to|of|like)\s+"
    rf"{_PAPER}(?P<target>.+?){_END}",
    re.I,
)
# "Summarise what the library says about X" is an open question, not one paper's summary.
_OPEN = re.compile(
    r"^(?:what|how|which|why|where|who|when|the\s+(?:library|papers|literature)|papers\b|research\b|work\s+on)",
    re.I,
)


class PaperRequest(BaseModel):
    """A tool asked for, and the words that name its paper (quotes removed)."""

    tool: PaperTool
    target: str


def paper_request(question: str) -> PaperRequest | None:
    """The paper tool a question asks for, or None for any other question (a pure function)."""
    for tool, pattern in (("summary", _SUMMARY), ("related", _RELATED)):
        m = pattern.match(question)
        if m is None:
            continue
        target = m.group("target").strip().strip("\"“”'‘’«»`").strip()
        if not target or _OPEN.match(target):
            return None
        return PaperRequest(tool=tool, target=target)  # type: ignore[arg-type]
    return None


def tool_route(question: str) -> ToolRoute:
    """The route of a question by the rules alone: a paper tool, or research (a pure function)."""
    req = paper_request(question)
    return req.tool if req is not None else "research"


def resolve_target(target: str, resolver: PaperResolver) -> PaperRef | None:
    """The library's paper that ``target`` names: its id as the library spells it, an arXiv id, or a
    title (quoted or not, whole or a distinctive part); None when it names none or too weakly."""
    key = target.strip()
    if key in resolver.titles:
        return PaperRef(paper_id=key, title=resolver.titles[key], method="arxiv-id", score=1.0, matched=key)
    ref = resolver.resolve(key)
    if ref is not None:
        return ref
    # An unquoted title alone: the resolver reads quotes as the surest sign of a title.
    return resolver.resolve(f'"{key}"')
