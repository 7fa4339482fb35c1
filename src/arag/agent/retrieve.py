"""The retriever node: the retrieval pipeline for each pending sub-query, concurrently, keeping only
chunks no earlier query kept (deduplicated by chunk id), plus the papers closest to the question."""

from __future__ import annotations

import re

from arag.agent.answer_type import strip_lead
from arag.agent.count import count_question, count_sentence, library_count
from arag.agent.deps import AgentDeps
from arag.agent.literature import addressing_parts, refers_to_its_paper
from arag.agent.state import AgentState, Evidence, QueryOutcome, QueryPapers, Step
from arag.agent.terms import key_terms
from arag.records import PaperHit, RankedChunk, RankedPaper, SearchFilter
from arag.retrieval.pipeline import SearchResult

NAMES_ID = re.compile(r"(?<![\d.])\d{4}\.\d{4,5}(?:v\d+)?(?!\d)")
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


def wants_abstract(query: str, result: SearchResult) -> bool:
    """Whether the question asks about its named paper as a whole ("what is the main finding of
    '<title>'?": no key term beyond the title). The abstract answers such a question, and a passage
    reranker has no terms to rank it by."""
    resolved = result.hybrid.resolved
    return resolved is not None and not key_terms(strip_lead(resolved.remainder(query)))


def with_abstract(kept: list[RankedChunk], candidates: list[RankedChunk]) -> list[RankedChunk]:
    """``kept`` with the first abstract among ``candidates`` in front (once)."""
    abstract = next((c for c in candidates if c.chunk.type == "abstract"), None)
    if abstract is None or any(c.chunk.id == abstract.chunk.id for c in kept):
        return kept
    return [abstract, *kept]


def papers_of(result: SearchResult) -> list[RankedPaper]:
    """A result's ranked papers; for a search scoped to a paper (which ranks none), the papers of its
    kept chunks, in order, so every part of an open question has papers to answer from."""
    if result.papers:
        return list(result.papers)
    by_paper: dict[str, list[RankedChunk]] = {}
    for c in result.kept:
        by_paper.setdefault(c.chunk.paper_id, []).append(c)
    return [
        RankedPaper(
            paper_id=pid,
            title=chunks[0].chunk.title,
            rank=i,
            score=chunks[0].score,
            passage_hits=len(chunks),
            best_rerank=chunks[0].rerank_score,
            passages=chunks,
        )
        for i, (pid, chunks) in enumerate(by_paper.items(), start=1)
    ]


def is_literature(state: AgentState, results: list[SearchResult]) -> bool:
    """Whether the question is answered across papers: it named no paper (the first pass ranked papers
    for it) and is not a yes/no question about one. Decided on the first pass, kept on the retry."""
    if state.get("passes", 0) > 0:
        return bool(state.get("literature", False))
    flt = state.get("flt")
    if flt is not None and flt.paper_ids is not None:
        return False
    if NAMES_ID.search(state.get("question", "")):
        return False  # it names a paper by id, one the library lacks: not a question about many
    return state.get("answer_type") != "yes_no" and any(r.papers for r in results)


def first_part_paper(state: AgentState, rankings: list[QueryPapers], min_ratio: float) -> str | None:
    """The best paper that addresses the first part of an open question: from this pass's ranking for
    it, else from the last grade (a retry searches only the parts that had no paper)."""
    plan = list(state.get("plan", []))
    if any(r.target == plan[0] for r in rankings):
        evidence = [
            Evidence(chunk=c.chunk, score=c.score, rerank_score=c.rerank_score, query=r.query,
                     pass_index=r.pass_index, rank=j)
            for r in rankings if r.target == plan[0]
            for j, c in enumerate((c for p in r.papers for c in p.passages), start=1)
        ]  # fmt: skip
        ids = addressing_parts(plan[:1], rankings, evidence, per_part=1, min_ratio=min_ratio)[0].paper_ids
        return ids[0] if ids else None
    grade = state.get("grade")
    if grade is not None and grade.parts and grade.parts[0].paper_ids:
        return grade.parts[0].paper_ids[0]
    return None


def search_pass(
    deps: AgentDeps, state: AgentState, queries: list[str], targets: list[str]
) -> tuple[list[SearchResult], str | None, list[int]]:
    """Each query's search, in query order. A part about the one paper the first part of an open
    question asks for is searched after the others, in that paper alone (returned, with the parts')
    indexes); every other query in the state's filter."""
    settings = deps.settings
    plan = list(state.get("plan", []))
    later = [i for i, t in enumerate(targets) if plan and t != plan[0] and refers_to_its_paper(plan[0], t)]
    first = [i for i in range(len(queries)) if i not in later]
    flt = state.get("flt")
    found = deps.retriever.search_many([queries[i] for i in first], flt, concurrent=settings.concurrent)
    by_index = dict(zip(first, found, strict=True))
    scoped_to: str | None = None
    if later:
        # A retry may search only later parts: whether the question is literature was decided before.
        literature = is_literature(state, found) if found else bool(state.get("literature", False))
        if literature:
            pass_index = state.get("passes", 0)
            ranked = [
                QueryPapers(query=queries[i], target=targets[i], pass_index=pass_index, papers=papers_of(r))
                for i, r in by_index.items()
            ]
            scoped_to = first_part_paper(state, ranked, settings.literature_min_score)
        if scoped_to is not None:
            flt = SearchFilter(paper_ids=[scoped_to])
        rest = deps.retriever.search_many([queries[i] for i in later], flt, concurrent=settings.concurrent)
        for i, r in zip(later, rest, strict=True):
            if scoped_to is not None and not r.kept:
                # Its paper is the part's subject whatever the bars say: its best passages.
                r = r.model_copy(update={"kept": list(r.ranked[: settings.literature_passages])})
            by_index[i] = r
    return [by_index[i] for i in range(len(queries))], scoped_to, later


def make_retrieval_node(deps: AgentDeps):
    """The graph's retriever node: it searches the pending queries through ``deps.retriever`` (it
    makes no retriever) and adds the passages not seen yet as evidence."""
    settings = deps.settings

    def retriever(state: AgentState) -> Step:
        queries = list(state.get("pending", []))
        targets = list(state.get("pending_targets", queries))
        pass_index = state.get("passes", 0)
        results, scoped_to, later = search_pass(deps, state, queries, targets)
        kept_lists = [list(r.kept) for r in results]
        for i, (query, r) in enumerate(zip(queries, results, strict=True)):
            if wants_abstract(query, r):
                resolved = r.hybrid.resolved
                assert resolved is not None
                candidates = list(r.ranked)
                if not any(c.chunk.type == "abstract" for c in candidates):
                    only = SearchFilter(paper_ids=[resolved.paper_id], types=["abstract"])
                    candidates = deps.retriever.search_many([resolved.title], only)[0].ranked
                kept_lists[i] = with_abstract(kept_lists[i], candidates)
        literature = is_literature(state, results)
        rankings: list[QueryPapers] = []
        if literature:
            # Each paper's best passages are the evidence (an open question's papers rarely clear bars
            # calibrated on one-paper questions; the grader decides which papers address it).
            for i, (query, target, r) in enumerate(zip(queries, targets, results, strict=True)):
                papers = papers_of(r)
                rankings.append(QueryPapers(query=query, target=target, pass_index=pass_index, papers=papers))
                kept_lists[i] = [c for p in papers for c in p.passages]
        seen = {e.chunk.id for e in state.get("evidence", [])}
        evidence: list[Evidence] = []
        outcomes: list[QueryOutcome] = []
        for query, target, kept_list in zip(queries, targets, kept_lists, strict=True):
            new = 0
            for rank, c in enumerate(kept_list, start=1):
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
                    kept=len(kept_list),
                    new=new,
                    best_score=round(kept_list[0].score, 4) if kept_list else None,
                )
            )
        resolved = next((r.hybrid.resolved for r in results if r.hybrid.resolved is not None), None)
        count = state.get("library_count")
        if literature and count is None:
            # A compound question counts the part that asks how many ("How many papers are about
            # sarcasm, and how do they detect it?": sarcasm, not detection).
            asks = [p for p in state.get("plan", []) if count_question(p)] or [state.get("question", "")]
            if count_question(asks[0]):
                # Every abstract BM25 matches on one of the topic's terms is read, not the top 10.
                flt = state.get("flt")
                count = library_count(asks[0], lambda topic: deps.retriever.abstract_matches(topic, flt))
        update = {
            "sub_queries": queries,
            "evidence": evidence,
            "outcomes": outcomes,
            "passes": pass_index + 1,
            "pending": [],
            "pending_targets": [],
            "resolved": resolved if resolved is not None else state.get("resolved"),
            "closest": closest_papers(results, state.get("closest", []), settings.closest_papers),
            "literature": literature,
            "rankings": rankings,
            "library_count": count,
        }
        kept = sum(o.kept for o in outcomes)
        empty = sum(o.kept == 0 for o in outcomes)
        noun = "queries" if len(queries) > 1 else "query"
        decision = f"pass {pass_index + 1}: {len(queries)} {noun}, {len(evidence)} new chunks"
        if empty:
            decision += f", {empty} with no evidence"
        if resolved is not None:
            decision += f"; scoped to {resolved.paper_id}"
        if literature:
            ranked = len({p.paper_id for r in rankings for p in r.papers})
            decision += f"; {ranked} papers ranked"
        if count is not None and pass_index == 0:
            decision += f"; {count_sentence(count)}"
        if scoped_to is not None:
            parts = "1 part" if len(later) == 1 else f"{len(later)} parts"
            decision += f"; {parts} about the first part's paper searched in {scoped_to}"
        # Summed over sub-queries (which run concurrently, so the sum can exceed the node's time).
        hybrid_ms = sum(r.timings.get("search", 0.0) for r in results)
        rerank_ms = sum(r.timings.get("rerank", 0.0) for r in results)
        return Step(
            update,
            decision,
            {
                "queries": len(queries),
                "kept": kept,
                "new": len(evidence),
                "empty": empty,
                "search_ms": round(hybrid_ms + rerank_ms, 1),
                "hybrid_ms": round(hybrid_ms, 1),
                "rerank_ms": round(rerank_ms, 1),
            },
        )

    return retriever
