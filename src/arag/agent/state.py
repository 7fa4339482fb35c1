"""The agent's state and the records its nodes pass along.

Accumulated evidence, the sub-query history, per-query outcomes and events use concatenating
reducers, so the retry adds to the first pass instead of erasing it; every other key overwrites.
Nothing here holds a store or a model: those reach nodes through the deps closure (graph.py).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from arag.records import (
    Answer,
    AnswerType,
    Chunk,
    LibraryCount,
    NodeEvent,
    PaperHit,
    RankedPaper,
    Route,
    SearchFilter,
)
from arag.retrieval.resolve import PaperRef

Verdict = Literal["sufficient", "partial", "unrelated"]


class Evidence(BaseModel):
    """A kept chunk, with the sub-query and pass that found it."""

    model_config = ConfigDict(frozen=True)

    chunk: Chunk
    score: float
    rerank_score: float | None = None
    query: str
    pass_index: int
    rank: int = Field(description="1-based position among its query's kept chunks")


class QueryOutcome(BaseModel):
    """What one sub-query's search kept. ``target`` is the planned sub-query it serves (itself, or the
    one a reformulation aims at)."""

    model_config = ConfigDict(frozen=True)

    query: str
    target: str
    pass_index: int
    kept: int
    new: int
    best_score: float | None = None


class QueryPapers(BaseModel):
    """One sub-query's paper ranking (an open question: it named no paper)."""

    model_config = ConfigDict(frozen=True)

    query: str
    target: str
    pass_index: int
    papers: list[RankedPaper]


class PaperPart(BaseModel):
    """The papers that address one part (planned sub-query) of an open question, best first."""

    model_config = ConfigDict(frozen=True)

    target: str
    paper_ids: list[str] = Field(default_factory=list)


class Grade(BaseModel):
    """The grader's verdict on the accumulated context, and why."""

    verdict: Verdict
    reasons: list[str] = Field(default_factory=list)
    coverage: float = 1.0
    missing_terms: list[str] = Field(default_factory=list, description="key words absent, as written")
    missing_entities: list[str] = Field(default_factory=list)
    empty_queries: list[str] = Field(default_factory=list, description="planned sub-queries with no evidence")
    llm_checked: bool = False
    # A literature answer: the papers that address each part of the question.
    parts: list[PaperPart] = Field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        """What the passages lack, in words, for the answer's note and the reformulator."""
        return list(dict.fromkeys([*self.missing_entities, *self.missing_terms]))


class ContextPassage(BaseModel):
    """A numbered passage of the synthesis context: ``text`` is what the LLM reads (pruned), the
    chunk keeps the full text the verifier checks claims against."""

    model_config = ConfigDict(frozen=True)

    n: int
    chunk: Chunk
    text: str
    score: float
    tokens: int

    @property
    def full_text(self) -> str:
        """The passage as the verifier reads it: the whole chunk, less instructions to the model."""
        from arag.agent.terms import safe_label, strip_instructions

        text = strip_instructions(self.chunk.text)[0]
        return f"{safe_label(self.chunk.section)}: {text}" if self.chunk.section else text


class Draft(BaseModel):
    """The synthesizer's answer before verification."""

    short_answer: str
    explanation: str
    mode: Literal["llm", "extractive", "abstain"]
    removed_citations: int = 0
    notes: list[str] = Field(default_factory=list)
    # A literature answer: the LLM's overview (cited sentences, unchecked) and each group's points,
    # as (label, [(passage number, sentence)]); the verifier checks both and writes the text.
    overview: str = ""
    groups: list[tuple[str, list[tuple[int, str]]]] = Field(default_factory=list)


class AgentState(TypedDict, total=False):
    """The graph's state. Annotated keys concatenate; the rest overwrite."""

    question: str
    flt: SearchFilter | None
    route: Route
    answer_type: AnswerType
    # The planned sub-queries (overwritten by the planner only) and the ones the next pass searches.
    plan: list[str]
    pending: list[str]
    pending_targets: list[str]
    sub_queries: Annotated[list[str], operator.add]
    outcomes: Annotated[list[QueryOutcome], operator.add]
    evidence: Annotated[list[Evidence], operator.add]
    # An open question (no paper named or chosen): answered across papers, from their rankings.
    literature: bool
    rankings: Annotated[list[QueryPapers], operator.add]
    # "How many papers ...": the library's papers on the topic (agent/count.py).
    library_count: LibraryCount | None
    events: Annotated[list[NodeEvent], operator.add]
    passes: int
    retries: int
    resolved: PaperRef | None
    closest: list[PaperHit]
    grade: Grade
    context: list[ContextPassage]
    draft: Draft
    answer: Answer


@dataclass
class Step:
    """What a node function returns: the state update, what it decided (in words), and counts."""

    update: dict[str, Any]
    decision: str
    counts: dict[str, float] = field(default_factory=dict)
