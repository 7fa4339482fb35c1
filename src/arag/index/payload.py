"""What both Qdrant backends (Edge and server) store: the named vectors, the indexed payload fields,
the point id of a chunk, and the filters that can match nothing; plus the on-disk size of a local index.

Also the engine-independent halves of the store operations both backends run: checking what is
written and searched against the index's dimension, grouping papers by topic, counting papers from
their payloads, and turning retrieved records back into chunks and vectors."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arag.errors import StoreError
from arag.index.store import PaperCount
from arag.records import Chunk, SearchFilter, SparseVector

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


def checked_rows(
    chunks: Sequence[Chunk], dense: np.ndarray, sparse: Sequence[SparseVector], dim: int, where: str
) -> np.ndarray:
    """``dense`` as float32, after checking one ``dim``-wide row and one sparse vector per chunk."""
    dense = np.asarray(dense, dtype=np.float32)
    if dense.shape != (len(chunks), dim) or len(sparse) != len(chunks):
        raise StoreError(
            f"upsert got {len(chunks)} chunks, dense {dense.shape}, {len(sparse)} sparse vectors; "
            f"expected dense ({len(chunks)}, {dim}) and one sparse vector per chunk",
            where=where,
            fix="this is a bug in the caller: embed every chunk with the index's model",
        )
    return dense


def checked_query(vector: np.ndarray, dim: int, where: str, fix: str) -> np.ndarray:
    """A query vector as one float32 row, after checking it has the index's dimension."""
    vec = np.asarray(vector, dtype=np.float32).reshape(-1)
    if vec.shape[0] != dim:
        raise StoreError(
            f"query vector has {vec.shape[0]} dimensions, the index has {dim}", where=where, fix=fix
        )
    return vec


def topic_groups(topics: Mapping[str, tuple[int, str]]) -> dict[tuple[int, str], list[str]]:
    """``paper_id -> (topic, label)`` turned around: the papers of each (topic, label), one update each."""
    by_topic: dict[tuple[int, str], list[str]] = {}
    for paper_id, (topic, label) in topics.items():
        by_topic.setdefault((int(topic), label), []).append(paper_id)
    return by_topic


def paper_counts(payloads: Iterable[Mapping[str, Any]]) -> list[PaperCount]:
    """Each paper's title and chunk count from its chunks' payloads (``paper_id`` and ``title``), by id."""
    counts: dict[str, int] = {}
    titles: dict[str, str] = {}
    for payload in payloads:
        pid = str(payload["paper_id"])
        counts[pid] = counts.get(pid, 0) + 1
        titles.setdefault(pid, str(payload.get("title", "")))
    return [PaperCount(paper_id=p, title=titles[p], chunks=counts[p]) for p in sorted(counts)]


def dense_rows(vectors: Sequence[Any], dim: int) -> np.ndarray:
    """The dense rows of these retrieved named-vector dicts (zeros where a point has none, or is None)."""
    out = np.zeros((len(vectors), dim), dtype=np.float32)
    for row, vec in enumerate(vectors):
        if isinstance(vec, dict) and DENSE in vec:
            out[row] = np.asarray(vec[DENSE], dtype=np.float32)
    return out


def unpack_points(
    records: Sequence[Any], dim: int, sparse_type: type[Any]
) -> tuple[list[Chunk], np.ndarray, list[SparseVector]]:
    """Retrieved records (``.payload``, ``.vector``) as chunks, dense rows and sparse vectors.

    ``sparse_type`` is the engine's sparse vector class; a point stored without terms has no sparse
    vector at all and gets an empty one."""
    chunks = [Chunk(**(r.payload or {})) for r in records]
    dense = dense_rows([r.vector for r in records], dim)
    sparse: list[SparseVector] = []
    for r in records:
        sv = r.vector.get(SPARSE) if isinstance(r.vector, dict) else None
        if isinstance(sv, sparse_type):
            sparse.append(SparseVector(indices=list(sv.indices), values=[float(v) for v in sv.values]))
        else:
            sparse.append(SparseVector(indices=[], values=[]))
    return chunks, dense, sparse
