"""A store on ``qdrant_client``: a Qdrant server or cluster, or the client's local mode.

The point layout is the Edge store's (:mod:`arag.index.qdrant_edge`): same point ids, named
vectors, payload and payload indexes, so a library searches the same on either backend and
``arag library migrate`` copies points unchanged.

Locations: ``http(s)://host:6333`` (a server; ``api_key`` optional), ``:memory:`` or ``path:DIR``
(local mode: the same client calls, executed in this process by brute force; fine for a few
thousand chunks, slow for BM25 at tens of thousands). Every write waits until applied.

Differences from Edge: IDF statistics are per shard on a server (a collection with several shards
scores BM25 slightly differently from one shard) and exact on live points in local mode, where
Edge and a one-shard server still count deleted points until the optimizer rewrites a segment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

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

_SCROLL_PAGE = 1024
# Points per upsert request: keeps requests far below the server's 32 MiB body limit.
_UPSERT_BATCH = 256
# Facets return at most `limit` values; far above any library's paper count.
_FACET_LIMIT = 1_000_000
_URL_FIX = "start the server, or point ARAG_QDRANT_URL at a running Qdrant (http://host:6333)"
_OPTIMIZE_WAIT_S = 600.0


def _client(location: str, api_key: str | None, timeout: int) -> QdrantClient:
    if location == ":memory:":
        return QdrantClient(location=":memory:")
    if location.startswith("path:"):
        path = Path(location.removeprefix("path:")).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return QdrantClient(path=str(path))
    # The compatibility check is a request of its own that only warns; open() reports reachability.
    return QdrantClient(url=location, api_key=api_key, timeout=timeout, check_compatibility=False)


def build_filter(flt: SearchFilter | None) -> qm.Filter | None:
    """The client filter for a :class:`SearchFilter` (None when it restricts nothing)."""
    if flt is None:
        return None
    must: list[Any] = []
    if flt.paper_ids is not None:
        must.append(qm.FieldCondition(key="paper_id", match=qm.MatchAny(any=list(flt.paper_ids))))
    if flt.types is not None:
        must.append(qm.FieldCondition(key="type", match=qm.MatchAny(any=[str(t) for t in flt.types])))
    if flt.topics is not None:
        must.append(qm.FieldCondition(key="topic", match=qm.MatchAny(any=[int(t) for t in flt.topics])))
    if flt.year_min is not None or flt.year_max is not None:
        must.append(qm.FieldCondition(key="year", range=qm.Range(gte=flt.year_min, lte=flt.year_max)))
    return qm.Filter(must=must) if must else None


def _paper_filter(paper_ids: Sequence[str]) -> qm.FilterSelector:
    cond = qm.FieldCondition(key="paper_id", match=qm.MatchAny(any=list(paper_ids)))
    return qm.FilterSelector(filter=qm.Filter(must=[cond]))


class QdrantServerStore(ClosingStore):
    """A :class:`~arag.index.store.Store` on one collection of a Qdrant server, cluster or local mode."""

    def __init__(self, client: QdrantClient, collection: str, dim: int, location: str) -> None:
        super().__init__()
        self._client: QdrantClient | None = client
        self.collection = collection
        self.dim = dim
        self.location = location
        self.local = location == ":memory:" or location.startswith("path:")
        self.where = f"{location} (collection {collection!r})"

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        location: str,
        dim: int,
        *,
        collection: str = "arag",
        api_key: str | None = None,
        create: bool = True,
        shards: int = 1,
        replication_factor: int = 1,
        timeout: int = 60,
    ) -> QdrantServerStore:
        """Open ``collection`` at ``location``, creating it when absent (unless ``create`` is False).

        Raises StoreError when the server is unreachable or refuses the key, the collection is
        missing or was built with another vector dimension, or a local folder is in use.
        """
        where = f"{location} (collection {collection!r})"
        try:
            client = _client(location, api_key, timeout)
        except Exception as exc:
            if "already accessed" in str(exc):  # local mode locks its folder for one client at a time
                fix = "wait for it to finish or stop it (a Qdrant server allows concurrent access)"
                raise StoreError("the index is in use by another arag process", where=where, fix=fix) from exc
            raise StoreError(f"could not open Qdrant: {exc}", where=where, fix=_URL_FIX) from exc
        store = cls(client, collection, dim, location)
        try:
            with store._engine("open the collection"):
                exists = client.collection_exists(collection)
            if exists:
                store._check_layout()
            elif not create:
                raise StoreError(
                    "there is no index here",
                    where=where,
                    fix="build the library first (`arag library build`), copy one there "
                    "(`arag library migrate --to URL`), or check ARAG_STORE__COLLECTION",
                )
            else:
                store._create(shards, replication_factor)
            store._ensure_payload_indexes()
        except BaseException:
            client.close()
            raise
        log.info("opened Qdrant collection %s (%d points)", where, store.count())
        return store

    def _create(self, shards: int, replication_factor: int) -> None:
        with self._engine("create the collection"):
            self._live().create_collection(
                self.collection,
                vectors_config={DENSE: qm.VectorParams(size=self.dim, distance=qm.Distance.COSINE)},
                sparse_vectors_config={SPARSE: qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
                shard_number=shards,
                replication_factor=replication_factor,
            )

    def _check_layout(self) -> None:
        with self._engine("read the collection's configuration"):
            params = self._live().get_collection(self.collection).config.params
        vectors = params.vectors if isinstance(params.vectors, dict) else {}
        sparse = params.sparse_vectors or {}
        if DENSE not in vectors or SPARSE not in sparse or sparse[SPARSE].modifier != qm.Modifier.IDF:
            raise StoreError(
                f"collection {self.collection!r} is not an arag index (it needs {DENSE!r} vectors and "
                f"{SPARSE!r} sparse vectors with the IDF modifier)",
                where=self.where,
                fix="choose another collection with ARAG_STORE__COLLECTION (or --collection)",
            )
        stored = vectors[DENSE].size
        if stored != self.dim:
            raise StoreError(
                f"the index was built with {stored}-dimensional vectors "
                f"but the embedding model gives {self.dim}",
                where=self.where,
                fix="set the embedding model back, or delete the collection (or pick another with "
                "ARAG_STORE__COLLECTION) and build again",
            )

    def _ensure_payload_indexes(self) -> None:
        # Local mode keeps no payload indexes (create_payload_index only warns there) and filters
        # and facets work without them; a server needs them for facets and fast filters.
        if self.local:
            return
        with self._engine("create payload indexes"):
            existing = set(self._live().get_collection(self.collection).payload_schema)
            wanted = [(n, qm.PayloadSchemaType.KEYWORD) for n in KEYWORD_FIELDS]
            wanted += [(n, qm.PayloadSchemaType.INTEGER) for n in INTEGER_FIELDS]
            for name, schema in wanted:
                if name not in existing:
                    self._live().create_payload_index(self.collection, name, field_schema=schema, wait=True)

    def _live(self) -> QdrantClient:
        if self._client is None:
            raise StoreError("the index is closed", where=self.where, fix="open the store again")
        return self._client

    @contextmanager
    def _engine(self, action: str) -> Iterator[None]:
        """Turn client errors into StoreError naming the action, the collection and a fix."""
        try:
            yield
        except StoreError:
            raise
        except UnexpectedResponse as exc:
            code = exc.status_code
            if code in (401, 403):
                fix = "set ARAG_QDRANT_API_KEY to a key this server accepts"
            elif code == 404:
                fix = "build the library there (`arag library build`) or check ARAG_STORE__COLLECTION"
            else:
                fix = "check the Qdrant server's log and ARAG_QDRANT_URL"
            detail = exc.content.decode("utf-8", errors="replace")[:300]
            raise StoreError(
                f"Qdrant refused to {action}: HTTP {code} {exc.reason_phrase} {detail}",
                where=self.where,
                fix=fix,
            ) from exc
        except (ResponseHandlingException, httpx.TransportError, ConnectionError) as exc:
            raise StoreError(
                f"could not reach Qdrant to {action}: {exc}", where=self.where, fix=_URL_FIX
            ) from exc
        except Exception as exc:
            fix = "rebuild the index with `arag library build --rebuild`" if self.local else _URL_FIX
            raise StoreError(f"index operation failed ({action}): {exc}", where=self.where, fix=fix) from exc

    def flush(self) -> None:
        """Nothing to do: every write waited until the server (or local mode's file) applied it."""
        self._live()

    def optimize(self) -> None:
        """Wait while the server's optimizers run (a yellow collection); local mode has none."""
        if self.local:
            return
        deadline = time.monotonic() + _OPTIMIZE_WAIT_S
        while time.monotonic() < deadline:
            with self._engine("read the collection's status"):
                status = self._live().get_collection(self.collection).status
            if status != qm.CollectionStatus.YELLOW:
                return
            time.sleep(0.5)
        log.warning("Qdrant is still optimizing %s; searches work meanwhile", self.where)

    @property
    def closed(self) -> bool:
        return self._client is None

    def _release_engine(self) -> None:
        """Release the client (and local mode's folder lock)."""
        client, self._client = self._live(), None
        with self._engine("close"):
            client.close()

    def drop(self) -> None:
        """Delete the whole collection (tests, and replacing a migration target)."""
        with self._engine("delete the collection"):
            self._live().delete_collection(self.collection)

    def size_bytes(self) -> int:
        """Bytes of a local-mode folder; 0 (unknown) for a server or ``:memory:``."""
        if self.location.startswith("path:"):
            return directory_size(Path(self.location.removeprefix("path:")).expanduser())
        return 0

    # -- writes ----------------------------------------------------------------------------------

    def upsert(self, chunks: Sequence[Chunk], dense: np.ndarray, sparse: Sequence[SparseVector]) -> None:
        """Insert or replace chunks by id (requests of ``_UPSERT_BATCH`` points, each awaited)."""
        if not chunks:
            return
        rows = checked_rows(chunks, dense, sparse, self.dim, self.where).tolist()
        points = [
            qm.PointStruct(
                id=point_id(c.id),
                vector={
                    DENSE: row,
                    SPARSE: qm.SparseVector(indices=list(sv.indices), values=list(sv.values)),
                },
                payload=c.model_dump(),
            )
            for c, row, sv in zip(chunks, rows, sparse, strict=True)
        ]
        with self._engine(f"upsert {len(points)} chunks"):
            for i in range(0, len(points), _UPSERT_BATCH):
                self._live().upsert(self.collection, points[i : i + _UPSERT_BATCH], wait=True)

    def delete_paper(self, paper_id: str) -> None:
        """Remove every chunk of ``paper_id`` (nothing happens for an unknown id)."""
        with self._engine(f"delete paper {paper_id}"):
            self._live().delete(self.collection, points_selector=_paper_filter([paper_id]), wait=True)

    def delete_stale(self, paper_ids: Sequence[str], keep: Sequence[str]) -> None:
        """Remove the chunks of ``paper_ids`` whose ids are not in ``keep``, as one request."""
        if not paper_ids:
            return
        flt = qm.Filter(
            must=[qm.FieldCondition(key="paper_id", match=qm.MatchAny(any=list(paper_ids)))],
            must_not=[qm.HasIdCondition(has_id=[point_id(c) for c in keep])] if keep else None,
        )
        with self._engine(f"delete stale chunks of {len(paper_ids)} papers"):
            self._live().delete(self.collection, points_selector=qm.FilterSelector(filter=flt), wait=True)

    def set_topics(self, topics: Mapping[str, tuple[int, str]]) -> None:
        """Write topic id and label into every chunk of each paper (one request per topic)."""
        with self._engine("set topics"):
            for (topic, label), paper_ids in topic_groups(topics).items():
                payload = {"topic": topic, "topic_label": label}
                self._live().set_payload(self.collection, payload, points=_paper_filter(paper_ids), wait=True)

    # -- reads -----------------------------------------------------------------------------------

    def _query(self, source: str, limit: int, flt: SearchFilter | None, **kw: Any) -> list[ScoredChunk]:
        if limit <= 0 or matches_nothing(flt):
            return []
        with self._engine(f"{source} search"):
            res = self._live().query_points(
                self.collection, query_filter=build_filter(flt), limit=limit, with_payload=True, **kw
            )
        return [
            ScoredChunk(chunk=Chunk(**(p.payload or {})), score=float(p.score), source=source)
            for p in res.points
        ]

    def _dense_query(self, vector: np.ndarray) -> list[float]:
        vec = checked_query(
            vector, self.dim, self.where, "embed queries with the model the index was built with"
        )
        return [float(x) for x in vec]

    def dense_search(
        self, vector: np.ndarray, limit: int, flt: SearchFilter | None = None
    ) -> list[ScoredChunk]:
        """Nearest chunks by cosine similarity, best first."""
        return self._query("dense", limit, flt, query=self._dense_query(vector), using=DENSE)

    def sparse_search(
        self, vector: SparseVector, limit: int, flt: SearchFilter | None = None
    ) -> list[ScoredChunk]:
        """Best BM25 matches (the engine multiplies each matched term by its IDF), best first."""
        if not vector.indices:
            return []
        query = qm.SparseVector(indices=list(vector.indices), values=list(vector.values))
        return self._query("sparse", limit, flt, query=query, using=SPARSE)

    def count(self, flt: SearchFilter | None = None) -> int:
        """Exact number of chunks matching ``flt``."""
        if matches_nothing(flt):
            return 0
        with self._engine("count"):
            return int(self._live().count(self.collection, count_filter=build_filter(flt), exact=True).count)

    def _facet(self, key: str) -> dict[Any, int]:
        with self._engine(f"facet on {key}"):
            res = self._live().facet(self.collection, key, limit=_FACET_LIMIT, exact=True)
        return {h.value: int(h.count) for h in res.hits if h.count > 0}

    def count_by_type(self) -> dict[str, int]:
        """Chunk counts per chunk type; types absent from the index are absent here."""
        return {str(k): v for k, v in self._facet("type").items()}

    def paper_ids(self) -> set[str]:
        """The ids of the papers with at least one chunk."""
        return {str(k) for k in self._facet("paper_id")}

    def list_papers(self) -> list[PaperCount]:
        """Papers with title and chunk count, sorted by id (one scroll over paper_id/title only)."""
        pages = self._scroll(qm.PayloadSelectorInclude(include=["paper_id", "title"]), False, _SCROLL_PAGE)
        return paper_counts(rec.payload or {} for records in pages for rec in records)

    def _scroll(self, payload: Any, vectors: bool, page: int) -> Iterator[list[qm.Record]]:
        offset: Any = None
        while True:
            with self._engine("scroll"):
                records, offset = self._live().scroll(
                    self.collection, limit=page, offset=offset, with_payload=payload, with_vectors=vectors
                )
            yield records
            if offset is None:
                return

    def _points(self, records: Sequence[qm.Record]) -> tuple[list[Chunk], np.ndarray, list[SparseVector]]:
        return unpack_points(records, self.dim, qm.SparseVector)

    def scroll_points(self, batch: int = 256) -> Iterator[tuple[list[Chunk], np.ndarray, list[SparseVector]]]:
        """Every point as (chunks, dense rows, sparse vectors), ``batch`` at a time (for migrations)."""
        for records in self._scroll(True, True, batch):
            if records:
                yield self._points(records)

    def _retrieve(self, ids: Sequence[str], payload: bool, vectors: Any) -> dict[str, qm.Record]:
        """Records of these chunk ids by point id (unknown ids are absent)."""
        if not ids:
            return {}
        with self._engine(f"retrieve {len(ids)} points"):
            records = self._live().retrieve(
                self.collection, [point_id(i) for i in ids], with_payload=payload, with_vectors=vectors
            )
        return {str(r.id): r for r in records}

    def get_points(self, ids: Sequence[str]) -> tuple[list[Chunk], np.ndarray, list[SparseVector]]:
        """Chunks with both vectors, by chunk id, in the order asked; unknown ids are skipped."""
        got = self._retrieve(ids, True, True)
        return self._points([got[p] for p in map(point_id, ids) if p in got])

    def get_chunks(self, ids: Sequence[str]) -> list[Chunk]:
        """Chunks by id, in the order given; ids not in the index are skipped."""
        got = self._retrieve(ids, True, False)
        return [Chunk(**(got[p].payload or {})) for p in map(point_id, ids) if p in got]

    def get_vectors(self, ids: Sequence[str]) -> np.ndarray:
        """Dense vectors of these chunks, one row per id in the order given (zeros for unknown ids)."""
        got = self._retrieve(ids, False, [DENSE])
        return dense_rows([got[p].vector if p in got else None for p in map(point_id, ids)], self.dim)
