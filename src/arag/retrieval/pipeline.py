"""The retrieval pipeline for one query or a compound question's sub-queries: hybrid search (with
paper resolution), then the rerank stage. What ``arag search`` shows and the agent calls."""

from __future__ import annotations

import time
from collections.abc import Sequence

from pydantic import BaseModel

from arag.index.store import Store
from arag.llm.base import LLM
from arag.models.reranker import Reranker
from arag.records import RankedChunk, RankedPaper, ScoredChunk, SearchFilter
from arag.retrieval.hybrid import HybridResult, HybridRetriever
from arag.retrieval.papers import rank_papers
from arag.retrieval.rerank import RerankStage
from arag.retrieval.strategies import Expanded, QueryStrategy, make_strategy
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
    # What the query strategy generated and searched with (multi-query: the rewrites searched beside
    # the question; hyde: the hypothetical passage); empty for plain search.
    expansion: list[str] = []
    # Why a strategy searched the question alone (an unusable or failed LLM reply); empty otherwise.
    expansion_note: str = ""
    # For a question that names no paper: the papers ranked, each with its best passages (empty when
    # the question named a paper or the search was restricted to papers).
    papers: list[RankedPaper] = []


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
    """Hybrid search + rerank; thread-safe for concurrent sub-queries. With a query ``strategy``
    (multi-query, HyDE) each query is expanded through it; the reranker still reads the question."""

    def __init__(
        self, hybrid: HybridRetriever, stage: RerankStage, strategy: QueryStrategy | None = None
    ) -> None:
        self.hybrid = hybrid
        self.stage = stage
        self.strategy = strategy

    def search(self, query: str, flt: SearchFilter | None = None) -> SearchResult:
        """Retrieve and rerank for one query; the reranker reads the question as asked."""
        if self.strategy is not None:
            return self.search_many([query], flt)[0]
        t0 = time.perf_counter()
        hybrid = self.hybrid.search(query, flt)
        return self._rerank(query, hybrid, 1000 * (time.perf_counter() - t0))

    def search_many(
        self, queries: Sequence[str], flt: SearchFilter | None = None, *, concurrent: bool = True
    ) -> list[SearchResult]:
        """Sub-queries embedded in one batch and searched concurrently, each reranked."""
        t0 = time.perf_counter()
        if self.strategy is not None:
            expanded = self.strategy.search_many(self.hybrid, queries, flt, concurrent=concurrent)
            # Search time without the LLM's: the generation has its own timing.
            spent = 1000 * (time.perf_counter() - t0) - sum(e.expand_ms for e in expanded)
            ms = max(0.0, spent) / max(1, len(queries))
            return [self._rerank(q, e.hybrid, ms, e) for q, e in zip(queries, expanded, strict=True)]
        multi = self.hybrid.search_many(queries, flt, concurrent=concurrent)
        ms = 1000 * (time.perf_counter() - t0) / max(1, len(queries))
        return [self._rerank(q, r, ms) for q, r in zip(queries, multi.per_query, strict=True)]

    def abstract_matches(self, query: str, flt: SearchFilter | None = None) -> list[ScoredChunk]:
        """Every abstract holding one of the query's BM25 terms (see ``HybridRetriever``)."""
        return self.hybrid.abstract_matches(query, flt)

    def paper_count(self) -> int:
        """How many papers the library holds."""
        return self.hybrid.paper_count()

    def _rerank(
        self, query: str, hybrid: HybridResult, search_ms: float, expanded: Expanded | None = None
    ) -> SearchResult:
        rr = self.stage.run(query, hybrid.fused, found_by(hybrid))
        timings = {"search": round(search_ms, 2), "rerank": round(rr.rerank_ms, 2)}
        if expanded is not None:
            timings["expand"] = round(expanded.expand_ms, 2)
        papers: list[RankedPaper] = []
        if hybrid.pool is not None:
            t0 = time.perf_counter()
            reranker = self.stage.reranker
            # The passage stage's scores, unless the service installed a new model in between.
            scored = (
                {c.chunk.id: c.rerank_score for c in rr.ranked if c.rerank_score is not None}
                if reranker.name == rr.model
                else {}
            )
            papers = rank_papers(query, hybrid.pool, reranker, self.hybrid.settings, scored)
            timings["papers"] = round(1000 * (time.perf_counter() - t0), 2)
        return SearchResult(
            hybrid=hybrid,
            ranked=rr.ranked,
            kept=rr.kept,
            model=rr.model,
            timings=timings,
            expansion=expanded.expansion if expanded is not None else [],
            expansion_note=expanded.note if expanded is not None else "",
            papers=papers,
        )


def make_reranking_retriever(
    settings: Settings,
    store: Store,
    hybrid: HybridRetriever,
    reranker: Reranker | None = None,
    llm: LLM | None = None,
) -> Retriever:
    """A Retriever over an open store: the configured reranker, canonical papers and MMR vectors, and
    the configured query strategy (which needs ``llm`` unless it is plain: ConfigError without one)."""
    from arag.models.reranker import get_reranker

    # Before loading the reranker: a strategy without an LLM fails at once.
    strategy = make_strategy(settings.retrieval, llm)
    stage = RerankStage(
        reranker or get_reranker(settings),
        settings.rerank,
        canonical=load_canonical(settings),
        vectors=store.get_vectors,
    )
    return Retriever(hybrid, stage, strategy)
