"""Retrieval latency: per-stage medians after a warm-up, 1 vs 3 sub-queries, sequential vs
concurrent, and cold start. Query vectors are computed by the model every time (no cache)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from arag.index.sparse import BM25Encoder
from arag.records import SearchFilter
from arag.retrieval.fusion import fuse_chunks
from arag.settings import Settings


class RetrievalBench(BaseModel):
    queries: int
    warmup: int
    stage_ms: dict[str, float]  # medians per query
    reranker: str
    rerank_candidates: float  # median candidates per query
    one_query_ms: float
    # The question searched across the library: hybrid, then the fused candidates and the top
    # papers' passages reranked.
    one_query_reranked_ms: float
    # The same question with its paper resolved from the title: that paper's candidates only.
    one_named_query_reranked_ms: float
    three_sequential_ms: float
    three_concurrent_ms: float
    concurrent_speedup: float
    index_open_ms: float
    model_load_ms: float
    reranker_load_ms: float
    cold_start_ms: float


def _median_ms(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def run_retrieval_bench(settings: Settings, questions: Sequence[str], *, warmup: int = 10) -> RetrievalBench:
    """Time each stage over ``questions`` (medians), then whole searches and a cold start."""
    from arag.library.manage import open_retrieval
    from arag.models.factory import library_embedder
    from arag.models.reranker import get_reranker, pair_text
    from arag.retrieval.pipeline import make_reranking_retriever

    t0 = time.perf_counter()
    embedder = library_embedder(settings, cached=False)  # every query runs the model
    model_load_ms = 1000 * (time.perf_counter() - t0)
    # The library's open for retrieval: the build state (checked, papers read) and the index.
    t0 = time.perf_counter()
    retrieval = open_retrieval(settings, embedder=embedder)
    index_open_ms = 1000 * (time.perf_counter() - t0)
    store = retrieval.store
    try:
        t0 = time.perf_counter()
        reranker = get_reranker(settings)
        reranker_load_ms = 1000 * (time.perf_counter() - t0)
        s = settings.retrieval
        bm25 = BM25Encoder()
        retriever = retrieval.plain
        for q in questions[:warmup]:
            retriever.search(q)
        # The latency of the retrieval itself: the plain query (multi-query / HyDE add LLM time).
        plain = settings.model_copy(
            update={"retrieval": settings.retrieval.model_copy(update={"strategy": "plain"})}
        )
        full = make_reranking_retriever(plain, store, retriever, reranker)
        named = make_reranking_retriever(plain, store, retrieval.hybrid, reranker)
        stages: dict[str, list[float]] = {k: [] for k in ("embed", "dense", "sparse", "fuse", "rerank")}
        pool: list[int] = []
        for q in questions:
            t0 = time.perf_counter()
            vec = embedder.embed_batch([q])[0]
            t1 = time.perf_counter()
            a = store.dense_search(vec, s.abstract_k, SearchFilter(types=["abstract"]))
            p = store.dense_search(vec, s.passage_k, SearchFilter(types=["passage", "table"]))
            t2 = time.perf_counter()
            b = store.sparse_search(bm25.encode_query(q), s.bm25_k)
            t3 = time.perf_counter()
            fused = fuse_chunks([a, p, b], k=s.rrf_k, limit=s.fused_k)
            t4 = time.perf_counter()
            reranker.score(q, [pair_text(h.chunk) for h in fused])
            t5 = time.perf_counter()
            pool.append(len(fused))
            for name, dt in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                stages[name].append(1000 * dt)
        triples = [list(questions[i : i + 3]) for i in range(0, len(questions) - 2, 3)]
        runs = len(triples)
        it1 = iter(questions)
        one = _median_ms(lambda: retriever.search(next(it1)), runs)
        it2 = iter(questions)
        one_rr = _median_ms(lambda: full.search(next(it2)), runs)
        it3 = iter(questions)
        one_named = _median_ms(lambda: named.search(next(it3)), runs)
        seq_iter, con_iter = iter(triples), iter(triples)
        seq = _median_ms(lambda: retriever.search_many(next(seq_iter), concurrent=False), runs)
        con = _median_ms(lambda: retriever.search_many(next(con_iter), concurrent=True), runs)
    finally:
        retrieval.close()
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "arag", "search", questions[0], "--json", "-k", "1"],
        capture_output=True,
        text=True,
    )
    cold_ms = 1000 * (time.perf_counter() - t0)
    if proc.returncode != 0:
        raise RuntimeError(f"cold-start search failed: {proc.stderr[-500:]}")
    return RetrievalBench(
        queries=len(questions),
        warmup=warmup,
        stage_ms={k: statistics.median(v) for k, v in stages.items()},
        reranker=reranker.name,
        rerank_candidates=statistics.median(pool) if pool else 0.0,
        one_query_ms=one,
        one_query_reranked_ms=one_rr,
        one_named_query_reranked_ms=one_named,
        three_sequential_ms=seq,
        three_concurrent_ms=con,
        concurrent_speedup=seq / con if con else float("nan"),
        index_open_ms=index_open_ms,
        model_load_ms=model_load_ms,
        reranker_load_ms=reranker_load_ms,
        cold_start_ms=cold_ms,
    )
