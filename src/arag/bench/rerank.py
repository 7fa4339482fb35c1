"""Reranker speed against quality: the installed model at several input lengths, on the same
validation candidate lists, with the fused order as the baseline. What each speed-up costs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from arag.settings import Settings


class LengthRun(BaseModel):
    max_length: int
    # The final score (model + fusion weight * -ln rank), as search ranks; and the model alone.
    ndcg10: float
    recall10: float
    model_ndcg10: float
    median_ms: float
    p90_ms: float


class RerankBench(BaseModel):
    model: str
    questions: int
    candidates_median: float
    trained_max_length: int
    fused_ndcg10: float
    fused_recall10: float
    runs: list[LengthRun]


def run_rerank_bench(
    settings: Settings,
    questions_path: Path,
    lengths: Sequence[int],
    *,
    limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    start: Callable[[int], None] | None = None,
) -> RerankBench:
    """Score every question's library-wide fused list with the installed model at each length."""
    from arag.corpus.qasper_questions import load_questions
    from arag.library.manage import open_retrieval
    from arag.models.reranker import OnnxReranker
    from arag.train.calibrate import combined_scores
    from arag.train.data import candidates_for
    from arag.train.metrics import rank_metrics

    qs = load_questions(questions_path, limit=limit)
    with open_retrieval(settings) as retrieval:
        resolving = retrieval.hybrid
        cands = [candidates_for(q, resolving) for q in qs]
    if start:
        start(len(cands) * len(lengths))
    baseline = rank_metrics(cands, [-np.arange(len(c.texts), dtype=np.float32) for c in cands])
    runs = []
    trained = None
    name = ""
    for length in lengths:
        model = OnnxReranker(settings.reranker_dir, threads=settings.rerank.threads, max_length=length)
        trained, name = model.card.max_length, model.name
        model.score(cands[0].query, cands[0].texts)  # warm-up
        scores, times = [], []
        for c in cands:
            t0 = time.perf_counter()
            scores.append(model.score(c.query, c.texts))
            times.append(1000 * (time.perf_counter() - t0))
            if progress:
                progress(1)
        m = rank_metrics(cands, combined_scores(scores, model.fusion_weight))
        alone = rank_metrics(cands, scores)
        runs.append(
            LengthRun(
                max_length=length,
                ndcg10=m["ndcg@10"],
                recall10=m["recall@10"],
                model_ndcg10=alone["ndcg@10"],
                median_ms=statistics.median(times),
                p90_ms=float(np.quantile(times, 0.9)),
            )
        )
    return RerankBench(
        model=name,
        questions=len(cands),
        candidates_median=statistics.median(len(c.texts) for c in cands),
        trained_max_length=trained or 0,
        fused_ndcg10=baseline["ndcg@10"],
        fused_recall10=baseline["recall@10"],
        runs=runs,
    )
