"""Retrieval evaluation on QASPER: do the gold evidence paragraphs reach the top of the list?

Units are the gold evidence paragraphs (text evidence only; "FLOAT SELECTED" captions are not in
the corpus). A retrieved chunk *hits* a gold paragraph when it contains one of the paragraph's
sentences (of at least ``MIN_SENTENCE_CHARS``), after whitespace and case normalisation: chunks are
sentence-aligned, so a paragraph cut across chunks is hit by each chunk holding part of it.

- Recall@k: share of a question's gold paragraphs hit by the top k chunks.
- nDCG@k: binary gain at rank i when the chunk hits a gold paragraph not hit higher up; the ideal
  ranking hits one new gold paragraph per rank, min(k, |gold|) of them.
- Paper@k: the gold paper is among the top k chunks' papers.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Literal

from pydantic import BaseModel

from arag.errors import InputError
from arag.eval.qasper_metrics import FLOAT_MARKER
from arag.ingest.splitter import split_sentences
from arag.records import ScoredChunk, SearchFilter

MIN_SENTENCE_CHARS = 20
Scope = Literal["library", "paper"]


class EvalQuestion(BaseModel):
    """A QASPER question with text evidence."""

    question_id: str
    paper_id: str
    paper_title: str
    question: str
    evidence: list[str]


def load_questions(path: Path, *, limit: int | None = None) -> list[EvalQuestion]:
    """Questions with at least one text evidence paragraph (union over annotations)."""
    if not path.is_file():
        raise InputError(
            f"benchmark file not found: {path}",
            where="arag eval retrieval",
            fix="pass --questions PATH (../shared/benchmarks/qasper/questions_validation.json)",
        )
    out: list[EvalQuestion] = []
    for item in json.loads(path.read_text()):
        evidence = list(
            dict.fromkeys(
                e
                for a in item["answers"]
                for e in a.get("evidence", [])
                if e and not e.startswith(FLOAT_MARKER)
            )
        )
        if evidence:
            out.append(
                EvalQuestion(
                    question_id=item["question_id"],
                    paper_id=item["paper_id"],
                    paper_title=item["paper_title"],
                    question=item["question"],
                    evidence=evidence,
                )
            )
        if limit is not None and len(out) >= limit:
            break
    return out


def library_query(q: EvalQuestion) -> str:
    """The library-wide query: the questions say 'they', so the paper title goes in front."""
    return f"In the paper '{q.paper_title}': {q.question}"


_WS = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip().lower()


def paragraph_keys(paragraph: str) -> list[str]:
    """The normalised sentences by which a chunk is recognised as holding part of a paragraph."""
    sents = [_norm(s) for s in split_sentences(paragraph)]
    keys = [s for s in sents if len(s) >= MIN_SENTENCE_CHARS]
    return keys or [_norm(paragraph)]


def hits_per_rank(chunk_texts: Sequence[str], gold: Sequence[str]) -> list[set[int]]:
    """For each ranked chunk, the indices of gold paragraphs it holds part of."""
    keys = [paragraph_keys(g) for g in gold]
    out = []
    for text in chunk_texts:
        t = _norm(text)
        out.append({i for i, ks in enumerate(keys) if any(k in t for k in ks)})
    return out


def recall_at(hits: Sequence[set[int]], n_gold: int, k: int) -> float:
    """Share of gold paragraphs hit by the first k chunks."""
    found: set[int] = set().union(*hits[:k]) if hits[:k] else set()
    return len(found) / n_gold if n_gold else 0.0


def ndcg_at(hits: Sequence[set[int]], n_gold: int, k: int) -> float:
    """Binary nDCG@k where a rank gains 1 only for a gold paragraph not hit higher up."""
    seen: set[int] = set()
    dcg = 0.0
    for rank, h in enumerate(hits[:k], 1):
        new = h - seen
        if new:
            dcg += 1.0 / math.log2(rank + 1)
            seen |= new
    ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(k, n_gold) + 1))
    return dcg / ideal if ideal else 0.0


class QuestionResult(BaseModel):
    question_id: str
    recall: float
    ndcg: float
    paper_hit: bool
    seconds: float


class RetrievalReport(BaseModel):
    """Mean figures over the questions, and the per-question results."""

    scope: Scope
    k: int
    questions: int
    recall: float
    ndcg: float
    paper_hit_rate: float
    median_ms: float
    results: list[QuestionResult]


SearchFn = Callable[[str, SearchFilter | None], list[ScoredChunk]]


def evaluate_retrieval(
    search: SearchFn,
    questions: Sequence[EvalQuestion],
    *,
    scope: Scope = "library",
    k: int = 10,
    paper_k: int = 5,
    progress: Callable[[int], None] | None = None,
) -> RetrievalReport:
    """Run every question through ``search`` and score its top k chunks."""
    results: list[QuestionResult] = []
    for q in questions:
        if scope == "paper":
            query, flt = q.question, SearchFilter(paper_ids=[q.paper_id])
        else:
            query, flt = library_query(q), None
        t0 = time.perf_counter()
        ranked = search(query, flt)
        dt = time.perf_counter() - t0
        hits = hits_per_rank([h.chunk.text for h in ranked[:k]], q.evidence)
        results.append(
            QuestionResult(
                question_id=q.question_id,
                recall=recall_at(hits, len(q.evidence), k),
                ndcg=ndcg_at(hits, len(q.evidence), k),
                paper_hit=any(h.chunk.paper_id == q.paper_id for h in ranked[:paper_k]),
                seconds=dt,
            )
        )
        if progress:
            progress(1)
    n = len(results) or 1
    return RetrievalReport(
        scope=scope,
        k=k,
        questions=len(results),
        recall=sum(r.recall for r in results) / n,
        ndcg=sum(r.ndcg for r in results) / n,
        paper_hit_rate=sum(r.paper_hit for r in results) / n,
        median_ms=1000 * median(r.seconds for r in results) if results else 0.0,
        results=results,
    )
