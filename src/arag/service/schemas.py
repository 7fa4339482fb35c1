"""What the API reads and writes. Requests are validated here (lengths, ranges, unknown fields), so a
bad request is a 4xx with a message before any work starts."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from arag.corpus.arxiv_ids import arxiv_url
from arag.library.build import BuildSummary
from arag.library.state import Failure, PaperRow
from arag.llm.process import ProcessInfo
from arag.records import Answer, Coverage, NodeEvent
from arag.retrieval.pipeline import SearchResult, found_by
from arag.settings import QUESTION_CHARS_CEILING as MAX_QUESTION_CHARS
from arag.text import strip_placeholders

MAX_PAPERS = 50


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueryRequest(_Request):
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="the research question")
    papers: list[str] | None = Field(
        default=None, max_length=MAX_PAPERS, description="answer only from these paper ids"
    )


class SearchRequest(_Request):
    query: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="a question or keywords")
    papers: list[str] | None = Field(default=None, max_length=MAX_PAPERS)
    k: int = Field(default=10, ge=1, le=50, strict=True, description="how many ranked passages to return")


class ChatRequest(_Request):
    session_id: str = Field(min_length=1, max_length=64, description="letters, digits, '-', '_' and '.'")
    message: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    rewrite: bool = Field(default=True, description="rewrite a follow-up into a standalone question")
    papers: list[str] | None = Field(default=None, max_length=MAX_PAPERS)


class QueryResponse(Answer):
    """The agent's answer (short answer, text with [n] markers, citations with support scores, every
    chunk it retrieved with its score, sub-queries, retries, timings per node) and the request id."""

    request_id: str


class ChatResponse(QueryResponse):
    session_id: str
    message: str = Field(description="the message as sent; `question` is the standalone question asked")


class SearchHit(BaseModel):
    rank: int
    chunk_id: str
    paper_id: str
    title: str
    section: str | None
    type: str
    text: str
    arxiv_url: str | None
    score: float = Field(description="the final score (rerank score combined with the fused rank)")
    rerank_score: float | None
    fused_rank: int
    fused_score: float
    found_by: list[str]
    stage_ranks: dict[str, int] = Field(description="1-based rank in each search that found it")
    kept: bool = Field(description="passed the reranker's bars: would be evidence for an answer")
    floored: bool


class PaperPassage(BaseModel):
    chunk_id: str
    section: str | None
    type: str
    text: str
    rerank_score: float | None


class SearchPaper(BaseModel):
    """A paper ranked for a query that names none."""

    rank: int
    paper_id: str
    title: str
    arxiv_url: str | None
    score: float = Field(description="the aggregated evidence of its abstract and passages")
    abstract_rank: int | None = Field(description="its abstract's rank in the abstract search")
    passage_hits: int = Field(description="its chunks among the passage and BM25 candidates")
    best_rerank: float | None
    found_by: list[str]
    passages: list[PaperPassage] = Field(description="its best passages, reranked, best first")


class SearchResponse(BaseModel):
    request_id: str
    query: str
    searched_as: str = Field(description="the query the searches ran (without a named paper's title)")
    resolved_paper: str | None = Field(description="the paper the query named, if it named one")
    model: str
    hits: list[SearchHit]
    papers: list[SearchPaper] = Field(
        default_factory=list, description="for a query that names no paper: the papers ranked, best first"
    )
    timings: dict[str, float]
    coverage: Coverage | None = Field(default=None, description="how much of the library was searched")

    @classmethod
    def build(
        cls, request_id: str, query: str, result: SearchResult, coverage: Coverage | None = None
    ) -> SearchResponse:
        hyb = result.hybrid
        ranks: dict[str, dict[str, int]] = {}
        for name, hits in (
            ("abstracts", hyb.dense_abstracts),
            ("passages", hyb.dense_passages),
            ("bm25", hyb.bm25),
        ):
            for i, h in enumerate(hits, 1):
                ranks.setdefault(h.chunk.id, {})[name] = i
        kept = {h.chunk.id for h in result.kept}
        by = found_by(hyb)
        out = [
            SearchHit(
                rank=i,
                chunk_id=h.chunk.id,
                paper_id=h.chunk.paper_id,
                title=h.chunk.title,
                section=h.chunk.section,
                type=h.chunk.type,
                text=strip_placeholders(h.chunk.text),
                arxiv_url=arxiv_url(h.chunk.paper_id),
                score=round(h.score, 4),
                rerank_score=None if h.rerank_score is None else round(h.rerank_score, 4),
                fused_rank=h.fused_rank,
                fused_score=round(h.fused_score, 6),
                found_by=h.found_by or by.get(h.chunk.id, []),
                stage_ranks=ranks.get(h.chunk.id, {}),
                kept=h.chunk.id in kept,
                floored=h.floored,
            )
            for i, h in enumerate(result.ranked, 1)
        ]
        return cls(
            request_id=request_id,
            query=query,
            searched_as=hyb.query or query,
            resolved_paper=hyb.resolved.paper_id if hyb.resolved else None,
            model=result.model,
            hits=out,
            papers=[
                SearchPaper(
                    rank=p.rank,
                    paper_id=p.paper_id,
                    title=p.title,
                    arxiv_url=arxiv_url(p.paper_id),
                    score=round(p.score, 6),
                    abstract_rank=p.abstract_rank,
                    passage_hits=p.passage_hits,
                    best_rerank=None if p.best_rerank is None else round(p.best_rerank, 4),
                    found_by=p.found_by,
                    passages=[
                        PaperPassage(
                            chunk_id=c.chunk.id,
                            section=c.chunk.section,
                            type=c.chunk.type,
                            text=strip_placeholders(c.chunk.text),
                            rerank_score=None if c.rerank_score is None else round(c.rerank_score, 4),
                        )
                        for c in p.passages
                    ],
                )
                for p in result.papers
            ],
            timings=result.timings,
            coverage=coverage,
        )


class PaperOut(BaseModel):
    id: str
    title: str
    year: int | None
    authors: list[str]
    source: str
    arxiv_url: str | None
    chunks: int
    topic: int | None
    topic_label: str | None

    @classmethod
    def of(cls, row: PaperRow) -> PaperOut:
        return cls(
            id=row.id,
            title=row.title,
            year=row.year,
            authors=row.authors,
            source=row.source,
            arxiv_url=arxiv_url(row.id),
            chunks=row.n_chunks,
            topic=row.topic,
            topic_label=row.topic_label,
        )


class PaperDetail(PaperOut):
    abstract: str

    @classmethod
    def of(cls, row: PaperRow) -> PaperDetail:
        # The recorded text is the abstract chunk as embedded: "Title: ...\nSection: Abstract\n" first.
        abstract = re.sub(r"^Title: [^\n]*\n(Section: [^\n]*\n)?", "", row.abstract_text)
        return cls(**PaperOut.of(row).model_dump(), abstract=abstract)


class PaperList(BaseModel):
    total: int = Field(description="papers matching the filter")
    offset: int
    limit: int
    papers: list[PaperOut]


JobState = Literal["queued", "running", "done", "failed"]


class IngestJob(BaseModel):
    id: str
    state: JobState
    files: list[str] = Field(description="uploaded file names, as sent")
    arxiv_ids: list[str]
    done: int = 0
    total: int = 0
    created: float
    finished: float | None = None
    summary: BuildSummary | None = None
    failures: list[Failure] = Field(default_factory=list, description="documents skipped, and why")
    error: str | None = None


class Health(BaseModel):
    status: Literal["ok"] = "ok"


BuildState = Literal["off", "complete", "loading", "building", "stopped", "failed"]
TrainState = Literal["off", "installed", "waiting", "training", "failed", "stopped", "unavailable"]


class BuildStatus(BaseModel):
    """The background build of the default library (``arag serve`` on an empty or interrupted one)."""

    state: BuildState = Field(
        description="off: nothing to build; loading: reading the corpus; building; complete; "
        "stopped (the server stopped first: the next start resumes it); failed (see error)"
    )
    reason: str | None = Field(default=None, description="empty (a new library) or interrupted (resumed)")
    papers: int = Field(default=0, description="papers indexed now (what a question searches)")
    papers_total: int = Field(default=0, description="papers the library holds once the build ends")
    papers_done: int = Field(default=0, description="papers this build indexed (or found unusable)")
    papers_todo: int = Field(default=0, description="papers this build had to index when it started")
    chunks_done: int = Field(default=0, description="chunks this build wrote")
    papers_per_s: float = 0.0
    chunks_per_s: float = 0.0
    eta_s: float | None = Field(default=None, description="seconds left at the rate so far")
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    fix: str | None = None


class TrainStatus(BaseModel):
    """The reranker: installed, or trained in the background once the library is complete
    (searches use the fused order until it is installed)."""

    state: TrainState = Field(
        description="installed; waiting (for the build); training; off (another reranker is "
        "configured, or training is switched off); unavailable (no training data); failed; stopped"
    )
    model: str = Field(description="the reranker searches use now ('none': the fused order)")
    stage: str | None = Field(default=None, description="the training step running (mining, training, ...)")
    done: int = 0
    total: int = 0
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    fix: str | None = None


class Ready(BaseModel):
    ready: bool
    state: Literal["loading", "building", "complete", "incomplete", "failed"] = Field(
        description="building: serving while the library builds; complete: serving the whole library; "
        "incomplete: serving what a failed or stopped build indexed (see build); loading: models not "
        "up yet; failed: the library could not open (see checks)"
    )
    papers: int
    chunks: int
    checks: dict[str, str]
    build: BuildStatus | None = None
    reranker: TrainStatus | None = None
    llm_processes: list[ProcessInfo] = Field(
        default_factory=list, description="the local model's processes (none with a hosted LLM)"
    )


class SystemInfo(BaseModel):
    version: str
    versions: dict[str, str]
    models: dict[str, str]
    library: dict[str, int | str]
    settings: dict[str, str | int | float | bool | list[str]]
    pool: dict[str, int]
    build: BuildStatus | None = None
    reranker: TrainStatus | None = None
    llm_processes: list[ProcessInfo] = Field(
        default_factory=list, description="the local model's processes: pid, state, restarts, build flags"
    )


class ErrorBody(BaseModel):
    error: str = Field(description="what failed")
    where: str | None = None
    fix: str | None = Field(default=None, description="what to do about it")
    status: int
    request_id: str | None = None


class StartEvent(BaseModel):
    """The first event of a stream: the request's id and the question as received."""

    request_id: str
    question: str


class TokenEvent(BaseModel):
    text: str


StreamEvent = NodeEvent | TokenEvent
