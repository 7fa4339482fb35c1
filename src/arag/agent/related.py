"""Related work for one paper: the library's nearest papers, and one line each on how they relate.

Two rankings of every other paper are combined by reciprocal rank fusion (k = 60, as the hybrid
search fuses its lists): the cosine of the abstract vectors (meaning), and the TF-IDF cosine of the
titles' and abstracts' key terms (shared vocabulary: names of methods, datasets and tasks that a
sentence embedding blurs). A paper high on both comes first; ties go to the higher vector cosine,
then the paper id. The line on each paper is written by the LLM from the two abstracts and checked
against them like an answer's claims; without an LLM, or where its line is unsupported, it is the
related abstract's sentence that shares most terms with the paper, after the shared terms.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from arag.agent import prompts
from arag.agent.deps import ask
from arag.agent.support import SupportScorer
from arag.agent.terms import (
    GENERIC,
    key_terms,
    reported,
    sentences,
    strip_citations,
    term_words,
)
from arag.corpus.arxiv_ids import arxiv_url
from arag.errors import AragError, Cancelled
from arag.llm.base import LLM
from arag.text import latex_as_text, strip_placeholders, tokenize

log = logging.getLogger(__name__)

RRF_K = 60
SHARED_TERMS = 4
ABSTRACT_SENTENCES = 2
LINE_TOKENS = 40
METHOD = (
    "reciprocal rank fusion (k = 60) of two rankings of the other papers: cosine of the abstract "
    "vectors, and TF-IDF cosine of title and abstract key terms; ties by vector cosine"
)
# Words too common in paper abstracts to say what two papers share (beside the agent's GENERIC).
_COMMON = frozenset(
    tokenize(
        "based available first model models task tasks data results show shows new also however two "
        "three one different well can may paper papers approach propose proposed present use used using "
        "set large small various several existing recent recently performance state art"
    )
)
_HEAD = re.compile(r"^Title: [^\n]*\n(Section: [^\n]*\n)?")
_NUMBERED = re.compile(r"^\s*\d+[.)]\s*")
_LINE = re.compile(r"^\s*\[?(\d+)[\].):]\s*(.+)$")


class LibraryPaper(BaseModel):
    """What the ranking reads of a paper: id, title, year and abstract (without the embed prefix)."""

    id: str
    title: str
    year: int | None = None
    abstract: str = ""


class Ranked(BaseModel):
    """A paper's place in the fused ranking."""

    index: int
    score: float
    cosine: float
    dense_rank: int
    term_rank: int
    term_score: float
    shared: list[str]


class RelatedPaper(BaseModel):
    paper_id: str
    title: str
    year: int | None
    arxiv_url: str | None
    score: float = Field(description="the fused score: 1/(60 + vector rank) + 1/(60 + term rank)")
    cosine: float = Field(description="cosine of the two abstracts' vectors")
    dense_rank: int = Field(description="rank among the other papers by abstract vectors")
    term_rank: int = Field(description="rank among the other papers by shared title/abstract terms")
    shared_terms: list[str]
    relation: str = Field(description="one line on how it relates to the paper")
    relation_mode: Literal["llm", "extractive"]


class RelatedPapers(BaseModel):
    paper_id: str
    title: str
    arxiv_url: str | None
    method: str = METHOD
    papers: list[RelatedPaper]
    llm: str
    total_ms: float = 0.0


def clean_abstract(text: str) -> str:
    """A recorded abstract without the 'Title: ...\\nSection: Abstract\\n' head it was embedded with,
    its LaTeX markup read as text (\\emph{X} -> X)."""
    return latex_as_text(_HEAD.sub("", text).strip())


def _tfidf(docs: Sequence[list[str]]) -> list[dict[str, float]]:
    df: Counter[str] = Counter()
    for d in docs:
        df.update(set(d))
    n = len(docs)
    out = []
    for d in docs:
        tf = Counter(d)
        vec = {t: (1 + math.log(c)) * math.log(1 + n / df[t]) for t, c in tf.items()}
        norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
        out.append({t: v / norm for t, v in vec.items()})
    return out


def _terms(p: LibraryPaper) -> list[str]:
    return [t for t in tokenize(f"{p.title} {p.abstract}") if t not in GENERIC and t not in _COMMON]


def rank_related(target: int, papers: Sequence[LibraryPaper], vectors: np.ndarray, k: int) -> list[Ranked]:
    """The ``k`` papers nearest ``papers[target]``, best first (a pure function; see the module)."""
    n = len(papers)
    if n < 2 or k < 1:
        return []
    x = np.asarray(vectors, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    cos = x @ x[target]
    tfidf = _tfidf([_terms(p) for p in papers])
    tv = tfidf[target]
    term = np.array([sum(w * tv.get(t, 0.0) for t, w in d.items()) for d in tfidf])
    others = [i for i in range(n) if i != target]
    ids = [papers[i].id for i in others]
    # Ranks with ties broken by paper id, so the order never depends on the input's order.
    by_dense = sorted(range(len(others)), key=lambda j: (-cos[others[j]], ids[j]))
    by_term = sorted(range(len(others)), key=lambda j: (-term[others[j]], ids[j]))
    dense_rank = {others[j]: r for r, j in enumerate(by_dense, 1)}
    term_rank = {others[j]: r for r, j in enumerate(by_term, 1)}
    fused = {i: 1 / (RRF_K + dense_rank[i]) + 1 / (RRF_K + term_rank[i]) for i in others}
    order = sorted(others, key=lambda i: (-round(fused[i], 12), -cos[i], papers[i].id))[:k]
    out = []
    for i in order:
        common = sorted((t for t in tfidf[i] if t in tv), key=lambda t: (-(tfidf[i][t] * tv[t]), t))[
            :SHARED_TERMS
        ]
        out.append(
            Ranked(
                index=i,
                score=round(fused[i], 6),
                cosine=round(float(cos[i]), 4),
                dense_rank=dense_rank[i],
                term_rank=term_rank[i],
                term_score=round(float(term[i]), 4),
                shared=common,
            )
        )
    return out


def _words(terms: list[str], *texts: str) -> list[str]:
    """Stemmed terms as a text wrote them, each word once (two stems can come from one hyphenated
    word: "concept" and "concept-to-text" both read "concept-to-text")."""
    words: dict[str, str] = {}
    for text in texts:
        for t, w in term_words(text).items():
            words.setdefault(t, w.lower())
    return list(dict.fromkeys(words.get(t, t) for t in terms))


def extractive_line(paper: LibraryPaper, other: LibraryPaper, shared: list[str]) -> str:
    """'Also on <shared words>: <the other abstract's sentence sharing most terms with the paper>'."""
    mine = set(key_terms(f"{paper.title} {paper.abstract}"))
    best = ""
    best_score = -1.0
    for s in sentences(strip_placeholders(other.abstract))[:8] or [other.title]:
        have = set(key_terms(s))
        score = len(have & mine) / math.sqrt(len(have) or 1)
        if score > best_score:
            best, best_score = s, score
    words = ", ".join(_words(shared, other.abstract, other.title, paper.abstract))
    # The other paper's "we" is its authors (``reported``), not arag or the paper asked about.
    return (f"Also on {words}: " if words else "") + (reported(best) if best else other.title)


def _first(abstract: str, n: int) -> str:
    return " ".join(sentences(abstract)[:n])


def llm_lines(llm: LLM, paper: LibraryPaper, others: list[LibraryPaper]) -> dict[int, str]:
    """The LLM's line for each related paper (1-based, in order); a line it did not write is absent."""
    listing = "\n".join(
        f"{i}. {o.title}: {_first(o.abstract, ABSTRACT_SENTENCES)}" for i, o in enumerate(others, 1)
    )
    user = prompts.RELATED_USER.format(
        title=paper.title, abstract=_first(paper.abstract, ABSTRACT_SENTENCES + 1), papers=listing
    )
    reply = ask(llm, prompts.RELATED_SYSTEM, user, max_tokens=LINE_TOKENS * len(others) + 20)
    out: dict[int, str] = {}
    for line in reply.splitlines():
        m = _LINE.match(line)
        if m and 1 <= int(m.group(1)) <= len(others):
            i = int(m.group(1))
            text = " ".join(strip_citations(_NUMBERED.sub("", m.group(2))).split())
            if text and not echoes(text, others[i - 1]):
                out.setdefault(i, text)
    return out


def echoes(line: str, other: LibraryPaper) -> bool:
    """Whether a line only repeats the listing it was given (the paper's title and first sentences,
    as small models do) instead of saying how the papers relate."""
    listing = f"{other.title}: {_first(other.abstract, ABSTRACT_SENTENCES)}".lower()
    low = line.lower()
    return (
        low.startswith(other.title.lower()[:30]) or difflib.SequenceMatcher(None, low, listing).ratio() > 0.7
    )


def supported_by_both(line: str, paper: LibraryPaper, other: LibraryPaper, scorer: SupportScorer) -> bool:
    """A line on what two papers share is a claim about each: each abstract must support it alone (a
    line checked against the two together passes on words from one of them)."""
    return all(scorer.score(line, f"{p.title}. {p.abstract}") >= scorer.threshold for p in (paper, other))


def related_papers(
    target: int,
    papers: Sequence[LibraryPaper],
    vectors: np.ndarray,
    *,
    k: int,
    llm: LLM | None,
    scorer: SupportScorer,
) -> RelatedPapers:
    """The ``k`` papers related to ``papers[target]``, each with its line (see the module)."""
    t0 = time.perf_counter()
    paper = papers[target]
    ranked = rank_related(target, papers, vectors, k)
    others = [papers[r.index] for r in ranked]
    lines: dict[int, str] = {}
    if llm is not None and others:
        try:
            lines = llm_lines(llm, paper, others)
        except Cancelled:
            raise
        except AragError as exc:
            log.warning("related-work LLM failed, lines taken from the abstracts: %s", exc)
    out: list[RelatedPaper] = []
    for i, (r, other) in enumerate(zip(ranked, others, strict=True), 1):
        line = lines.get(i, "")
        mode: Literal["llm", "extractive"] = "llm"
        if not line or not supported_by_both(line, paper, other, scorer):
            line, mode = extractive_line(paper, other, r.shared), "extractive"
        out.append(
            RelatedPaper(
                paper_id=other.id,
                title=other.title,
                year=other.year,
                arxiv_url=arxiv_url(other.id),
                score=r.score,
                cosine=r.cosine,
                dense_rank=r.dense_rank,
                term_rank=r.term_rank,
                shared_terms=_words(r.shared, other.abstract, other.title, paper.abstract),
                relation=line,
                relation_mode=mode,
            )
        )
    return RelatedPapers(
        paper_id=paper.id,
        title=paper.title,
        arxiv_url=arxiv_url(paper.id),
        papers=out,
        llm=llm.name if llm is not None else "extractive (no LLM)",
        total_ms=round(1000 * (time.perf_counter() - t0), 2),
    )


def related_text(rel: RelatedPapers) -> str:
    """The related papers as numbered lines with their arXiv links."""
    if not rel.papers:
        return "The library holds no other paper."
    lines = [f"Papers related to {rel.title}:"]
    for i, p in enumerate(rel.papers, 1):
        link = f" ({p.arxiv_url})" if p.arxiv_url else f" ({p.paper_id})"
        lines.append(f"{i}. {p.title}{link}: {p.relation}")
    return "\n".join(lines)
