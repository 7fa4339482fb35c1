"""The default index backend: Qdrant Edge, Qdrant's engine embedded in the process (one shard).

Layout: one point per chunk, id ``uuid5(NAMESPACE_URL, chunk.id)``, named vectors ``dense``
(cosine) and ``bm25`` (sparse, IDF modifier), payload ``chunk.model_dump()``; keyword indexes on
``paper_id`` and ``type``, integer indexes on ``year`` and ``topic``.

Behaviour measured with qdrant-edge-py 0.9.0 (see tests/test_store.py):

- Durability: every update goes to a write-ahead log before ``update`` returns, so a process
  killed with SIGKILL before ``flush()`` loses nothing: the next open replays the log. One
  ``upsert`` call is one log record, applied whole or not at all. (Power loss is not covered:
  the log is not fsynced per update; ``flush()`` persists the segments.)
- Locking: the shard's write-ahead log is locked (flock) while a shard is open; a second
  open, from any process, fails until the first closes or dies. The lock dies with the process.
- Threads: one open shard serves searches from any thread while another thread writes, and a
  search sees each update whole or not at all (the server searches while its background build
  writes: tests/test_first_run.py). Between a ``delete_paper`` and the upsert that rewrites the
  paper, a search finds none of its chunks.
- IDF statistics count points that have a non-empty sparse vector; points deleted since the
  segment was last rebuilt still count until the optimizer rewrites that segment.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import qdrant_edge as qe

from arag.errors import StoreError
from arag.index.payload import (
    DENSE,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    SPARSE,
    checked_query,
    checked_rows,
    dense_rows,
    directory_size,
    matches_nothing,
    paper_counts,
    point_id,
    topic_groups,
    unpack_points,
)
from arag.index.store import ClosingStore, PaperCount
from arag.records import Chunk, ScoredChunk, SearchFilter, SparseVector

log = logging.getLogger(__name__)

_CONFIG_FILE = "edge_config.json"
_SCROLL_PAGE = 2048
# Facets return at most `limit` values; far above any library's paper count.
_FACET_LIMIT = 10_000_000
_REBUILD_FIX = "rebuild the index with `arag library build --rebuild`"
# A failed write or flush loses nothing: the update is in the write-ahead log, which the next open
# replays, and a build records a paper only after its flush succeeded. Rerunning costs seconds where
# a rebuild costs the whole library (20 minutes); a flush of the engine's sparse store once failed
# here mid-build ("tracker_journal.dat is shorter than expected") and a plain rerun resumed cleanly.
_RETRY_FIX = (
    "run the same command again (free disk space first if the message says it ran out): the index "
    "replays its write-ahead log when it is next opened, and `arag library build` resumes at the "
    f"first paper it had not recorded; if it fails the same way again, {_REBUILD_FIX}"
)


def _edge_config(dim: int, threads: int | None) -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors={DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        max_search_threads=threads,
    )


def _stored_dim(path: Path) -> int | None:
    """The dense dimension recorded in an existing shard's config, if readable."""
    try:
        cfg = json.loads((path / _CONFIG_FILE).read_text(encoding="utf-8"))
        return int(cfg["vectors"][DENSE]["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_lock_error(exc: Exception) -> bool:
    return "WouldBlock" in str(exc)


def build_filter(flt: SearchFilter | None) -> qe.Filter | None:
    """The engine filter for a :class:`SearchFilter` (None when it restricts nothing)."""
    if flt is None:
        return None
    must: list[Any] = []
    if flt.paper_ids is not None:
        must.append(qe.FieldCondition("paper_id", match=qe.MatchAny(list(flt.paper_ids))))
    if flt.types is not None:
        must.append(qe.FieldCondition("type", match=qe.MatchAny([str(t) for t in flt.types])))
    if flt.topics is not None:
        must.append(qe.FieldCondition("topic", match=qe.MatchAny([int(t) for t in flt.topics])))
    if flt.year_min is not None or flt.year_max is not None:
        rng = qe.RangeFloat(
            gte=float(flt.year_min) if flt.year_min is not None else None,
            lte=float(flt.year_max) if flt.year_max is not None else None,
        )
        must.append(qe.FieldCondition("year", range=rng))
    return qe.Filter(must=must) if must else None


def _paper_filter(paper_ids: Sequence[str]) -> qe.Filter:
    return qe.Filter(must=[qe.FieldCondition("paper_id", match=qe.MatchAny(list(paper_ids)))])


class EdgeStore(ClosingStore):
    """A :class:`~arag.index.store.Store` on a Qdrant Edge shard in one directory."""

    def __init__(self, shard: qe.EdgeShard, path: Path, dim: int) -> None:
        super().__init__()
        self._shard: qe.EdgeShard | None = shard
        self.path = path
        self.dim = dim

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path, dim: int, *, create: bool = True, threads: int | None = None) -> EdgeStore:
        """Open the shard in ``path``, creating it when absent (unless ``create`` is False).

        ``threads`` caps the engine's search thread pool (None: one per CPU).
        Raises StoreError when the index is missing, in use by another process, or was built
        with another vector dimension.
        """
        path = Path(path)
        exists = (path / _CONFIG_FILE).is_file()
        if exists:
            stored = _stored_dim(path)
            if stored is not None and stored != dim:
                raise StoreError(
                    f"the index was built with {stored}-dimensional vectors but the embedding model "
                    f"gives {dim}",
                    where=str(path),
                    fix=f"{_REBUILD_FIX}, or set the embedding model back to the one it was built with",
                )
        elif not create:
            raise StoreError(
                "there is no index here", where=str(path), fix="build the library first: `arag library build`"
            )
        try:
            if exists:
                shard = qe.EdgeShard.load(str(path), _edge_config(dim, threads))
            else:
                path.mkdir(parents=True, exist_ok=True)
                shard = qe.EdgeShard.create(str(path), _edge_config(dim, threads))
        except Exception as exc:  # the engine raises bare Exception with a message
            if _is_lock_error(exc):
                raise StoreError(
                    f"the index at {path} is in use by another arag process",
                    where=str(path),
                    fix="wait for it to finish or stop it",
                ) from exc
            if "incompatible" in str(exc).lower():
                raise StoreError(
                    f"the index does not match this configuration: {exc}", where=str(path), fix=_REBUILD_FIX
                ) from exc
            raise StoreError(
                f"could not {'open' if exists else 'create'} the index: {exc}",
                where=str(path),
                fix=f"check the directory is readable and writable; if it is damaged, {_REBUILD_FIX}",
            ) from exc
        store = cls(shard, path, dim)
        store._ensure_payload_indexes()
        log.info("opened index %s (%d points)", path, store.count())
        return store

    def _ensure_payload_indexes(self) -> None:
        with self._engine("create payload indexes", write=True):
            existing = set(self._live().info().payload_schema)
            for name in KEYWORD_FIELDS:
                if name not in existing:
                    self._live().update(
                        qe.UpdateOperation.create_field_index(name, qe.PayloadSchemaType.Keyword)
                    )
            for name in INTEGER_FIELDS:
                if name not in existing:
                    self._live().update(
                        qe.UpdateOperation.create_field_index(name, qe.PayloadSchemaType.Integer)
                    )

    def _live(self) -> qe.EdgeShard:
        if self._shard is None:
            raise StoreError("the index is closed", where=str(self.path), fix="open the store again")
        return self._shard

    @contextmanager
    def _engine(self, action: str, *, write: bool = False) -> Iterator[None]:
        """Turn the engine's bare exceptions into StoreError naming the action and the index;
        ``write``: the action writes, so the fix is to run it again, not to rebuild."""
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(
                f"index operation failed ({action}): {exc}",
                where=str(self.path),
                fix=_RETRY_FIX if write else _REBUILD_FIX,
            ) from exc

    def flush(self) -> None:
        """Persist all segments (updates are already in the write-ahead log)."""
        with self._engine("flush", write=True):
            self._live().flush()

    def optimize(self) -> None:
        """Merge segments and build HNSW/payload indexes; blocks until done."""
        with self._engine("optimize", write=True):
            changed = self._live().optimize()
        log.info("optimized index %s (changed: %s)", self.path, changed)

    @property
    def closed(self) -> bool:
        return self._shard is None

    def _release_engine(self) -> None:
        """Flush and release the shard and its lock."""
        shard, self._shard = self._live(), None
        with self._engine("close", write=True):
            shard.flush()
            shard.close()

    def size_bytes(self) -> int:
        """Bytes allocated on disk by the index directory."""
        return directory_size(self.path)

    # -- writes ----------------------------------------------------------------------------------

    def upsert(self, chunks: Sequence[Chunk], dense: np.ndarray, sparse: Sequence[SparseVector]) -> None:
        """Insert or replace chunks by id, as one engine update (applied whole or not at all)."""
        if not chunks:
            return
        rows = checked_rows(chunks, dense, sparse, self.dim, str(self.path)).tolist()
        points = [
            qe.Point(
                id=point_id(c.id),
                vector={DENSE: row, SPARSE: qe.SparseVector(list(sv.indices), list(sv.values))},
                payload=c.model_dump(),
            )
            for c, row, sv in zip(chunks, rows, sparse, strict=True)
        ]
        with self._engine(f"upsert {len(points)} chunks", write=True):
            self._live().update(qe.UpdateOperation.upsert_points(points))

    def delete_paper(self, paper_id: str) -> None:
        """Remove every chunk of ``paper_id`` (nothing happens for an unknown id)."""
        with self._engine(f"delete paper {paper_id}", write=True):
            self._live().update(qe.UpdateOperation.delete_points_by_filter(_paper_filter([paper_id])))

    def delete_stale(self, paper_ids: Sequence[str], keep: Sequence[str]) -> None:
        """Remove the chunks of ``paper_ids`` whose ids are not in ``keep``, as one engine update."""
        if not paper_ids:
            return
        flt = qe.Filter(
            must=[qe.FieldCondition("paper_id", match=qe.MatchAny(list(paper_ids)))],
            must_not=[qe.HasIdCondition({point_id(c) for c in keep})] if keep else None,
        )
        with self._engine(f"delete stale chunks of {len(paper_ids)} papers", write=True):
            self._live().update(qe.UpdateOperation.delete_points_by_filter(flt))

    def set_topics(self, topics: Mapping[str, tuple[int, str]]) -> None:
        """Write topic id and label into every chunk of each paper (one update per topic)."""
        with self._engine("set topics", write=True):
            for (topic, label), paper_ids in topic_groups(topics).items():
                op = qe.UpdateOperation.set_payload_by_filter(
                    _paper_filter(paper_ids), {"topic": topic, "topic_label": label}
                )
                self._live().update(op)

    # -- reads -----------------------------------------------------------------------------------

    def _search(self, query: Any, limit: int, flt: SearchFilter | None, source: str) -> list[ScoredChunk]:
        if limit <= 0 or matches_nothing(flt):
            return []
        request = qe.QueryRequest(limit=limit, query=query, filter=build_filter(flt), with_payload=True)
        with self._engine(f"{source} search"):
            hits = self._live().query(request)
        return [
            ScoredChunk(chunk=Chunk(**(h.payload or {})), score=float(h.score), source=source) for h in hits
        ]

    def dense_search(
        self, vector: np.ndarray, limit: int, flt: SearchFilter | None = None
    ) -> list[ScoredChunk]:
        """Nearest chunks by cosine similarity, best first."""
        fix = f"embed queries with the model the index was built with, or {_REBUILD_FIX}"
        vec = checked_query(vector, self.dim, str(self.path), fix)
        return self._search(qe.Query.Nearest(vec.tolist(), using=DENSE), limit, flt, "dense")

    def sparse_search(
        self, vector: SparseVector, limit: int, flt: SearchFilter | None = None
    ) -> list[ScoredChunk]:
        """Best BM25 matches (the engine multiplies each matched term by its IDF), best first."""
        if not vector.indices:
            return []
        query = qe.Query.Nearest(qe.SparseVector(list(vector.indices), list(vector.values)), using=SPARSE)
        return self._search(query, limit, flt, "sparse")

    def scroll_points(self, batch: int = 256) -> Iterator[tuple[list[Chunk], np.ndarray, list[SparseVector]]]:
        """Every point as (chunks, dense rows, sparse vectors), ``batch`` at a time (for migrations)."""
        offset: Any = None
        while True:
            request = qe.ScrollRequest(offset=offset, limit=batch, with_payload=True, with_vector=True)
            with self._engine("scroll"):
                records, offset = self._live().scroll(request)
            if records:
                yield unpack_points(records, self.dim, qe.SparseVector)
            if offset is None:
                return

    def count(self, flt: SearchFilter | None = None) -> int:
        """Exact number of chunks matching ``flt``."""
        if matches_nothing(flt):
            return 0
        with self._engine("count"):
            return int(self._live().count(qe.CountRequest(exact=True, filter=build_filter(flt))))

    def _facet(self, key: str) -> dict[Any, int]:
        with self._engine(f"facet on {key}"):
            hits = self._live().facet(qe.FacetRequest(key, limit=_FACET_LIMIT, exact=True))
        # exact facets still list values whose points were all deleted, with count 0
        return {h.value: int(h.count) for h in hits if h.count > 0}

    def count_by_type(self) -> dict[str, int]:
        """Chunk counts per chunk type; types absent from the index are absent here."""
        return {str(k): v for k, v in self._facet("type").items()}

    def paper_ids(self) -> set[str]:
        """The ids of the papers with at least one chunk."""
        return {str(k) for k in self._facet("paper_id")}

    def list_papers(self) -> list[PaperCount]:
        """Papers with title and chunk count, sorted by id (one scroll over paper_id/title only)."""
        return paper_counts(self._scroll_payloads(["paper_id", "title"]))

    def _scroll_payloads(self, keys: list[str]) -> Iterator[dict[str, Any]]:
        offset: Any = None
        while True:
            request = qe.ScrollRequest(
                offset=offset,
                limit=_SCROLL_PAGE,
                with_payload=qe.PayloadSelector.Include(keys),
                with_vector=False,
            )
            with self._engine("scroll"):
                records, offset = self._live().scroll(request)
            for rec in records:
                yield rec.payload or {}
            if offset is None:
                return

    def get_chunks(self, ids: Sequence[str]) -> list[Chunk]:
        """Chunks by id, in the order given; ids not in the index are skipped."""
        if not ids:
            return []
        with self._engine(f"retrieve {len(ids)} chunks"):
            records = self._live().retrieve([point_id(i) for i in ids], with_payload=True, with_vector=False)
        by_id: dict[str, dict[str, Any]] = {}
        for rec in records:
            if rec.payload:
                by_id[str(rec.payload.get("id"))] = rec.payload
        return [Chunk(**by_id[i]) for i in ids if i in by_id]

    def get_vectors(self, ids: Sequence[str]) -> np.ndarray:
        """Dense vectors of these chunks, one row per id in the order given (zeros for unknown ids)."""
        if not ids:
            return dense_rows([], self.dim)
        with self._engine(f"retrieve {len(ids)} vectors"):
            records = self._live().retrieve([point_id(i) for i in ids], with_payload=False, with_vector=True)
        by_point = {str(rec.id): rec.vector for rec in records}
        return dense_rows([by_point.get(point_id(cid)) for cid in ids], self.dim)
