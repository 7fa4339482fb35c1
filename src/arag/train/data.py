"""Training and calibration data for the reranker, mined from the built library.

For each QASPER question with text evidence:
- the query is the question with its paper's title in front (as ``arag eval retrieval`` asks it);
- positives are the gold paper's chunks that hold part of a gold evidence paragraph (the matching
  rule of :mod:`arag.eval.retrieval`);
- hard negatives are the top hybrid-retrieved chunks that hold no evidence: from a search scoped
  to the gold paper (same paper) and from the library-wide search the product runs (other papers).

The mined set is cached as JSON in the data directory, keyed by the questions file and the library.
The support model's records (:class:`SupportExample`, :class:`SupportPair`) are mined by
:mod:`arag.train.support_pipeline`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from arag.corpus.qasper_questions import EvalQuestion, library_query
from arag.eval.retrieval import hits_per_rank
from arag.models.reranker import pair_text
from arag.records import ScoredChunk, SearchFilter
from arag.retrieval.hybrid import HybridRetriever

# Enough to hold every chunk of one paper (the longest QASPER paper has under 300).
PAPER_CHUNKS = 1000
MINED_FORMAT = 1


class MinedQuestion(BaseModel):
    """One question's reranker examples (texts as the cross-encoder reads them)."""

    question_id: str
    query: str
    positives: list[str]
    same_paper: list[str]
    other_papers: list[str]


class Candidates(BaseModel):
    """A question's library-wide fused candidates and which of them hold gold evidence: what the
    reranker is validated and calibrated on."""

    question_id: str
    query: str
    texts: list[str]
    paper_ids: list[str]
    gold_paper: str
    # For each candidate, the indices of the gold paragraphs it holds part of.
    hits: list[list[int]]
    n_gold: int


PairKind = Literal["evidence", "hard", "random", "other"]


class SupportExample(BaseModel):
    """One annotated answer's training material for the support model (texts as the cross-encoder
    reads them)."""

    question_id: str
    hypothesis: str
    answer: str
    positives: list[str]
    hard: list[str]
    random: list[str]
    other_papers: list[str]


class SupportPair(BaseModel):
    """A labelled (hypothesis, premise) pair of the support model's validation set."""

    question_id: str
    hypothesis: str
    answer: str
    premise: str
    supported: bool
    kind: PairKind


def mine_question(
    q: EvalQuestion, retriever: HybridRetriever, resolving: HybridRetriever, *, negatives: int = 24
) -> MinedQuestion:
    """Positives and hard negatives for one question (see the module doc)."""
    query = library_query(q)
    scope = SearchFilter(paper_ids=[q.paper_id])
    scoped = retriever.search(q.question, scope).fused
    wide = resolving.search(query).fused
    paper_chunks = retriever.store.dense_search(
        retriever.embedder.embed_query(q.question), PAPER_CHUNKS, scope
    )
    positive_ids = {
        h.chunk.id
        for h, hit in zip(
            paper_chunks, hits_per_rank([h.chunk.text for h in paper_chunks], q.evidence), strict=True
        )
        if hit
    }

    def texts(hits: Sequence[ScoredChunk], same: bool) -> list[str]:
        return [
            pair_text(h.chunk)
            for h in hits
            if h.chunk.id not in positive_ids and (h.chunk.paper_id == q.paper_id) == same
        ]

    positives = [pair_text(h.chunk) for h in paper_chunks if h.chunk.id in positive_ids]
    same = list(dict.fromkeys(texts(scoped, True) + texts(wide, True)))[:negatives]
    other = list(dict.fromkeys(texts(wide, False)))[:negatives]
    return MinedQuestion(
        question_id=q.question_id, query=query, positives=positives, same_paper=same, other_papers=other
    )


def candidates_for(q: EvalQuestion, resolving: HybridRetriever) -> Candidates:
    """The library-wide fused list for a question, labelled with the gold evidence it holds."""
    query = library_query(q)
    fused = resolving.search(query).fused
    hits = hits_per_rank([h.chunk.text for h in fused], q.evidence)
    return Candidates(
        question_id=q.question_id,
        query=query,
        texts=[pair_text(h.chunk) for h in fused],
        paper_ids=[h.chunk.paper_id for h in fused],
        gold_paper=q.paper_id,
        hits=[sorted(h) for h in hits],
        n_gold=len(q.evidence),
    )


def cache_key(questions_path: Path, library_key: str, kind: str) -> str:
    """Key of a mined file: format, kind, the questions file's bytes and the library's identity."""
    digest = hashlib.sha256()
    digest.update(f"{MINED_FORMAT}:{kind}:{library_key}:".encode())
    digest.update(questions_path.read_bytes())
    return digest.hexdigest()[:16]


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".part")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def cached(
    path: Path,
    model: type[BaseModel],
    make: Callable[[], Sequence[BaseModel]],
) -> list:
    """The records in ``path`` if it exists, else ``make()`` written there (atomically) first."""
    if path.is_file():
        return [model.model_validate(x) for x in json.loads(path.read_text())]
    items = list(make())
    _atomic_write(path, json.dumps([x.model_dump() for x in items]))
    return items
