"""The retrieval pipeline for one query or a compound question's sub-queries: hybrid search (with
paper resolution), then the rerank stage. What ``arag search`` shows and the agent calls."""

from __future__ import annotations

import time
from collections.abc import Sequence

from pydantic import BaseModel

from arag.index.store import Store
from arag.models.reranker import Reranker
from arag.records import RankedChunk, SearchFilter
from arag.retrieval.hybrid import HybridResult, HybridRetriever
from arag.retrieval.rerank import RerankStage
from arag.settings import Settings

# Names of the three searches, as shown in `found_by` and `--explain`.
SEARCHES = ("abstracts", "passages", "bm25")


class SearchResult(BaseModel):
    """One query's hybrid lists, the reranked candidates, the kept evidence and stage timings (ms)."""

    hybrid: HybridResult
    ranked: list[RankedChunk]
    kept: list[RankedChunk]
    model: str
    timings: dict[str, float]


def found_by(result: HybridResult) -> dict[str, list[str]]:
    """For each chunk id in the fused list, which searches returned it."""
    lists = dict(zip(SEARCHES, (result.dense_abstracts, result.dense_passages, result.bm25), strict=True))
    out: dict[str, list[str]] = {}
    for name, hits in lists.items():
        for h in hits:
            out.setdefault(h.chunk.id, []).append(name)
    return out


def load_canonical(settings: Settings) -> set[str]:
    """Ids of the papers marked canonical in the configured arXiv manifest (none if unset)."""
    path = settings.rerank.canonical_manifest
    if path is None:
        return set()
    from arag.corpus.manifest import read_manifest

    return {e.id for e in read_manifest(path).entries if e.canonical}


class Retriever:
    """Hybrid search + rerank; thread-safe for concurrent sub-queries."""

    def __init__(self, hybrid: HybridRetriever, stage: RerankStage) -> None:
        self.hybrid = hybrid
        self.stage = stage

    def search(self, query: str, flt: SearchFilter | None = None) -> SearchResult:
        """Retrieve and rerank for one query; the reranker reads the question as asked."""
        t0 = time.perf_counter()
        hybrid = self.hybrid.search(query, flt)
        return self._rerank(query, hybrid, 1000 * (time.perf_counter() - t0))

    def search_many(
        self, queries: Sequence[str], flt: SearchFilter | None = None, *, concurrent: bool = True
    ) -> list[SearchResult]:
        """Sub-queries embedded in one batch and searched concurrently, each reranked."""
        t0 = time.perf_counter()
        multi = self.hybrid.search_many(queries, flt, concurrent=concurrent)
        ms = 1000 * (time.perf_counter() - t0) / max(1, len(queries))
        return [self._rerank(q, r, ms) for q, r in zip(queries, multi.per_query, strict=True)]

    def _rerank(self, query: str, hybrid: HybridResult, search_ms: float) -> SearchResult:
        rr = self.stage.run(query, hybrid.fused, found_by(hybrid))
        return SearchResult(
            hybrid=hybrid,
            ranked=rr.ranked,
            kept=rr.kept,
            model=rr.model,
            timings={"search": round(search_ms, 2), "rerank": round(rr.rerank_ms, 2)},
        )


def make_retriever(
    settings: Settings, store: Store, hybrid: HybridRetriever, reranker: Reranker | None = None
) -> Retriever:
    """A Retriever over an open store: the configured reranker, canonical papers and MMR vectors."""
    from arag.models.reranker import get_reranker

    stage = RerankStage(
        reranker or get_reranker(settings),
        settings.rerank,
        canonical=load_canonical(settings),
        vectors=store.get_vectors,
    )
    return Retriever(hybrid, stage)
