"""The retriever node: the retrieval pipeline for each pending sub-query, concurrently, keeping only
chunks no earlier query kept (deduplicated by chunk id), plus the papers closest to the question."""

from __future__ import annotations

from arag.agent.deps import AgentDeps
from arag.agent.state import AgentState, Evidence, QueryOutcome, Step
from arag.records import PaperHit
from arag.retrieval.pipeline import SearchResult

# Ranked candidates per sub-query that count towards the closest papers.
CLOSEST_DEPTH = 10


def closest_papers(results: list[SearchResult], previous: list[PaperHit], k: int) -> list[PaperHit]:
    """The ``k`` papers whose best candidate scored highest (over this pass and earlier ones)."""
    best: dict[str, PaperHit] = {p.paper_id: p for p in previous}
    for r in results:
        for c in r.ranked[:CLOSEST_DEPTH]:
            pid = c.chunk.paper_id
            if pid not in best or c.score > best[pid].score:
                best[pid] = PaperHit(paper_id=pid, title=c.chunk.title, score=round(c.score, 4))
    return sorted(best.values(), key=lambda p: (-p.score, p.paper_id))[:k]


def make_retriever(deps: AgentDeps):
    """The retriever node."""
    settings = deps.settings

    def retriever(state: AgentState) -> Step:
        queries = list(state.get("pending", []))
        targets = list(state.get("pending_targets", queries))
        pass_index = state.get("passes", 0)
        results = deps.retriever.search_many(queries, state.get("flt"), concurrent=settings.concurrent)
        seen = {e.chunk.id for e in state.get("evidence", [])}
        evidence: list[Evidence] = []
        outcomes: list[QueryOutcome] = []
        for query, target, r in zip(queries, targets, results, strict=True):
            new = 0
            for rank, c in enumerate(r.kept, start=1):
                if c.chunk.id in seen:
                    continue
                seen.add(c.chunk.id)
                new += 1
                evidence.append(
                    Evidence(
                        chunk=c.chunk,
                        score=c.score,
                        rerank_score=c.rerank_score,
                        query=query,
                        pass_index=pass_index,
                        rank=rank,
                    )
                )
            outcomes.append(
                QueryOutcome(
                    query=query,
                    target=target,
                    pass_index=pass_index,
                    kept=len(r.kept),
                    new=new,
                    best_score=round(r.kept[0].score, 4) if r.kept else None,
                )
            )
        resolved = next((r.hybrid.resolved for r in results if r.hybrid.resolved is not None), None)
        update = {
            "sub_queries": queries,
            "evidence": evidence,
            "outcomes": outcomes,
            "passes": pass_index + 1,
            "pending": [],
            "pending_targets": [],
            "resolved": resolved if resolved is not None else state.get("resolved"),
            "closest": closest_papers(results, state.get("closest", []), settings.closest_papers),
        }
        kept = sum(o.kept for o in outcomes)
        empty = sum(o.kept == 0 for o in outcomes)
        noun = "queries" if len(queries) > 1 else "query"
        decision = f"pass {pass_index + 1}: {len(queries)} {noun}, {len(evidence)} new chunks"
        if empty:
            decision += f", {empty} with no evidence"
        if resolved is not None:
            decision += f"; scoped to {resolved.paper_id}"
        search_ms = sum(r.timings.get("search", 0.0) + r.timings.get("rerank", 0.0) for r in results)
        return Step(
            update,
            decision,
            {
                "queries": len(queries),
                "kept": kept,
                "new": len(evidence),
                "empty": empty,
                "search_ms": round(search_ms, 1),
            },
        )

    return retriever
