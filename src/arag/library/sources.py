"""The sources of added papers, kept in the data directory so that a rebuild can add them again.

Every paper added from a PDF (``arag library add``, ``POST /ingest``, arXiv downloads) has its file
kept as ``<data dir>/sources/<paper id>.pdf`` (a hard link where the file system allows, else a
copy) before the paper is recorded; the user may then move or delete the original. A library built
before sources were kept falls back to the path the paper was added from.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from arag.library.state import Failure, PaperRow
from arag.records import Paper
from arag.settings import PdfSettings, Settings

log = logging.getLogger(__name__)


def sources_dir(settings: Settings) -> Path:
    return settings.data_dir / "sources"


def stored_source(settings: Settings, paper_id: str) -> Path:
    """Where the file of an added paper is kept."""
    return sources_dir(settings) / (re.sub(r"[^A-Za-z0-9._-]", "_", paper_id) + ".pdf")


def is_added(source: str) -> bool:
    """Papers of these sources came from a file and are re-added from it on a rebuild."""
    return source in ("pdf", "arxiv")


def keep_sources(settings: Settings, papers: Sequence[Paper]) -> None:
    """Keep the file of each added paper (no-op for QASPER papers and files already kept)."""
    for p in papers:
        if not is_added(p.source) or not p.source_path:
            continue
        dest = stored_source(settings, p.id)
        if dest.exists():
            continue
        src = Path(p.source_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".tmp")
        try:
            tmp.unlink(missing_ok=True)
            try:
                os.link(src, tmp)
            except OSError:  # another file system, or links not allowed
                shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
        except OSError as exc:
            # The paper is indexed all the same; a rebuild falls back to the original path.
            log.warning("could not keep a copy of %s for rebuilds: %s", src, exc)


def locate_sources(settings: Settings, rows: Sequence[PaperRow]) -> tuple[dict[str, Path], list[PaperRow]]:
    """For each added paper, the file to re-add it from (kept copy first, then the original);
    and the added papers whose file is nowhere."""
    found: dict[str, Path] = {}
    missing: list[PaperRow] = []
    for r in rows:
        if not is_added(r.source):
            continue
        kept = stored_source(settings, r.id)
        if kept.is_file():
            found[r.id] = kept
        elif r.source_path and Path(r.source_path).is_file():
            found[r.id] = Path(r.source_path)
        else:
            missing.append(r)
    return found, missing


def papers_from_sources(
    rows: Sequence[PaperRow], files: dict[str, Path], limits: PdfSettings
) -> tuple[list[Paper], list[Failure]]:
    """Parse the added papers again from their files, under the ids and paths they were added with."""
    from arag.corpus.pdf import papers_from_paths

    by_id = {r.id: r for r in rows}
    paths = [files[pid] for pid in sorted(files)]
    owner = {str(path): pid for pid, path in files.items()}
    parsed, failed = papers_from_paths(paths, limits)
    papers = []
    for p in parsed:
        row = by_id[owner[str(p.source_path)]]
        same = {"id": row.id, "source": row.source, "source_path": row.source_path}
        papers.append(p.model_copy(update=same))
    failures = [
        Failure(key=by_id[owner[f.path]].id if f.path in owner else f.path, source="pdf", reason=f.reason)
        for f in failed
    ]
    return papers, failures
