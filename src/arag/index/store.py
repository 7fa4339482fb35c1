"""The index store interface: what the build, search and library layers need from a vector engine.

One point per chunk, with a dense vector, a BM25 sparse vector (the engine applies IDF at query
time) and the whole :class:`~arag.records.Chunk` as payload, so every result rebuilds its chunk.
The default backend is :class:`arag.index.qdrant_edge.EdgeStore`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, Self, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict

from arag.records import Chunk, ScoredChunk, SearchFilter, SparseVector


class PaperCount(BaseModel):
    """A paper present in the index and how many chunks it has there."""

    model_config = ConfigDict(frozen=True)

    paper_id: str
    title: str
    chunks: int


@runtime_checkable
class Store(Protocol):
    """A chunk index with dense and sparse search, payload filters and per-paper maintenance."""

    dim: int

    def upsert(self, chunks: Sequence[Chunk], dense: np.ndarray, sparse: Sequence[SparseVector]) -> None:
        """Insert or replace chunks (by chunk id); ``dense`` is ``(len(chunks), dim)``."""
        ...

    def delete_paper(self, paper_id: str) -> None:
        """Remove every chunk of one paper."""
        ...

    def delete_stale(self, paper_ids: Sequence[str], keep: Sequence[str]) -> None:
        """Remove the chunks of these papers whose chunk ids are not in ``keep`` (one update).

        Called after the papers' new chunks were written, so a paper is never without its chunks."""
        ...

    def dense_search(
        self, vector: np.ndarray, limit: int, flt: SearchFilter | None = None
    ) -> list[ScoredChunk]:
        """The ``limit`` chunks nearest to ``vector`` (cosine), best first; source "dense"."""
        ...

    def sparse_search(
        self, vector: SparseVector, limit: int, flt: SearchFilter | None = None
    ) -> list[ScoredChunk]:
        """The ``limit`` best BM25 matches for a query vector, best first; source "sparse"."""
        ...

    def count(self, flt: SearchFilter | None = None) -> int:
        """How many chunks match ``flt`` (all chunks when None)."""
        ...

    def count_by_type(self) -> dict[str, int]:
        """Chunk counts per chunk type ("abstract", "passage", "table")."""
        ...

    def list_papers(self) -> list[PaperCount]:
        """Every paper in the index with its title and chunk count, sorted by paper id."""
        ...

    def paper_ids(self) -> set[str]:
        """The ids of the papers in the index."""
        ...

    def set_topics(self, topics: Mapping[str, tuple[int, str]]) -> None:
        """Write ``paper_id -> (topic id, label)`` into the payload of every chunk of those papers."""
        ...

    def get_chunks(self, ids: Sequence[str]) -> list[Chunk]:
        """The chunks with these ids, in the order asked; unknown ids are skipped."""
        ...

    def get_vectors(self, ids: Sequence[str]) -> np.ndarray:
        """Dense vectors of these chunks, ``(len(ids), dim)``, in the order asked (for MMR)."""
        ...

    def optimize(self) -> None:
        """Compact segments and build the vector indexes; call once after a build."""
        ...

    def flush(self) -> None:
        """Persist everything written so far."""
        ...

    def size_bytes(self) -> int:
        """Bytes the index occupies on disk."""
        ...

    def close(self) -> None:
        """Release the index (and its lock); the store is unusable afterwards."""
        ...


class ClosingStore:
    """Closing as both Qdrant backends do it: the engine released once, then the release callbacks.

    A backend says whether its engine is ``closed`` and how to ``_release_engine``; the callbacks run
    even when releasing the engine failed, so the library lock never outlives the store."""

    def __init__(self) -> None:
        self._on_close: list[Callable[[], None]] = []

    @property
    def closed(self) -> bool:
        """Whether the engine was released (the store is unusable)."""
        raise NotImplementedError

    def _release_engine(self) -> None:
        """Flush and release the engine's handle and its lock; ``closed`` is True afterwards."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the engine, then run the release callbacks; calling it twice is harmless."""
        if self.closed:
            return
        try:
            self._release_engine()
        finally:
            for release in self._on_close:
                release()

    def release_on_close(self, release: Callable[[], None]) -> None:
        """Call ``release`` when the store closes (the library lock that open_store took)."""
        self._on_close.append(release)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
