"""The research tools around a paper, as the Python API runs them: "summarise <paper>" and "related
work for <paper>" (agent/summary.py, agent/related.py) over an open library, the same tools asked as
a question (agent/paper_request.py decides; the answer and its steps look like the agent's), and the
library's map (library/map.py)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar, cast

import numpy as np

from arag.agent.graph import Agent, finish_answer
from arag.agent.hooks import RunHooks
from arag.agent.paper_request import PaperTool, paper_request, resolve_target
from arag.agent.related import LibraryPaper, RelatedPapers, clean_abstract, related_papers, related_text
from arag.agent.summary import PaperSummary, iter_summary, summary_answer
from arag.errors import IndexError_
from arag.library.map import LibraryMap, load_map
from arag.library.state import LibraryState, PaperRow
from arag.llm.base import LLM
from arag.models.embedder import BaseEmbedder
from arag.records import Answer, NodeEvent, SearchFilter
from arag.retrieval.pipeline import Retriever
from arag.retrieval.resolve import PaperRef, PaperResolver
from arag.settings import Settings

# Related papers a question ("related work for X") gets.
QUESTION_RELATED_K = 5
_THIS_PAPER = re.compile(r"^(?:(?:this|the|that)\s+(?:paper|article|work)|it)$", re.I)
_R = TypeVar("_R")  # a tool stream's result (an Answer, a PaperSummary)


class OpenLibrary(Protocol):
    """What the tools use of ``arag.api.Library`` (a protocol: this module sits below the API)."""

    settings: Settings
    resolver: PaperResolver
    retriever: Retriever
    llm: LLM | None
    agent: Agent
    abstract_vectors: np.ndarray | None
    vectors_lock: threading.Lock

    @property
    def embedder(self) -> BaseEmbedder: ...

    def papers(self, *, topic: int | None = None) -> list[PaperRow]: ...


def tool_request(
    lib: OpenLibrary, question: str, flt: SearchFilter | None
) -> tuple[PaperTool, PaperRef] | None:
    """The tool a question asks for and its paper; None when it asks for none, or names no paper of the
    library (it is then answered as research). "Summarise this paper" means the one paper in scope."""
    req = paper_request(question)
    if req is None:
        return None
    ref = resolve_target(req.target, lib.resolver)
    one = flt.paper_ids if flt is not None and flt.paper_ids and len(flt.paper_ids) == 1 else None
    if ref is None and one and _THIS_PAPER.match(req.target):
        pid = one[0]
        ref = PaperRef(
            paper_id=pid, title=lib.resolver.titles[pid], method="arxiv-id", score=1.0, matched=pid
        )
    return (req.tool, ref) if ref is not None else None


def summarise(
    lib: OpenLibrary,
    row: PaperRow,
    *,
    on_event: Callable[[NodeEvent], None] | None = None,
    hooks: RunHooks | None = None,
) -> PaperSummary:
    """One paper's summary (each step to ``on_event``)."""
    support = lib.agent.deps.support
    return collect_summary(
        iter_summary(row.id, row.title, lib.retriever, lib.llm, support, hooks=hooks), on_event
    )


def collect_summary(
    items: Iterator[NodeEvent | PaperSummary], on_event: Callable[[NodeEvent], None] | None
) -> PaperSummary:
    """The summary of a summary stream, each event to ``on_event``."""
    return _last(items, PaperSummary, on_event, "the summary ended without a result")


def _last(
    items: Iterator[NodeEvent | _R], kind: type[_R], on_event: Callable[[NodeEvent], None] | None, empty: str
) -> _R:
    """The first ``kind`` item of a tool's stream (its result), each event before it to ``on_event``."""
    for item in items:
        if isinstance(item, kind):
            return item
        if on_event is not None:
            on_event(cast(NodeEvent, item))
    raise AssertionError(empty)


def _library_papers(lib: OpenLibrary) -> tuple[list[PaperRow], np.ndarray]:
    """The paper list and every abstract's vector (same order), computed once per paper list."""
    with lib.vectors_lock:
        rows = lib.papers()
        vectors = lib.abstract_vectors
        if vectors is None or len(vectors) != len(rows):
            # The topics embed the same texts: the vectors come from the embedding cache.
            vectors = lib.embedder.embed([r.abstract_text or r.title for r in rows])
            lib.abstract_vectors = vectors
        return rows, vectors


def related(lib: OpenLibrary, row: PaperRow, k: int) -> RelatedPapers:
    """The ``k`` papers related to ``row``."""
    rows, vectors = _library_papers(lib)
    papers = [
        LibraryPaper(id=r.id, title=r.title, year=r.year, abstract=clean_abstract(r.abstract_text))
        for r in rows
    ]
    target = next(i for i, r in enumerate(rows) if r.id == row.id)
    return related_papers(target, papers, vectors, k=k, llm=lib.llm, scorer=lib.agent.deps.support)


def library_map(settings: Settings) -> LibraryMap:
    """The stored map; an IndexError_ (503) saying how to compute it when the library has none."""
    with LibraryState(settings.state_db) as state:
        found = load_map(state)
    if found is None:
        raise IndexError_(
            "the library has no map yet (it was built before maps existed)",
            where=str(settings.data_dir),
            fix="compute it with `arag library topics` (or `arag library build`), then reload",
        )
    return found


def tool_stream(
    lib: OpenLibrary, question: str, tool: tuple[PaperTool, PaperRef], hooks: RunHooks | None
) -> Iterator[NodeEvent | Answer]:
    """A paper tool asked as a question: its steps as the agent's events, then its result as an Answer."""
    name, ref = tool
    t_start = time.perf_counter()
    events: list[NodeEvent] = []
    t0 = time.perf_counter()
    what = "summary" if name == "summary" else "related work"
    first = NodeEvent(
        node="router",
        ms=round(1000 * (time.perf_counter() - t0), 2),
        decision=f"paper tool: {what} of {ref.paper_id} ({ref.reason()})",
    )
    events.append(first)
    yield first
    if name == "summary":
        support = lib.agent.deps.support
        summary: PaperSummary | None = None
        for item in iter_summary(ref.paper_id, ref.title, lib.retriever, lib.llm, support, hooks=hooks):
            if isinstance(item, PaperSummary):
                summary = item
            else:
                events.append(item)
                yield item
        assert summary is not None
        answer = summary_answer(question, summary, support.threshold)
    else:
        if hooks is not None:
            hooks.check("retriever")
        t0 = time.perf_counter()
        row = next(r for r in lib.papers() if r.id == ref.paper_id)
        rel = related(lib, row, QUESTION_RELATED_K)
        llm_lines = sum(p.relation_mode == "llm" for p in rel.papers)
        e = NodeEvent(
            node="synthesizer",
            ms=round(1000 * (time.perf_counter() - t0), 2),
            decision=f"{len(rel.papers)} related papers; lines: {llm_lines} LLM, "
            f"{len(rel.papers) - llm_lines} extractive",
            counts={"papers": len(rel.papers)},
        )
        events.append(e)
        yield e
        answer = Answer(
            question=question,
            short_answer=f"Related work for {rel.title}",
            text=related_text(rel),
            route="research",
            answer_type="free_form",
            mode="llm" if llm_lines else "extractive",
        )
    yield finish_answer(answer, events, t_start)


def collect(items: Iterator[NodeEvent | Answer], on_event: Callable[[NodeEvent], None] | None) -> Answer:
    """The answer of a tool's stream, each event to ``on_event``."""
    return _last(items, Answer, on_event, "the paper tool ended without an answer")
