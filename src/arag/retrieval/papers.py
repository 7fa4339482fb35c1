"""Paper-level retrieval for questions that name no paper ("How do researchers detect fake news?").

The passage pipeline answers one paper's question: its best passage matters, the others are noise.
An open question is answered by several papers, so papers are ranked too:

- Wider searches than the passage lists (``paper_abstract_k`` abstracts, ``paper_passage_k`` passages,
  ``paper_bm25_k`` BM25 hits): an open question's papers sit deeper than one paper's best passage.
- Each paper's evidence is aggregated with reciprocal ranks: its abstract's rank in the abstract
  search, and its best ``paper_hits`` chunks in the passage and BM25 searches, each worth half the one
  before (a paper with several matching passages is about the topic; one lucky passage is not).
- The top ``papers_k`` papers are kept; each one's best chunks (its abstract among them when it was
  found) are reranked with the cross-encoder against the question and the best ``passages_per_paper``
  kept, best first, then its abstract when a search found it and it is not among them (where the
  authors say what the paper does: an open question's answer draws each paper's point from these).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from arag.models.reranker import Reranker, pair_text
from arag.records import RankedChunk, RankedPaper, ScoredChunk
from arag.settings import RetrievalSettings

# Each further hit of one paper counts this much of the one before.
HIT_DECAY = 0.5
# The searches over abstracts only (one chunk a paper, so no further hits to count).
ABSTRACT_LISTS = ("abstracts", "abstract_bm25")


class PaperPool(BaseModel):
    """The wide searches a paper ranking aggregates (abstracts, passages and tables, BM25 over all)."""

    abstracts: list[ScoredChunk]
    passages: list[ScoredChunk]
    bm25: list[ScoredChunk]
    # BM25 over the abstracts alone: a paper whose abstract uses the question's terms is about them,
    # though its passages' many hits on other words push it down the BM25 list over every chunk.
    abstract_bm25: list[ScoredChunk] = []

    def lists(self) -> dict[str, list[ScoredChunk]]:
        return {
            "abstracts": self.abstracts,
            "passages": self.passages,
            "bm25": self.bm25,
            "abstract_bm25": self.abstract_bm25,
        }


def aggregate_papers(
    pool: PaperPool, *, rrf_k: int = 60, hits: int = 3, limit: int = 10
) -> list[RankedPaper]:
    """The top ``limit`` papers of the pool by aggregated reciprocal rank (a pure function), without
    passages yet. Ties: the better single rank, then the paper id."""
    score: dict[str, float] = {}
    best: dict[str, int] = {}
    title: dict[str, str] = {}
    abstract_rank: dict[str, int] = {}
    counted: dict[str, int] = {}
    found: dict[str, list[str]] = {}
    for name, ranked in pool.lists().items():
        seen: dict[str, int] = {}
        for pos, hit in enumerate(ranked, start=1):
            pid = hit.chunk.paper_id
            title.setdefault(pid, hit.chunk.title)
            j = seen.get(pid, 0)
            seen[pid] = j + 1
            if name not in ABSTRACT_LISTS:
                counted[pid] = counted.get(pid, 0) + 1
            elif name == "abstracts" and pid not in abstract_rank:
                abstract_rank[pid] = pos
            if j >= hits:
                continue
            score[pid] = score.get(pid, 0.0) + HIT_DECAY**j / (rrf_k + pos)
            best[pid] = min(best.get(pid, pos), pos)
            if name not in found.setdefault(pid, []):
                found[pid].append(name)
    order = sorted(score, key=lambda p: (-score[p], best[p], p))[:limit]
    return [
        RankedPaper(
            paper_id=pid,
            title=title[pid],
            rank=i,
            score=round(score[pid], 6),
            abstract_rank=abstract_rank.get(pid),
            passage_hits=counted.get(pid, 0),
            found_by=found[pid],
        )
        for i, pid in enumerate(order, start=1)
    ]


def paper_candidates(pool: PaperPool, paper_id: str, limit: int) -> list[tuple[ScoredChunk, int, list[str]]]:
    """A paper's chunks in the pool, by their best rank in any search: (hit, best rank, searches)."""
    by_id: dict[str, tuple[ScoredChunk, int, list[str]]] = {}
    for name, ranked in pool.lists().items():
        for pos, hit in enumerate(ranked, start=1):
            if hit.chunk.paper_id != paper_id:
                continue
            prev = by_id.get(hit.chunk.id)
            if prev is None:
                by_id[hit.chunk.id] = (hit, pos, [name])
            else:
                by_id[hit.chunk.id] = (prev[0], min(prev[1], pos), [*prev[2], name])
    ordered = sorted(by_id.values(), key=lambda x: (x[1], x[0].chunk.index))
    return ordered[:limit]


def rank_papers(
    query: str,
    pool: PaperPool,
    reranker: Reranker,
    settings: RetrievalSettings,
    scored: Mapping[str, float] | None = None,
) -> list[RankedPaper]:
    """The top papers for ``query`` with their best passages: aggregated, then each paper's candidate
    chunks reranked in one batch (the reranker reads the question as asked). ``scored``: the model's
    scores for this query that the passage stage already has, by chunk id; only the rest are scored."""
    papers = aggregate_papers(pool, rrf_k=settings.rrf_k, hits=settings.paper_hits, limit=settings.papers_k)
    cands = {p.paper_id: paper_candidates(pool, p.paper_id, settings.paper_hits + 1) for p in papers}
    flat = [c for p in papers for c in cands[p.paper_id]]
    model_scores: dict[str, float] = {}
    if reranker.name != "none":
        # Most of a top paper's candidates are among the fused passages already scored: scoring them
        # again doubled the model's time on an open question.
        model_scores = dict(scored or {})
        todo = list({h.chunk.id: h.chunk for h, _, _ in flat if h.chunk.id not in model_scores}.values())
        if todo:
            fresh = reranker.score(query, [pair_text(c) for c in todo])
            model_scores.update((c.id, float(x)) for c, x in zip(todo, fresh, strict=True))
    out: list[RankedPaper] = []
    for p in papers:
        ranked: list[RankedChunk] = []
        for hit, rank, names in cands[p.paper_id]:
            model = model_scores.get(hit.chunk.id)
            ranked.append(
                RankedChunk(
                    chunk=hit.chunk,
                    score=model if model is not None else -float(rank),
                    source="paper",
                    fused_rank=rank,
                    fused_score=hit.score,
                    rerank_score=model,
                    found_by=names,
                )
            )
        ranked.sort(key=lambda c: (-c.score, c.fused_rank))
        best = max((c.rerank_score for c in ranked if c.rerank_score is not None), default=None)
        passages = append_abstract(ranked[: settings.passages_per_paper], ranked, pool, p.paper_id)
        update = {"passages": passages, "best_rerank": best}
        out.append(p.model_copy(update={**update, "abstract": abstract_text(pool, p.paper_id)}))
    return out


def append_abstract(
    passages: list[RankedChunk], ranked: Sequence[RankedChunk], pool: PaperPool, paper_id: str
) -> list[RankedChunk]:
    """A paper's best passages, and after them its abstract when a search found it and it is not
    among them: the reranker, trained on one-paper questions and their paragraphs, seldom puts an
    abstract first, and it is where the authors say what the paper does (an open question's answer
    draws each paper's point from these)."""
    if any(c.chunk.type == "abstract" for c in passages):
        return passages
    found = next((c for c in ranked if c.chunk.type == "abstract"), None)
    if found is None:
        lists = pool.lists()
        hits = [
            (pos, name, h)
            for name in ABSTRACT_LISTS
            for pos, h in enumerate(lists[name], start=1)
            if h.chunk.paper_id == paper_id
        ]
        if not hits:
            return passages
        # Both abstract searches may hold it: its best rank (and the first chunk, were there several).
        pos, _, hit = min(hits, key=lambda x: (x[2].chunk.index, x[0]))
        found = RankedChunk(
            chunk=hit.chunk,
            score=-float(pos),
            source="paper",
            fused_rank=pos,
            fused_score=hit.score,
            found_by=[name for _, name, h in hits if h.chunk.id == hit.chunk.id],
        )
    return [*passages, found]


def abstract_text(pool: PaperPool, paper_id: str) -> str | None:
    """The paper's abstract, when a search over abstracts found it (its parts joined, in order)."""
    found = [*pool.abstracts, *pool.abstract_bm25]
    parts = {h.chunk.id: h.chunk for h in found if h.chunk.paper_id == paper_id}
    if not parts:
        return None
    return " ".join(c.text for c in sorted(parts.values(), key=lambda c: c.index))


def paper_ids(papers: Sequence[RankedPaper]) -> list[str]:
    """The ranked papers' ids, in order."""
    return [p.paper_id for p in papers]
