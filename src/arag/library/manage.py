"""The library's operations, shared by the CLI, benchmarks and (later) the API."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from arag.corpus.qasper import load_qasper
from arag.errors import InputError, StoreError
from arag.index.store import Store
from arag.library.build import BuildSummary, LibraryBuilder, Progress
from arag.library.state import Failure, LibraryState, PaperRow
from arag.models.embedder import BaseEmbedder
from arag.retrieval.resolve import PaperResolver
from arag.settings import Settings


def reset_library(settings: Settings) -> None:
    """Delete the index and the build state (the embedding cache is kept: vectors stay valid)."""
    from arag.index.factory import store_backend

    if store_backend(settings) == "qdrant":
        _drop_collection(settings)
    if settings.index_dir.exists():
        shutil.rmtree(settings.index_dir)
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(settings.state_db) + suffix)
        if p.exists():
            p.unlink()


def _drop_collection(settings: Settings) -> None:
    """Empty the server's collection (the state is deleted beside it: both start over)."""
    from arag.index.qdrant_server import QdrantServerStore

    state = LibraryState(settings.state_db)
    try:
        dim = state.get_meta("embedding_dim")
    finally:
        state.close()
    if dim is None or not settings.qdrant_url:
        return
    key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key is not None else None
    try:
        store = QdrantServerStore.open(
            settings.qdrant_url, int(dim), collection=settings.store.collection, api_key=key, create=False
        )
    except StoreError:
        return  # no collection: nothing to drop
    try:
        store.drop()
    finally:
        store.close()


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
    state = LibraryState(settings.state_db)
    try:
        pending = state.get_meta(PENDING_KEY)
        rows = state.papers()
        last = state.get_meta("last_build")
    finally:
        state.close()
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
    embedder: BaseEmbedder | None = None,
    store: Store | None = None,
    lock: AbstractContextManager[object] | None = None,
) -> BuildSummary:
    """Build (or bring up to date) the default QASPER library. ``embedder``, ``store`` and ``lock``:
    build through an index this process holds open (the service's background build)."""
    if rebuild:
        reset_library(settings)
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


def open_for_building(settings: Settings) -> tuple[Store, BaseEmbedder]:
    """The library's store and embedder, created empty when there is no library yet (the service
    opens it so, and builds it in the background); a ConfigError when the embedding model changed."""
    from arag.index.factory import open_store
    from arag.library.build import check_model
    from arag.models.embedder import get_embedder

    embedder = get_embedder(settings.embedding, settings.embedding_cache_db)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    state = LibraryState(settings.state_db)
    try:
        check_model(state, embedder, settings)
    finally:
        state.close()
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
    papers, failures = papers_from_paths(list(paths))
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

    state = LibraryState(settings.state_db)
    try:
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
        state_bytes = sum(
            p.stat().st_size for p in settings.data_dir.glob(settings.state_db.name + "*") if p.is_file()
        )
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
    finally:
        state.close()


def list_papers(settings: Settings, *, topic: int | None = None) -> list[PaperRow]:
    """The papers in the library, optionally those of one topic."""
    state = LibraryState(settings.state_db)
    try:
        return state.papers(topic=topic)
    finally:
        state.close()


def open_for_search(settings: Settings) -> tuple[Store, BaseEmbedder]:
    """The built library's store and the embedder it was built with; a clear error if none."""
    from arag.index.factory import open_store
    from arag.models.embedder import get_embedder

    state = LibraryState(settings.state_db)
    try:
        model = state.get_meta("embedding_model")
        dim = state.get_meta("embedding_dim")
        n = len(state.build_keys())
    finally:
        state.close()
    if model is None or dim is None or n == 0:
        raise InputError(
            f"there is no library in {settings.data_dir}",
            where="ARAG_DATA_DIR",
            fix="build it first: arag library build",
        )
    embedder = get_embedder(settings.embedding, settings.embedding_cache_db)
    if embedder.model_id != model:
        raise InputError(
            f"the library was built with {model!r} but the settings select {embedder.model_id!r}",
            where="ARAG_EMBEDDING__*",
            fix="set the embedding settings back, or rebuild: arag library build --rebuild",
        )
    return open_store(settings, int(dim), create=False), embedder


def load_resolver(settings: Settings) -> PaperResolver:
    """A paper resolver over the library's titles."""
    from arag.retrieval.resolve import PaperResolver

    return PaperResolver([(r.id, r.title) for r in list_papers(settings)])
