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
from arag.agent.chat_history import ChatHistory, Exchange, chat_db, validate_session_id
from arag.agent.follow_up import Rewrite, Rewriter
from arag.agent.graph import Agent, build_agent, validate_question
from arag.agent.hooks import RunHooks
from arag.agent.related import RelatedPapers
from arag.agent.summary import PaperSummary
from arag.corpus.arxiv_ids import bare_arxiv_id
from arag.errors import InputError, NotFoundError, StoreError
from arag.index.store import Store
from arag.library.build import BuildSummary, Progress
from arag.library.manage import list_papers, open_retrieval
from arag.library.map import LibraryMap
from arag.library.state import PaperRow
from arag.llm.base import LLM
from arag.llm.gguf import AssemblyProgress
from arag.llm.process import ProcessInfo
from arag.models.embedder import BaseEmbedder
from arag.models.reranker import Reranker
from arag.records import Answer, Coverage, NodeEvent, SearchFilter
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
    assembly), and the ``extractive`` provider answers without one. ``allow_empty``: open a library
    that has no paper yet (created empty), to build it with :meth:`build_default` while it answers.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        llm: LLM | None = None,
        reranker: Reranker | None = None,
        progress: AssemblyProgress | None = None,
        allow_empty: bool = False,
    ) -> None:
        from arag.llm.factory import get_llm

        self.settings = settings if settings is not None else get_settings()
        self._max_chars = self.settings.agent.max_question_chars
        self._lock = threading.Lock()
        # Held around every write to the index and its record in the build state, and by close():
        # the index is never closed under a write.
        self._store_lock = threading.Lock()
        self._closed = False
        # Papers a running build has still to index (0 when none runs).
        self._pending = 0
        self._building = False
        # False once a build was expected and until one ends: a failed build leaves the library partial.
        self._complete = True
        retrieval = open_retrieval(self.settings, reranker=reranker, allow_empty=allow_empty)
        try:
            self._papers = retrieval.papers
            self._ids = frozenset(r.id for r in self._papers)
            self.resolver = retrieval.resolver
            self._hybrid = retrieval.hybrid
            # A model this library loaded is this library's to stop (a local one runs in processes).
            self._owns_llm = llm is None
            self.llm: LLM | None = llm if llm is not None else get_llm(self.settings, progress)
            self.retriever: Retriever = retrieval.reranking(llm=self.llm)
            self.agent: Agent = build_agent(self.settings, self.retriever, self.llm)
            self.chat_history = ChatHistory(chat_db(self.settings))
        except BaseException:
            retrieval.close()
            close_llm = getattr(getattr(self, "llm", None), "close", None)
            if llm is None and close_llm is not None:
                close_llm()
            raise
        self._store = retrieval.store
        self._embedder = retrieval.embedder
        # Every paper's abstract vector, in the order of the paper list (related work): computed on
        # first use from the embedding cache, dropped when the paper list changes.
        self.abstract_vectors: np.ndarray | None = None
        self.vectors_lock: threading.Lock = threading.Lock()
        # One writer at a time: ingests queue behind each other, searches go on meanwhile.
        self._ingest_lock = threading.Lock()
        c = self.settings.chat
        self.rewriter = Rewriter(
            self.llm if c.rewrite_with_llm else None,
            self.resolver,
            history_turns=c.history_turns,
            max_chars=self._max_chars,
        )

    # -- questions --------------------------------------------------------------------------------

    def ask(
        self, question: str, *, papers: Sequence[str] | None = None, on_event: EventCallback | None = None
    ) -> Answer:
        """Answer a question (optionally only from ``papers``); ``on_event`` sees each agent step."""
        self._check_open()
        coverage = self.coverage()
        flt = self._filter(papers)
        validate_question(question, self._max_chars)  # before the paper tools' rules read it
        tool = paper_tools.tool_request(self, question, flt)
        if tool is not None:
            answer = paper_tools.collect(paper_tools.tool_stream(self, question, tool, None), on_event)
        else:
            answer = self.agent.run(question, flt, on_event=on_event)
        answer.coverage = coverage
        return answer

    def stream(
        self, question: str, *, papers: Sequence[str] | None = None, hooks: RunHooks | None = None
    ) -> Iterator[NodeEvent | Answer]:
        """Each agent step as it finishes, then the answer. Bad input fails here, not on first use.
        ``hooks`` sees the answer's tokens and can cancel the run."""
        self._check_open()
        flt = self._filter(papers)
        validate_question(question, self._max_chars)
        tool = paper_tools.tool_request(self, question, flt)
        if tool is not None:
            # "summarise <paper>" / "related work for <paper>": the tool, with its steps as events.
            return _with_coverage(paper_tools.tool_stream(self, question, tool, hooks), self.coverage())
        return _with_coverage(self.agent.stream(question, flt, hooks), self.coverage())

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
        query = validate_question(query, self._max_chars, what="query")
        if k < 1:
            raise InputError(f"k must be at least 1, got {k}", where="k", fix="ask for 1 or more passages")
        result = self.retriever.search(query, self._filter(papers))
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
        try:
            return check_paper_ids(ids, self._ids, where=where)
        except NotFoundError as exc:
            if not self._building:
                raise
            cov = self.coverage()
            raise NotFoundError(
                f"{exc.what}; the library is still being built ({cov.papers} of {cov.of} papers "
                "indexed so far)",
                where=exc.where,
                fix="retry once the paper is indexed (GET /ready shows the build's progress), "
                + (exc.fix or ""),
            ) from exc

    def paper(self, paper_id: str) -> PaperRow:
        """One paper's record; a NotFoundError for an id the library does not hold."""
        ids = check_paper_ids([paper_id], self._ids, where="paper id")
        assert ids is not None
        return next(r for r in self._papers if r.id == ids[0])

    @property
    def embedder_id(self) -> str:
        """The embedding model the library was built with."""
        return self._embedder.model_id

    def llm_processes(self) -> list[ProcessInfo]:
        """The local model's processes (pid, state, restarts, last exit, build); none for a hosted
        LLM, the extractive mode or a model passed in without supervision."""
        inner = getattr(self.llm, "inner", self.llm)
        info = getattr(inner, "info", None)
        return list(info()) if callable(info) else []

    def chunk_count(self) -> int:
        """Chunks in the index now."""
        return self._store.count()

    @property
    def store(self) -> Store:
        """The open index, for in-process work that reads it (the service's reranker training)."""
        return self._store

    def coverage(self) -> Coverage:
        """How much of the library a search now covers: the papers indexed so far, of those it will
        hold once a running build ends."""
        n = len(self._papers)
        return Coverage(papers=n, of=n + self._pending, complete=self._complete and not self._building)

    @property
    def building(self) -> bool:
        """Whether a build of the default library runs through this library now."""
        return self._building

    @property
    def reranker_name(self) -> str:
        return self.retriever.stage.reranker.name

    def expect_build(self) -> None:
        """Mark the library as being built from now on (the build itself starts a moment later)."""
        self._building = True
        self._complete = False

    def set_reranker(self, reranker: Reranker) -> None:
        """Rerank with ``reranker`` from the next search on (a model trained while serving)."""
        self.retriever.stage.reranker = reranker

    # -- growing the library ----------------------------------------------------------------------

    def add_pdfs(self, paths: Sequence[Path], *, progress: Progress | None = None) -> BuildSummary:
        """Ingest PDFs through the open index while questions go on: each batch of papers is written
        whole before it is recorded, bad files are logged and skipped, and the paper list and title
        resolver are refreshed at the end."""
        from arag.library.manage import add_pdfs

        self._check_open()
        with self._ingest_lock:
            summary = add_pdfs(
                self.settings,
                paths,
                progress=progress,
                embedder=self._embedder,
                store=self._store,
                lock=self._store_lock,
            )
            self.refresh()
        return summary

    def build_default(
        self,
        *,
        max_papers: int | None = None,
        paper_ids: Sequence[str] | None = None,
        progress: Progress | None = None,
        embedder: BaseEmbedder | None = None,
    ) -> BuildSummary:
        """Build (or resume) the default library through the open index while questions go on,
        exactly as ``arag library build`` does: batch by batch, each written whole before it is
        recorded. Searches see each batch once it is recorded (the paper list is refreshed). The
        build embeds with ``embedder``, or a model of its own made in the calling thread (so its
        threads take that thread's priority), never the one queries use."""
        from arag.library.manage import build_library
        from arag.models.factory import library_embedder

        self._check_open()
        corpus = self.settings.corpus.model_copy(
            update={"max_papers": max_papers, "paper_ids": list(paper_ids) if paper_ids else None}
        )
        settings = self.settings.model_copy(update={"corpus": corpus})
        outer = progress or Progress()

        def start(total: int) -> None:
            self._pending = total
            outer.start(total)

        def advance(n: int) -> None:
            self.refresh()
            self._pending = max(0, self._pending - n)
            outer.advance(n)

        emb = embedder or library_embedder(settings)
        owned = embedder is None
        with self._ingest_lock:
            self._building, self._complete = True, False
            try:
                summary = build_library(
                    settings,
                    progress=Progress(start=start, advance=advance, written=outer.written),
                    embedder=emb,
                    store=self._store,
                    lock=self._store_lock,
                )
                self._complete, self._pending = True, 0
                return summary
            finally:
                self._building = False
                if owned:
                    emb.close()
                if not self._closed:
                    self.refresh()

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
        return self.rewriter.rewrite(
            validate_question(message, self._max_chars), self.chat_history.exchanges(sid)
        )

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
        message = validate_question(message, self._max_chars)
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
        with self._lock, self._store_lock:
            if self._closed:
                return
            self._closed = True
            self._store.close()
            close_llm = getattr(self.llm, "close", None)
            if self._owns_llm and close_llm is not None:
                close_llm()

    def __enter__(self) -> Library:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _with_coverage(items: Iterator[NodeEvent | Answer], coverage: Coverage) -> Iterator[NodeEvent | Answer]:
    for item in items:
        if isinstance(item, Answer):
            item.coverage = coverage
        yield item


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
    settings = settings if settings is not None else get_settings()
    validate_question(question, settings.agent.max_question_chars)  # before the models load
    with Library(settings, llm=llm, reranker=reranker) as lib:
        return lib.ask(question, papers=papers, on_event=on_event)
