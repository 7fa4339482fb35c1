"""Typed records shared by every layer: papers, chunks, scored chunks.

All sources (QASPER, PDFs, arXiv) produce the same ``Paper`` shape.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ChunkType = Literal["abstract", "passage", "table"]
PaperSource = Literal["qasper", "pdf", "arxiv"]


class Section(BaseModel):
    """A section of a paper's body: its heading and its paragraphs, in order."""

    model_config = ConfigDict(frozen=True)

    name: str
    paragraphs: list[str]


class Table(BaseModel):
    """A table extracted from a document, as text, with its caption when one was found."""

    model_config = ConfigDict(frozen=True)

    caption: str | None = None
    text: str
    page: int | None = None
    section: str | None = None


class Paper(BaseModel):
    """One paper of the library, whatever its source."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="arXiv id for QASPER/arXiv papers; 'pdf:<stem>-<hash8>' for local PDFs")
    title: str
    abstract: str = ""
    sections: list[Section] = Field(default_factory=list)
    tables: list[Table] = Field(default_factory=list)
    authors: list[str] = Field(default_factory=list)
    year: int | None = None
    month: int | None = None
    categories: list[str] = Field(default_factory=list)
    source: PaperSource
    source_path: str | None = None

    def content_hash(self) -> str:
        """SHA-256 over the text content: unchanged papers are skipped on rebuild."""
        payload = {
            "title": self.title,
            "abstract": self.abstract,
            "sections": [[s.name, s.paragraphs] for s in self.sections],
            "tables": [[t.caption, t.text] for t in self.tables],
        }
        blob = json.dumps(payload, ensure_ascii=False, sort_keys=True).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()

    @property
    def n_paragraphs(self) -> int:
        return sum(len(s.paragraphs) for s in self.sections)


class Chunk(BaseModel):
    """A unit of retrieval. ``embed_text`` is what the embedder reads; BM25 sees ``text``."""

    @property
    def texts_to_embed(self) -> list[str]:
        """What the embedder reads for this chunk: its parts, or its embed_text."""
        return self.embed_parts or [self.embed_text]

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="'<paper_id>:<index:04d>:<sha256(text)[:8]>', stable across rebuilds")
    paper_id: str
    index: int
    title: str
    section: str | None = None
    type: ChunkType
    text: str
    embed_text: str
    # When embed_text is longer than the model reads (a long abstract): sentence-aligned pieces that
    # each fit, whose vectors are averaged into the chunk's one vector. Empty: embed embed_text.
    embed_parts: list[str] = Field(default_factory=list)
    n_tokens: int = Field(
        description="embedding-model word-pieces of embed_text (of its longest part when it has parts), "
        "special tokens excluded"
    )
    overlap_sentences: int = 0
    year: int | None = None
    topic: int | None = None
    topic_label: str | None = None


def chunk_id(paper_id: str, index: int, text: str) -> str:
    """The stable chunk id: paper id + position + content hash."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return f"{paper_id}:{index:04d}:{digest}"


class SparseVector(BaseModel):
    """A BM25 term vector: hashed term ids and their weights (the engine applies IDF)."""

    model_config = ConfigDict(frozen=True)

    indices: list[int]
    values: list[float]


class ScoredChunk(BaseModel):
    """A chunk with the score one search (or a fusion) gave it."""

    model_config = ConfigDict(frozen=True)

    chunk: Chunk
    score: float
    source: str = Field(default="", description="which search produced it: dense, sparse, fused, ...")


class SearchFilter(BaseModel):
    """Restrict a search to some papers, chunk types, years or topics. ``None`` means no restriction."""

    model_config = ConfigDict(frozen=True)

    paper_ids: list[str] | None = None
    types: list[ChunkType] | None = None
    year_min: int | None = None
    year_max: int | None = None
    topics: list[int] | None = None


class RankedChunk(ScoredChunk):
    """A candidate after reranking: ``score`` is the final score (the rerank score, floored for a
    canonical paper), beside where the fusion had it and which searches found it."""

    fused_rank: int = Field(description="1-based rank in the fused list")
    fused_score: float
    rerank_score: float | None = Field(default=None, description="the model's raw score; None: no reranker")
    floored: bool = Field(default=False, description="raised to the lower bar: a canonical paper's chunk")
    found_by: list[str] = Field(
        default_factory=list,
        description="the searches that found it: abstracts, passages, bm25, abstract_bm25",
    )
    abstract: str | None = Field(
        default=None, description="its abstract's text, when a search over abstracts found it"
    )


class RankedPaper(BaseModel):
    """A paper ranked for a question that names none: its abstract's and its passages' evidence
    aggregated, and its best passages (reranked) to answer from."""

    model_config = ConfigDict(frozen=True)

    paper_id: str
    title: str
    rank: int = Field(description="1-based rank among the papers")
    score: float = Field(description="the aggregated evidence score the papers are ordered by")
    abstract_rank: int | None = Field(default=None, description="rank of its abstract in the abstract search")
    passage_hits: int = Field(default=0, description="its chunks among the passage and BM25 candidates")
    best_rerank: float | None = Field(default=None, description="the reranker's best score of its passages")
    found_by: list[str] = Field(
        default_factory=list,
        description="the searches that found it: abstracts, passages, bm25, abstract_bm25",
    )
    abstract: str | None = Field(
        default=None, description="its abstract's text, when a search over abstracts found it"
    )
    passages: list[RankedChunk] = Field(default_factory=list, description="its best chunks, best first")


# --- the answering agent's records ---------------------------------------------------------------

Route = Literal["research", "direct", "about"]
# yes_no: "Do they use X?"; span: a name, number or phrase found in a paper; free_form: an explanation.
AnswerType = Literal["yes_no", "span", "free_form"]
# How the answer was written: by the LLM, extractively (no LLM), directly (greetings, arithmetic),
# from arag's own description, or an abstention.
AnswerMode = Literal["llm", "extractive", "direct", "about", "abstain"]
# answer: one question answered from its passages; literature: an open question answered across the
# library, paper by paper (the papers' points grouped by approach, with an overview).
AnswerForm = Literal["answer", "literature"]


class NodeEvent(BaseModel):
    """One agent step: which node ran, how long it took, what it decided, and counts."""

    model_config = ConfigDict(frozen=True)

    node: str
    ms: float
    decision: str
    counts: dict[str, float] = Field(default_factory=dict)


class Citation(BaseModel):
    """A [n] marker of an answer and the chunk it points at, with the verifier's support score."""

    model_config = ConfigDict(frozen=True)

    n: int
    chunk_id: str
    paper_id: str
    title: str
    section: str | None = None
    support: float = Field(description="the support scorer's score of the claims citing it, in [0, 1]")
    supported: bool


class PaperHit(BaseModel):
    """A paper near a question (shown when the agent abstains)."""

    model_config = ConfigDict(frozen=True)

    paper_id: str
    title: str
    score: float


class PaperPoint(BaseModel):
    """A paper a literature answer draws on: its point (a sentence of its passage [n]) and its group."""

    model_config = ConfigDict(frozen=True)

    n: int = Field(description="the context number of the passage the point is taken from")
    paper_id: str
    title: str
    url: str | None = Field(default=None, description="the paper on arXiv, when it has an arXiv id")
    point: str = Field(description="the paper's point, with its [n] marker")
    group: str = Field(description="the label of the group it is in")


class ApproachGroup(BaseModel):
    """Papers of a literature answer that share an approach (or, for a compound question, one part)."""

    model_config = ConfigDict(frozen=True)

    label: str
    paper_ids: list[str]
    text: str = Field(description="the group's cited sentences, as in the answer's text")


class UsedChunk(BaseModel):
    """A chunk the agent retrieved: its context number (None: not put in the context), its score and
    the sub-query that found it."""

    model_config = ConfigDict(frozen=True)

    n: int | None
    chunk_id: str
    paper_id: str
    title: str
    section: str | None = None
    score: float
    query: str
    pass_index: int = Field(description="0: the first retrieval pass, 1: the retry")
    text: str = Field(
        default="",
        description="the chunk's text, so a citation can show its passage (citation stand-ins such as "
        "BIBREF3 removed, as the LLM read it)",
    )


class Coverage(BaseModel):
    """How much of the library a question was searched over: all of it, or (while the library is
    still being built) the papers indexed when the question arrived."""

    papers: int = Field(description="papers indexed when the question was searched")
    of: int = Field(description="papers the library holds once its build ends (= papers when complete)")
    complete: bool = Field(description="no build was running: the whole library was searched")


class LibraryCount(BaseModel):
    """How many of the library's papers name a topic in their title or abstract (a "how many papers"
    question, agent/count.py); ``words``: the topic's words counted, empty for the whole library."""

    model_config = ConfigDict(frozen=True)

    papers: int
    words: list[str] = Field(default_factory=list)


class Answer(BaseModel):
    """What the agent answers: a short answer above the explanation, its citations, and the trace."""

    question: str
    short_answer: str = Field(description="a phrase, a number, Yes/No, or 'not in the library'")
    text: str
    citations: list[Citation] = Field(default_factory=list)
    abstained: bool = False
    route: Route
    answer_type: AnswerType | None = None
    mode: AnswerMode
    sub_queries: list[str] = Field(default_factory=list, description="every query searched, in order")
    retries: int = 0
    chunks: list[UsedChunk] = Field(default_factory=list)
    closest: list[PaperHit] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list, description="what the library's passages lacked")
    removed_citations: int = Field(default=0, description="[k] markers that matched no passage")
    dropped_claims: int = 0
    timings: dict[str, float] = Field(default_factory=dict, description="ms per node (summed over runs)")
    events: list[NodeEvent] = Field(default_factory=list)
    total_ms: float = 0.0
    llm_cached_calls: int = Field(default=0, description="LLM replies from the disk cache (times not real)")
    coverage: Coverage | None = Field(default=None, description="how much of the library was searched")
    form: AnswerForm = "answer"
    # A literature answer: its groups (the text holds the overview, then each group's sentences) and the
    # papers it cites, with their points and arXiv links.
    groups: list[ApproachGroup] = Field(default_factory=list)
    papers: list[PaperPoint] = Field(default_factory=list)
    library_count: LibraryCount | None = Field(
        default=None, description="asked how many papers: the library's count (the short answer says it)"
    )
