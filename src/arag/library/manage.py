"""The library's operations, shared by the CLI, benchmarks and the API."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from arag.corpus.qasper import load_qasper
from arag.errors import InputError
from arag.index.store import Store
from arag.library.build import BuildSummary, LibraryBuilder, Progress
from arag.library.rebuild import rebuild_library
from arag.library.state import Failure, LibraryState, PaperRow
from arag.models.embedder import BaseEmbedder
from arag.retrieval.resolve import PaperResolver
from arag.settings import Settings

if TYPE_CHECKING:
    from arag.llm.base import LLM
    from arag.models.reranker import Reranker
    from arag.retrieval.pipeline import Retriever


# Written when a build of the default library starts and removed when it ends: a library that still
# has it was interrupted (killed, stopped), and `arag serve` resumes that build.
PENDING_KEY = "build_pending"


class BuildTarget(BaseModel):
    """The default-library build a data directory needs: what it was asked to hold, and why."""

    max_papers: int | None = None
    paper_ids: list[str] | None = None
    reason: Literal["empty", "interrupted"]


def pending_build(settings: Settings) -> BuildTarget | None:
    """The build ``arag serve`` should run in the background: the default library when the data
    directory holds no paper yet, or the build that was interrupted (as it was asked); None when the
    library is complete (or was never a default library). Reads the state only: no model, no corpus."""
    if not settings.state_db.exists():
        return BuildTarget(
            max_papers=settings.corpus.max_papers, paper_ids=settings.corpus.paper_ids, reason="empty"
        )
    with LibraryState(settings.state_db) as state:
        pending = state.get_meta(PENDING_KEY)
        rows = state.papers()
        last = state.get_meta("last_build")
    if isinstance(pending, dict):
        return BuildTarget(**pending, reason="interrupted")
    if not rows:
        return BuildTarget(
            max_papers=settings.corpus.max_papers, paper_ids=settings.corpus.paper_ids, reason="empty"
        )
    if last is None and any(r.source == "qasper" for r in rows):
        # Built before builds were marked pending, and never finished.
        return BuildTarget(
            max_papers=settings.corpus.max_papers, paper_ids=settings.corpus.paper_ids, reason="interrupted"
        )
    return None


def build_library(
    settings: Settings,
    *,
    progress: Progress | None = None,
    rebuild: bool = False,
    drop_missing: bool = False,
    embedder: BaseEmbedder | None = None,
    store: Store | None = None,
    lock: AbstractContextManager[object] | None = None,
) -> BuildSummary:
    """Build (or bring up to date) the default QASPER library. ``rebuild``: build it again from
    scratch beside the current one, with every added paper, then switch (see library.rebuild);
    ``drop_missing``: leave out added papers whose source file is gone instead of refusing.
    ``embedder``, ``store`` and ``lock``: build through an index this process holds open (the
    service's background build)."""
    if rebuild:
        return rebuild_library(settings, progress=progress, drop_missing=drop_missing)
    papers, corpus_failures = load_qasper(
        settings.corpus.qasper_path,
        max_papers=settings.corpus.max_papers,
        paper_ids=settings.corpus.paper_ids,
    )
    prior = [Failure(key=e.where or "qasper", source="qasper", reason=e.what) for e in corpus_failures]
    with LibraryBuilder(settings, embedder=embedder, store=store, lock=lock) as builder:
        target = {"max_papers": settings.corpus.max_papers, "paper_ids": settings.corpus.paper_ids}
        builder.state.set_meta(PENDING_KEY, target)
        summary = builder.index_papers(papers, progress=progress, prior_failures=prior)
        builder.state.set_meta("last_build", summary.model_dump(exclude={"failures"}))
        builder.state.delete_meta(PENDING_KEY)
    return summary


def open_for_building(settings: Settings, embedder: BaseEmbedder | None = None) -> tuple[Store, BaseEmbedder]:
    """The library's store and embedder (``embedder``, else the configured one), created empty when
    there is no library yet (the service opens it so, and builds it in the background); a
    ConfigError when the embedding model changed."""
    from arag.index.factory import open_store
    from arag.library.build import check_model
    from arag.models.factory import library_embedder

    embedder = embedder or library_embedder(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with LibraryState(settings.state_db) as state:
        check_model(state, embedder, settings)
    return open_store(settings, embedder.dim), embedder


def add_pdfs(
    settings: Settings,
    paths: Sequence[Path],
    *,
    progress: Progress | None = None,
    embedder: BaseEmbedder | None = None,
    store: Store | None = None,
    lock: AbstractContextManager[object] | None = None,
) -> BuildSummary:
    """Ingest PDFs (files or folders) into the library; bad files are logged and skipped. ``store``
    and ``embedder``: write through an index this process holds open (the service)."""
    from arag.corpus.pdf import papers_from_paths

    missing = [p for p in paths if not p.exists()]
    if missing:
        raise InputError(
            f"no such file or directory: {', '.join(map(str, missing))}",
            where="arag library add",
            fix="check the paths (a PDF file or a folder of PDFs)",
        )
    papers, failures = papers_from_paths(list(paths), settings.pdf)
    prior = [Failure(key=f.path, source="pdf", reason=f.reason) for f in failures]
    with LibraryBuilder(settings, embedder=embedder, store=store, lock=lock) as builder:
        return builder.index_papers(papers, progress=progress, prior_failures=prior)


class LibraryStatus(BaseModel):
    """What ``arag library status`` shows."""

    data_dir: str
    papers: int
    papers_by_source: dict[str, int]
    chunks: int
    chunks_by_type: dict[str, int]
    embedding_model: str | None
    embedding_dim: int | None
    index_bytes: int
    state_bytes: int
    topics: dict[str, str]
    failures: list[Failure]
    last_build: dict | None


def library_status(settings: Settings) -> LibraryStatus:
    """Figures about the library on disk; does not load any model."""
    from arag.index.factory import open_store, store_backend

    with LibraryState(settings.state_db) as state:
        rows = state.papers()
        dim = state.get_meta("embedding_dim")
        by_source: dict[str, int] = {}
        for r in rows:
            by_source[r.source] = by_source.get(r.source, 0) + 1
        chunks_by_type: dict[str, int] = {}
        index_bytes = 0
        if dim is not None and (settings.index_dir.exists() or store_backend(settings) == "qdrant"):
            store = open_store(settings, int(dim), create=False)
            try:
                chunks_by_type = store.count_by_type()
                index_bytes = store.size_bytes()
            finally:
                store.close()
        db = settings.state_db
        state_bytes = sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())
        return LibraryStatus(
            data_dir=str(settings.data_dir),
            papers=len(rows),
            papers_by_source=by_source,
            chunks=sum(chunks_by_type.values()),
            chunks_by_type=chunks_by_type,
            embedding_model=state.get_meta("embedding_model"),
            embedding_dim=dim,
            index_bytes=index_bytes,
            state_bytes=state_bytes,
            topics=state.get_meta("topic_labels") or {},
            failures=state.failures(),
            last_build=state.get_meta("last_build"),
        )


def list_papers(settings: Settings, *, topic: int | None = None) -> list[PaperRow]:
    """The papers in the library, optionally those of one topic."""
    with LibraryState(settings.state_db) as state:
        return state.papers(topic=topic)


def open_for_search(settings: Settings) -> tuple[Store, BaseEmbedder]:
    """The built library's store and the embedder it was built with; a clear error if none."""
    store, embedder, _ = _open_search(settings, with_papers=False)
    return store, embedder


def _open_search(
    settings: Settings, *, with_papers: bool, embedder: BaseEmbedder | None = None
) -> tuple[Store, BaseEmbedder, list[PaperRow]]:
    """The store, the embedder (``embedder``, else the configured one) and (``with_papers``) the
    papers, from one visit to the build state."""
    from arag.index.factory import open_store
    from arag.models.factory import library_embedder

    with LibraryState(settings.state_db) as state:
        model = state.get_meta("embedding_model")
        dim = state.get_meta("embedding_dim")
        n = len(state.build_keys())
        papers = state.papers() if with_papers else []
    if model is None or dim is None or n == 0:
        raise InputError(
            f"there is no library in {settings.data_dir}",
            where="ARAG_DATA_DIR",
            fix="build it first: arag library build",
        )
    embedder = embedder or library_embedder(settings)
    if embedder.model_id != model:
        raise InputError(
            f"the library was built with {model!r} but the settings select {embedder.model_id!r}",
            where="ARAG_EMBEDDING__*",
            fix="set the embedding settings back, or rebuild: arag library build --rebuild",
        )
    return open_store(settings, int(dim), create=False), embedder, papers


class OpenRetrieval:
    """Retrieval over the open library: its store and embedder, its papers and their resolver, the
    hybrid retriever with paper resolution (``hybrid``) and without (``plain``), and the reranking
    retriever (``retriever``, loaded on first use). Close it (or use it in ``with``) to release the store."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        embedder: BaseEmbedder,
        papers: list[PaperRow],
        reranker: Reranker | None = None,
        llm: LLM | None = None,
    ) -> None:
        from arag.retrieval.hybrid import HybridRetriever

        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.papers = papers
        self.resolver = PaperResolver([(r.id, r.title) for r in papers])
        self.hybrid = HybridRetriever(store, embedder, settings.retrieval, self.resolver)
        self.plain = HybridRetriever(store, embedder, settings.retrieval)
        self._reranker = reranker
        self._llm = llm
        self._retriever: Retriever | None = None

    @property
    def retriever(self) -> Retriever:
        """The reranking retriever with the reranker (None: the configured one) and LLM it was opened with."""
        if self._retriever is None:
            self._retriever = self.reranking()
        return self._retriever

    def reranking(
        self, settings: Settings | None = None, reranker: Reranker | None = None, llm: LLM | None = None
    ) -> Retriever:
        """A reranking retriever over ``hybrid`` with other settings, reranker or LLM (the opened ones
        where None)."""
        from arag.retrieval.pipeline import make_reranking_retriever

        return make_reranking_retriever(
            settings if settings is not None else self.settings,
            self.store,
            self.hybrid,
            reranker if reranker is not None else self._reranker,
            llm=llm if llm is not None else self._llm,
        )

    def close(self) -> None:
        """Release the store."""
        self.store.close()

    def __enter__(self) -> OpenRetrieval:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_retrieval(
    settings: Settings,
    *,
    reranker: Reranker | None = None,
    llm: LLM | None = None,
    allow_empty: bool = False,
    embedder: BaseEmbedder | None = None,
) -> OpenRetrieval:
    """Open the built library for retrieval (one visit to the build state): use it in ``with``.
    ``reranker`` and ``llm`` are what ``.retriever`` uses (None: the configured reranker, no LLM);
    ``allow_empty``: create the library when there is none yet (the service builds it behind);
    ``embedder``: the query embedder (None: the configured one, with its cache), which must be the
    model the library was built with."""
    if allow_empty:
        store, embedder = open_for_building(settings, embedder)
        try:
            papers = list_papers(settings)
        except BaseException:
            store.close()
            raise
    else:
        store, embedder, papers = _open_search(settings, with_papers=True, embedder=embedder)
    try:
        return OpenRetrieval(settings, store, embedder, papers, reranker, llm)
    except BaseException:
        store.close()
        raise


def load_resolver(settings: Settings) -> PaperResolver:
    """A paper resolver over the library's titles."""
    from arag.retrieval.resolve import PaperResolver

    return PaperResolver([(r.id, r.title) for r in list_papers(settings)])
