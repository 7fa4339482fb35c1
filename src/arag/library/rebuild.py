"""``arag library build --rebuild``: a new library generation built beside the current one, then
switched to in one atomic rename, so a crash at any point leaves the old library or the new one.

1. Take the library lock exclusively: a process that has the library open (``arag serve``, a
   search, a build) makes the rebuild stop at once with an error naming it.
2. Name the next generation in ``<data dir>/generation.next`` (or resume the one a killed rebuild
   named there: the build inside it resumes per paper, like any build).
3. Build it in ``<data dir>/generations/<name>``: the QASPER papers of the settings, and every paper
   added from a PDF or an arXiv id, parsed again from its kept source file.
4. Commit: ``generation.next`` is renamed over ``<data dir>/generation``, the pointer every process
   reads (:meth:`Settings.generation`). Before this rename the old library is the library; after it,
   the new one.
5. Delete the old generation (and any folder a killed rebuild left that no pointer names).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from arag.corpus.qasper import load_qasper
from arag.errors import ConfigError, InputError, StoreError
from arag.index.factory import store_backend
from arag.index.lock import acquire
from arag.library.build import BuildSummary, LibraryBuilder, Progress
from arag.library.sources import locate_sources, papers_from_sources
from arag.library.state import Failure, LibraryState, PaperRow
from arag.settings import GENERATION_NAME, GENERATION_POINTER, Settings

log = logging.getLogger(__name__)
NEXT_POINTER = GENERATION_POINTER + ".next"


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _pending(settings: Settings) -> str | None:
    """The generation a killed rebuild was writing, if its folder is still there."""
    try:
        name = (settings.data_dir / NEXT_POINTER).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not GENERATION_NAME.match(name) or name == settings.generation():
        return None
    return name if (settings.data_dir / "generations" / name).is_dir() else None


def _start_generation(settings: Settings) -> str:
    name = f"gen-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    (settings.data_dir / "generations" / name).mkdir(parents=True)
    _write_atomic(settings.data_dir / NEXT_POINTER, name + "\n")
    return name


def _remove_generation(settings: Settings, name: str) -> None:
    """Delete a generation that is not the library (its folder, or for "" the data dir's own files)."""
    old = settings.at_generation(name)
    if store_backend(settings) == "qdrant":
        _drop_collection(old)
    if name:
        shutil.rmtree(old.library_dir, ignore_errors=True)
        return
    shutil.rmtree(old.index_dir, ignore_errors=True)
    for suffix in ("", "-wal", "-shm"):
        Path(str(old.state_db) + suffix).unlink(missing_ok=True)


def _drop_collection(settings: Settings) -> None:
    """Delete a generation's collection on the Qdrant server (nothing when there is none)."""
    from arag.index.qdrant_server import QdrantServerStore

    if not settings.state_db.exists() or not settings.qdrant_url:
        return
    with LibraryState(settings.state_db) as state:
        dim = state.get_meta("embedding_dim")
    if dim is None:
        return
    try:
        store = QdrantServerStore.open(
            settings.qdrant_url,
            int(dim),
            collection=settings.collection,
            api_key=settings.qdrant_key,
            create=False,
        )
    except StoreError:
        return  # no collection: nothing to drop
    try:
        store.drop()
    finally:
        store.close()


def _clean_leftovers(settings: Settings, keep: set[str]) -> None:
    """Generations no pointer names ("" : the data dir's own library): what a rebuild killed before
    its commit or its cleanup left."""
    legacy = settings.at_generation("")
    if "" not in keep and (legacy.index_dir.exists() or legacy.state_db.exists()):
        # The first library (in the data dir itself), which a killed rebuild did not finish deleting.
        _remove_generation(settings, "")
    root = settings.data_dir / "generations"
    if not root.is_dir():
        return
    for d in root.iterdir():
        if d.is_dir() and d.name not in keep and GENERATION_NAME.match(d.name):
            log.info("removing the leftover library generation %s", d)
            _remove_generation(settings, d.name)


def _added_rows(settings: Settings) -> list[PaperRow]:
    if not settings.state_db.exists():
        return []
    with LibraryState(settings.state_db) as state:
        return [r for r in state.papers() if r.source != "qasper"]


def rebuild_library(
    settings: Settings, *, progress: Progress | None = None, drop_missing: bool = False
) -> BuildSummary:
    """Build the library again from its sources beside the current one, then switch to it."""
    with acquire(settings.data_dir, exclusive=True):
        current = settings.generation()
        added = _added_rows(settings)
        files, missing = locate_sources(settings, added)
        if missing and not drop_missing:
            listed = ", ".join(f"{r.id} (added from {r.source_path})" for r in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise InputError(
                f"{len(missing)} added papers have no source file left to rebuild them from: {listed}{more}",
                where=str(settings.data_dir),
                fix="put the files back where they were added from, or rebuild without them: "
                "arag library build --rebuild --drop-missing",
            )
        papers, corpus_failures = load_qasper(
            settings.corpus.qasper_path,
            max_papers=settings.corpus.max_papers,
            paper_ids=settings.corpus.paper_ids,
        )
        prior = [Failure(key=e.where or "qasper", source="qasper", reason=e.what) for e in corpus_failures]
        pdf_papers, pdf_failures = papers_from_sources(added, files, settings.pdf)
        taken = {p.id for p in papers}
        papers += [p for p in pdf_papers if p.id not in taken]
        prior += pdf_failures

        name = _pending(settings)
        _clean_leftovers(settings, {current, name} if name else {current})
        builder: LibraryBuilder | None = None
        if name is not None:
            try:
                builder = LibraryBuilder(settings.at_generation(name))
                log.info("resuming the rebuild in generation %s", name)
            except ConfigError:  # the settings changed since: that half-built generation is no use
                _remove_generation(settings, name)
                name = None
        if builder is None or name is None:
            name = _start_generation(settings)
            builder = LibraryBuilder(settings.at_generation(name))
        with builder:
            # A resumed generation may hold papers the settings no longer ask for (fewer papers).
            wanted = {p.id for p in papers}
            extra = sorted(pid for pid in builder.state.build_keys() if pid not in wanted)
            for pid in extra:
                builder.store.delete_paper(pid)
            builder.store.flush()
            builder.state.forget_papers(extra)
            summary = builder.index_papers(papers, progress=progress, prior_failures=prior)
            if extra and not summary.topics_updated:
                builder.update_topics()
            builder.state.set_meta("last_build", summary.model_dump(exclude={"failures"}))
        # The commit: from this rename on, every process that opens the library opens the new one.
        os.replace(settings.data_dir / NEXT_POINTER, settings.data_dir / GENERATION_POINTER)
        _fsync_dir(settings.data_dir)
        _remove_generation(settings, current)
        _clean_leftovers(settings, {name})
        return summary
