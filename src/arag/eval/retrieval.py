"""Retrieval evaluation on QASPER: do the gold evidence paragraphs reach the top of the list?

Units are the gold evidence paragraphs (text evidence only; "FLOAT SELECTED" captions are not in
the corpus). A retrieved chunk *hits* a gold paragraph when it contains one of the paragraph's
sentences (of at least ``MIN_SENTENCE_CHARS``), after whitespace and case normalisation: chunks are
sentence-aligned, so a paragraph cut across chunks is hit by each chunk holding part of it.

- Recall@k (k = 5, 10, 20): share of a question's gold paragraphs hit by the top k chunks.
- nDCG@k: binary gain at rank i when the chunk hits a gold paragraph not hit higher up; the ideal
  ranking hits one new gold paragraph per rank, min(k, |gold|) of them.
- MRR@10: reciprocal rank of the first chunk that hits any gold paragraph (0 if none in the top 10).
- Paper@5: the gold paper is among the top 5 chunks' papers.

Means come with 95% bootstrap confidence intervals (2,000 resamples of the questions, fixed seed).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from statistics import median
from typing import Literal

import numpy as np
from pydantic import BaseModel

from arag.corpus.qasper_questions import EvalQuestion, library_query
from arag.errors import InputError
from arag.ingest.splitter import split_sentences
from arag.records import ScoredChunk, SearchFilter

MIN_SENTENCE_CHARS = 20
Scope = Literal["library", "paper"]


def check_limit(limit: int | None) -> None:
    """An InputError for a ``--limit`` below 1."""
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}", where="--limit", fix="pass N >= 1")


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


def mrr_at(hits: Sequence[set[int]], k: int) -> float:
    """Reciprocal rank of the first of the top k chunks that hits a gold paragraph."""
    for rank, h in enumerate(hits[:k], 1):
        if h:
            return 1.0 / rank
    return 0.0


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (resampling the questions with replacement)."""
    if not values:
        return 0.0, 0.0
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    alpha = (1.0 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


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


METRICS = ("recall@5", "recall@10", "recall@20", "ndcg@10", "mrr@10", "paper@5")


class QuestionResult(BaseModel):
    question_id: str
    metrics: dict[str, float]
    seconds: float


class Metric(BaseModel):
    """A mean over the questions and its 95% bootstrap interval."""

    mean: float
    lo: float
    hi: float


class RetrievalReport(BaseModel):
    """Mean figures (with CIs) over the questions, and the per-question results."""

    scope: Scope
    questions: int
    skipped_no_evidence: int = 0
    metrics: dict[str, Metric]
    median_ms: float
    results: list[QuestionResult]


SearchFn = Callable[[str, SearchFilter | None], list[ScoredChunk]]


def evaluate_retrieval(
    search: SearchFn,
    questions: Sequence[EvalQuestion],
    *,
    scope: Scope = "library",
    skipped: int = 0,
    progress: Callable[[int], None] | None = None,
) -> RetrievalReport:
    """Run every question through ``search`` and score its top chunks (see the module doc)."""
    results: list[QuestionResult] = []
    for q in questions:
        if scope == "paper":
            query, flt = q.question, SearchFilter(paper_ids=[q.paper_id])
        else:
            query, flt = library_query(q), None
        t0 = time.perf_counter()
        ranked = search(query, flt)
        dt = time.perf_counter() - t0
        hits = hits_per_rank([h.chunk.text for h in ranked[:20]], q.evidence)
        n = len(q.evidence)
        metrics = {
            "recall@5": recall_at(hits, n, 5),
            "recall@10": recall_at(hits, n, 10),
            "recall@20": recall_at(hits, n, 20),
            "ndcg@10": ndcg_at(hits, n, 10),
            "mrr@10": mrr_at(hits, 10),
            "paper@5": float(any(h.chunk.paper_id == q.paper_id for h in ranked[:5])),
        }
        results.append(QuestionResult(question_id=q.question_id, metrics=metrics, seconds=dt))
        if progress:
            progress(1)
    summary = {}
    for name in METRICS:
        values = [r.metrics[name] for r in results]
        lo, hi = bootstrap_ci(values)
        summary[name] = Metric(mean=float(np.mean(values)) if values else 0.0, lo=lo, hi=hi)
    return RetrievalReport(
        scope=scope,
        questions=len(results),
        skipped_no_evidence=skipped,
        metrics=summary,
        median_ms=1000 * median(r.seconds for r in results) if results else 0.0,
        results=results,
    )
