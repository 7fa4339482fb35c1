"""The Python API: one open library (store, models, agent) that answers questions, searches, lists
papers and holds conversations. ``arag ask`` / ``arag chat`` and the service all go through it.

    import arag

    answer = arag.ask("How is the ontology induced from text?")    # opens, answers, closes

    with arag.Library() as lib:                                     # open once, ask many times
        answer = lib.ask("What do the modules compute?", papers=["1601.01705"])
        follow_up = lib.chat("s1", "How is it trained?")
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np

from arag import paper_tools
from arag.agent.chat import ChatHistory, Exchange, Rewrite, Rewriter, chat_db, validate_session_id
from arag.agent.graph import Agent, build_agent, validate_question
from arag.agent.hooks import RunHooks
from arag.agent.related import RelatedPapers
from arag.agent.summary import PaperSummary
from arag.corpus.arxiv_ids import bare_arxiv_id
from arag.errors import InputError, NotFoundError, StoreError
from arag.library.build import BuildSummary, Progress
from arag.library.manage import list_papers, open_for_search
from arag.library.map import LibraryMap
from arag.library.state import PaperRow
from arag.llm.base import LLM
from arag.llm.gguf import AssemblyProgress
from arag.models.embedder import BaseEmbedder
from arag.models.reranker import Reranker
from arag.records import Answer, NodeEvent, SearchFilter
from arag.retrieval.pipeline import Retriever, SearchResult
from arag.retrieval.resolve import PaperResolver
from arag.settings import Settings, get_settings

EventCallback = Callable[[NodeEvent], None]
PAPERS_FIX = "list the library's paper ids with `arag papers` (or `arag papers --json`)"
_VERSION = re.compile(r"v\d+$")


def check_paper_ids(
    ids: Sequence[str] | None, known: Collection[str], *, where: str = "papers"
) -> list[str] | None:
    """The ids as the library spells them (``arXiv:1601.01705v2`` -> ``1601.01705``); None for no
    restriction; an InputError naming every id the library does not hold."""
    if not ids:
        return None
    out: list[str] = []
    unknown: list[str] = []
    for raw in ids:
        pid = raw.strip()
        if pid not in known:
            bare = bare_arxiv_id(pid)
            pid = next((c for c in (bare, _VERSION.sub("", bare)) if c in known), pid)
        if pid in known:
            out.append(pid)
        else:
            unknown.append(raw)
    if unknown:
        noun = "id" if len(unknown) == 1 else "ids"
        raise NotFoundError(
            f"unknown paper {noun}: {', '.join(repr(u) for u in unknown)} "
            f"(the library holds {len(known)} papers)",
            where=where,
            fix=PAPERS_FIX,
        )
    return list(dict.fromkeys(out))


class Library:
    """The built library, opened once: its store and embedder, the paper resolver, the reranker, the
    LLM and the agent over them, and the chat history. Safe to share between threads (the service holds
    one); close it (or use it as a context manager) to release the index, which one process at a time
    may hold open.

    ``llm`` and ``reranker`` replace the configured models (tests, or a service that built them); with
    ``llm`` None the configured LLM is loaded now (``progress`` follows a packaged model's first
    assembly), and the ``extractive`` provider answers without one.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        llm: LLM | None = None,
        reranker: Reranker | None = None,
        progress: AssemblyProgress | None = None,
    ) -> None:
        from arag.llm.factory import get_llm
        from arag.retrieval.hybrid import HybridRetriever
        from arag.retrieval.pipeline import make_retriever

        self.settings = settings if settings is not None else get_settings()
        self._lock = threading.Lock()
        self._closed = False
        store, embedder = open_for_search(self.settings)
        try:
            self._papers = list_papers(self.settings)
            self._ids = frozenset(r.id for r in self._papers)
            self.resolver = PaperResolver([(r.id, r.title) for r in self._papers])
            self._hybrid = hybrid = HybridRetriever(store, embedder, self.settings.retrieval, self.resolver)
            self.llm: LLM | None = llm if llm is not None else get_llm(self.settings, progress)
            self.retriever: Retriever = make_retriever(self.settings, store, hybrid, reranker, llm=self.llm)
            self.agent: Agent = build_agent(self.settings, self.retriever, self.llm)
            self.chat_history = ChatHistory(chat_db(self.settings))
        except BaseException:
            store.close()
            raise
        self._store = store
        self._embedder = embedder
        # Every paper's abstract vector, in the order of the paper list (related work): computed on
        # first use from the embedding cache, dropped when the paper list changes.
        self.abstract_vectors: np.ndarray | None = None
        self.vectors_lock: threading.Lock = threading.Lock()
        # One writer at a time: ingests queue behind each other, searches go on meanwhile.
        self._ingest_lock = threading.Lock()
        c = self.settings.chat
        self.rewriter = Rewriter(
            self.llm if c.rewrite_with_llm else None, self.resolver, history_turns=c.history_turns
        )

    # -- questions --------------------------------------------------------------------------------

    def ask(
        self, question: str, *, papers: Sequence[str] | None = None, on_event: EventCallback | None = None
    ) -> Answer:
        """Answer a question (optionally only from ``papers``); ``on_event`` sees each agent step."""
        self._check_open()
        flt = self._filter(papers)
        tool = paper_tools.tool_request(self, question, flt)
        if tool is not None:
            return paper_tools.collect(paper_tools.tool_stream(self, question, tool, None), on_event)
        return self.agent.run(question, flt, on_event=on_event)

    def stream(
        self, question: str, *, papers: Sequence[str] | None = None, hooks: RunHooks | None = None
    ) -> Iterator[NodeEvent | Answer]:
        """Each agent step as it finishes, then the answer. Bad input fails here, not on first use.
        ``hooks`` sees the answer's tokens and can cancel the run."""
        self._check_open()
        flt = self._filter(papers)
        validate_question(question)
        tool = paper_tools.tool_request(self, question, flt)
        if tool is not None:
            # "summarise <paper>" / "related work for <paper>": the tool, with its steps as events.
            return paper_tools.tool_stream(self, question, tool, hooks)
        return self.agent.stream(question, flt, hooks)

    # -- research tools around a paper ------------------------------------------------------------

    def summarise(
        self, paper_id: str, *, on_event: EventCallback | None = None, hooks: RunHooks | None = None
    ) -> PaperSummary:
        """A paper's problem, method, data, results and limits, each sentence cited [n] to a passage of
        the paper and checked against it (unsupported sentences dropped)."""
        self._check_open()
        return paper_tools.summarise(self, self.paper(paper_id), on_event=on_event, hooks=hooks)

    def related(self, paper_id: str, *, k: int = 5) -> RelatedPapers:
        """The ``k`` papers of the library nearest a paper (abstract vectors and shared terms, fused),
        each with a line on how it relates and its arXiv link."""
        self._check_open()
        if not 1 <= k <= 50:
            raise InputError(f"k must be 1 to 50, got {k}", where="k", fix="ask for 1 to 50 papers")
        return paper_tools.related(self, self.paper(paper_id), k)

    def map(self) -> LibraryMap:
        """The map of the library: each paper's 2-D point (from its abstract vector) and the topics."""
        self._check_open()
        return paper_tools.library_map(self.settings)

    def search(self, query: str, *, papers: Sequence[str] | None = None, k: int = 10) -> SearchResult:
        """Hybrid search and rerank without answering: the top ``k`` candidates (``ranked``) and the
        kept evidence, as ``arag search`` shows them."""
        self._check_open()
        if not query.strip():
            raise InputError("the query is empty", where="query", fix="give a question or keywords")
        if k < 1:
            raise InputError(f"k must be at least 1, got {k}", where="k", fix="ask for 1 or more passages")
        result = self.retriever.search(query.strip(), self._filter(papers))
        return result.model_copy(update={"ranked": result.ranked[:k]})

    @property
    def embedder(self) -> BaseEmbedder:
        """The embedding model the library was built with."""
        return self._embedder

    def papers(self, *, topic: int | None = None) -> list[PaperRow]:
        """The library's papers (as of opening), optionally those of one topic."""
        return [r for r in self._papers if topic is None or r.topic == topic]

    def check_papers(self, ids: Sequence[str] | None, *, where: str = "papers") -> list[str] | None:
        """Paper ids as the library spells them; an InputError for any it does not hold."""
        return check_paper_ids(ids, self._ids, where=where)

    def paper(self, paper_id: str) -> PaperRow:
        """One paper's record; a NotFoundError for an id the library does not hold."""
        ids = check_paper_ids([paper_id], self._ids, where="paper id")
        assert ids is not None
        return next(r for r in self._papers if r.id == ids[0])

    @property
    def embedder_id(self) -> str:
        """The embedding model the library was built with."""
        return self._embedder.model_id

    def chunk_count(self) -> int:
        """Chunks in the index now."""
        return self._store.count()

    # -- growing the library ----------------------------------------------------------------------

    def add_pdfs(self, paths: Sequence[Path], *, progress: Progress | None = None) -> BuildSummary:
        """Ingest PDFs through the open index while questions go on: each batch of papers is written
        whole before it is recorded, bad files are logged and skipped, and the paper list and title
        resolver are refreshed at the end."""
        from arag.library.manage import add_pdfs

        self._check_open()
        with self._ingest_lock:
            summary = add_pdfs(
                self.settings, paths, progress=progress, embedder=self._embedder, store=self._store
            )
            self.refresh()
        return summary

    def refresh(self) -> None:
        """Re-read the paper list (after papers were added) and rebuild the title resolver."""
        papers = list_papers(self.settings)
        self.resolver = PaperResolver([(r.id, r.title) for r in papers])
        self._papers, self._ids = papers, frozenset(r.id for r in papers)
        self.abstract_vectors = None
        self._hybrid.resolver = self.resolver
        self.rewriter.resolver = self.resolver

    # -- conversations ----------------------------------------------------------------------------

    def rewrite(self, session_id: str, message: str) -> Rewrite:
        """The standalone question a message of a session becomes (nothing is recorded)."""
        sid = validate_session_id(session_id)
        return self.rewriter.rewrite(validate_question(message), self.chat_history.exchanges(sid))

    def chat(
        self,
        session_id: str,
        message: str,
        *,
        rewrite: bool = True,
        papers: Sequence[str] | None = None,
        on_event: EventCallback | None = None,
        standalone: str | None = None,
    ) -> Answer:
        """One turn of a conversation: the message rewritten into a standalone question from the session's
        history (unless ``rewrite`` is False), answered, and recorded. ``answer.question`` is the question
        the agent was asked; ``standalone`` passes one the caller already rewrote (to show it first)."""
        sid = validate_session_id(session_id)
        message = validate_question(message)
        if standalone is None:
            standalone = self.rewrite(sid, message).question if rewrite else message
        answer = self.ask(standalone, papers=papers, on_event=on_event)
        self.chat_history.record(sid, message, answer.question, answer)
        return answer

    def history(self, session_id: str) -> list[Exchange]:
        """A session's exchanges, oldest first (none for a session never used)."""
        return self.chat_history.exchanges(validate_session_id(session_id))

    # -- lifecycle --------------------------------------------------------------------------------

    def _filter(self, papers: Sequence[str] | None) -> SearchFilter | None:
        ids = self.check_papers(papers)
        return SearchFilter(paper_ids=ids) if ids else None

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the library is closed", where="arag.Library", fix="open a new Library")

    def close(self) -> None:
        """Release the index (flushing it). Calling it twice is harmless; no call may be in flight."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._store.close()

    def __enter__(self) -> Library:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def ask(
    question: str,
    *,
    papers: Sequence[str] | None = None,
    settings: Settings | None = None,
    llm: LLM | None = None,
    reranker: Reranker | None = None,
    on_event: EventCallback | None = None,
) -> Answer:
    """Open the library, answer one question, close it. Hold a :class:`Library` to ask several."""
    validate_question(question)  # before the models load
    with Library(settings, llm=llm, reranker=reranker) as lib:
        return lib.ask(question, papers=papers, on_event=on_event)
