"""Reciprocal Rank Fusion (Cormack et al., SIGIR 2009): fuse ranked lists on rank, never on score.

The one implementation, used wherever lists are fused (dense + BM25, multi-query variants).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

from arag.records import ScoredChunk

K = TypeVar("K", bound=Hashable)

RRF_K = 60


def rrf_scores(rankings: Sequence[Sequence[K]], k: int = RRF_K) -> list[tuple[K, float]]:
    """Fused (key, score) pairs, best first: score = sum over lists of 1 / (k + rank), rank from 1.

    A key repeated within one list counts at its best rank only. Ties are broken by the best
    single rank, then by first appearance (list order, then position), so the result is
    deterministic whatever the input.
    """
    if k < 0:
        raise ValueError(f"RRF k must be >= 0, got {k}")
    score: dict[K, float] = {}
    best: dict[K, int] = {}
    first: dict[K, tuple[int, int]] = {}
    for li, ranking in enumerate(rankings):
        seen: set[K] = set()
        for pos, key in enumerate(ranking):
            if key in seen:
                continue
            seen.add(key)
            rank = pos + 1
            score[key] = score.get(key, 0.0) + 1.0 / (k + rank)
            best[key] = min(best.get(key, rank), rank)
            first.setdefault(key, (li, pos))
    return sorted(score.items(), key=lambda kv: (-kv[1], best[kv[0]], first[kv[0]]))


def fuse_chunks(
    lists: Sequence[Sequence[ScoredChunk]], k: int = RRF_K, limit: int | None = None
) -> list[ScoredChunk]:
    """RRF over lists of scored chunks (keyed by chunk id); the fused score replaces the scores."""
    by_id: dict[str, ScoredChunk] = {}
    for hits in lists:
        for hit in hits:
            by_id.setdefault(hit.chunk.id, hit)
    fused = rrf_scores([[h.chunk.id for h in hits] for hits in lists], k)
    if limit is not None:
        fused = fused[:limit]
    return [ScoredChunk(chunk=by_id[cid].chunk, score=s, source="fused") for cid, s in fused]
