"""Reranking the fused candidates, and deciding which of them are kept as evidence.

The rules (pure functions, unit-tested):
- Final score: the model's score plus ``fusion_weight * -ln(fused rank)`` (the weight is fit on
  QASPER validation and stored in the model card; 0 means the model alone orders).
- Canonical floor: a chunk of a canonical paper that the fusion put in its top ``supported_rank``
  has its score raised to the lower bar, never lowered, so a small model cannot drop it.
- Bars: a candidate from fused ranks 1..``supported_rank`` is kept when it clears the lower bar;
  one from further down needs the upper bar (a high score with no upstream support is usually a
  keyword coincidence). At most ``keep`` chunks, best first. If none clears its bar, only the
  single best chunk is kept, and only if it clears the lower bar; otherwise nothing.
- Without bars (no reranker, or an uncalibrated hub model) the first ``keep`` are kept.
- Optional MMR (lambda 0.7) over the reranked list pushes near-duplicate chunks of one paper down.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel

from arag.models.reranker import Bars, Reranker, pair_text
from arag.records import RankedChunk, ScoredChunk
from arag.retrieval.mmr import mmr_order
from arag.settings import RerankSettings


def floor_canonical(
    scores: Sequence[float],
    fused_ranks: Sequence[int],
    canonical: Sequence[bool],
    lower: float,
    supported_rank: int = 10,
) -> tuple[list[float], list[bool]]:
    """Scores with canonical, upstream-supported candidates raised to ``lower``; and which were raised."""
    out: list[float] = []
    raised: list[bool] = []
    for s, r, c in zip(scores, fused_ranks, canonical, strict=True):
        lift = c and r <= supported_rank and s < lower
        out.append(lower if lift else float(s))
        raised.append(lift)
    return out, raised


def select_kept(
    scores: Sequence[float],
    fused_ranks: Sequence[int],
    bars: Bars | None,
    *,
    keep: int = 8,
    supported_rank: int = 10,
) -> list[int]:
    """Indices of the candidates kept as evidence, best score first (ties: better fused rank)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], fused_ranks[i]))
    if bars is None:
        return order[:keep]
    clears = [
        i for i in order if scores[i] >= (bars.lower if fused_ranks[i] <= supported_rank else bars.upper)
    ]
    if clears:
        return clears[:keep]
    if order and scores[order[0]] >= bars.lower:
        return order[:1]
    return []


def combine(scores: Sequence[float] | np.ndarray, fused_ranks: Sequence[int], weight: float) -> list[float]:
    """The final score: the model's score plus ``weight * -ln(fused rank)``. A small cross-encoder is
    noisy; the hybrid search's own order is strong evidence, and this keeps part of it."""
    return [float(s) - weight * math.log(r) for s, r in zip(scores, fused_ranks, strict=True)]


class RerankResult(BaseModel):
    """The candidates in reranked order, the ones kept as evidence, and the time the model took."""

    ranked: list[RankedChunk]
    kept: list[RankedChunk]
    model: str
    rerank_ms: float


class RerankStage:
    """Scores the fused candidates with a reranker and applies the floor, bars and MMR."""

    def __init__(
        self,
        reranker: Reranker,
        settings: RerankSettings,
        *,
        canonical: set[str] | None = None,
        vectors: Callable[[Sequence[str]], np.ndarray] | None = None,
    ) -> None:
        self.reranker = reranker
        self.settings = settings
        self.canonical = canonical or set()
        # Chunk id -> dense vector lookup, needed only for MMR.
        self.vectors = vectors

    def run(
        self, query: str, fused: Sequence[ScoredChunk], found_by: dict[str, list[str]] | None = None
    ) -> RerankResult:
        """Rerank ``fused`` (best first) for ``query``."""
        s = self.settings
        found_by = found_by or {}
        # Read once: the service may install a newly trained model while this search runs.
        reranker = self.reranker
        identity = reranker.name == "none"
        t0 = time.perf_counter()
        raw = (
            reranker.score(query, [pair_text(h.chunk) for h in fused])
            if fused and not identity
            else np.zeros(0)
        )
        rerank_ms = 1000 * (time.perf_counter() - t0)
        ranks = list(range(1, len(fused) + 1))
        if identity:
            # No model: the fused score is the score, the fused order the order.
            scores = [h.score for h in fused]
            raised = [False] * len(fused)
        else:
            scores = combine(raw, ranks, reranker.fusion_weight)
            raised = [False] * len(fused)
            bars = reranker.bars
            if bars is not None and self.canonical:
                is_canon = [h.chunk.paper_id in self.canonical for h in fused]
                scores, raised = floor_canonical(scores, ranks, is_canon, bars.lower, s.supported_rank)
        cands = [
            RankedChunk(
                chunk=h.chunk,
                score=scores[i],
                source="reranked" if not identity else "fused",
                fused_rank=ranks[i],
                fused_score=h.score,
                rerank_score=None if identity else float(raw[i]),
                floored=raised[i],
                found_by=found_by.get(h.chunk.id, []),
            )
            for i, h in enumerate(fused)
        ]
        order = sorted(range(len(cands)), key=lambda i: (-scores[i], ranks[i]))
        if s.mmr and self.vectors is not None and len(order) > 1:
            vecs = self.vectors([cands[i].chunk.id for i in order])
            rel = [scores[i] for i in order]
            groups = [cands[i].chunk.paper_id for i in order]
            order = [order[j] for j in mmr_order(rel, vecs, groups, lam=s.mmr_lambda)]
        ranked = [cands[i] for i in order]
        bars = None if identity else reranker.bars
        # Which candidates clear their bar, then the first ``keep`` of them in the ranked order: with
        # MMR that order has pushed near-duplicates down, so they give way to other evidence.
        clearing = select_kept(
            [c.score for c in ranked],
            [c.fused_rank for c in ranked],
            bars,
            keep=len(ranked),
            supported_rank=s.supported_rank,
        )
        kept = [ranked[j] for j in sorted(clearing)][: s.keep]
        return RerankResult(ranked=ranked, kept=kept, model=reranker.name, rerank_ms=rerank_ms)
