"""What both Qdrant backends (Edge and server) store: the named vectors, the indexed payload fields,
the point id of a chunk, and the filters that can match nothing; plus the on-disk size of a local index."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from arag.records import SearchFilter

DENSE = "dense"
SPARSE = "bm25"
KEYWORD_FIELDS = ("paper_id", "type")
INTEGER_FIELDS = ("year", "topic")


def point_id(chunk_id: str) -> str:
    """The engine's point id for a chunk id (Qdrant ids must be integers or UUIDs)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, chunk_id))


def matches_nothing(flt: SearchFilter | None) -> bool:
    """An empty id/type/topic list, or an empty year range, selects no chunk at all."""
    if flt is None:
        return False
    if any(v is not None and len(v) == 0 for v in (flt.paper_ids, flt.types, flt.topics)):
        return True
    return flt.year_min is not None and flt.year_max is not None and flt.year_min > flt.year_max


def directory_size(path: Path) -> int:
    """Bytes allocated on disk under ``path``.

    The engine preallocates sparse files (32 MiB pages, mostly holes), so allocated blocks,
    not apparent sizes, say what the index really costs; st_size is the fallback where the
    platform has no st_blocks.
    """
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue  # a segment file replaced by the optimizer while we walked
            blocks = getattr(st, "st_blocks", None)
            total += blocks * 512 if blocks is not None else st.st_size
    return total
