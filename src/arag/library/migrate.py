"""Copy the library's index to a Qdrant server (or qdrant-client's local mode), then check the copy.

Points are copied as they are (same ids, vectors and payload), so nothing is re-embedded and the
copy searches exactly like the source. The build state (``library.sqlite3``) stays in the data
directory and serves either backend.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel

from arag.errors import InputError, StoreError
from arag.index.factory import open_store, store_backend
from arag.index.qdrant_server import QdrantServerStore
from arag.index.store import Store
from arag.library.build import Progress
from arag.library.state import LibraryState
from arag.records import Chunk, SparseVector
from arag.settings import Settings

log = logging.getLogger(__name__)

MIN_COSINE = 0.9999
_Point = tuple[Chunk, np.ndarray, SparseVector]


@runtime_checkable
class PointSource(Protocol):
    """A store that can list every point with its vectors (both arag backends can)."""

    def count(self) -> int: ...

    def count_by_type(self) -> dict[str, int]: ...

    def scroll_points(
        self, batch: int = 256
    ) -> Iterator[tuple[list[Chunk], np.ndarray, list[SparseVector]]]: ...


class MigrationReport(BaseModel):
    """What was copied and how the copy was checked."""

    target: str
    points: int
    by_type: dict[str, int]
    target_points: int
    target_by_type: dict[str, int]
    sampled: int
    min_cosine: float
    seconds: float


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na < 1e-12 or nb < 1e-12:  # a text with no words has a zero vector; it stays zero
        return 1.0 if na < 1e-12 and nb < 1e-12 else 0.0
    return float(np.dot(a, b) / (na * nb))


def _compare(want: list[_Point], target: QdrantServerStore) -> tuple[float, list[str]]:
    """The smallest cosine over the sample, and what differs (empty when the copy is faithful)."""
    chunks, dense, sparse = target.get_points([c.id for c, _, _ in want])
    got = {c.id: (c, d, s) for c, d, s in zip(chunks, dense, sparse, strict=True)}
    problems: list[str] = []
    min_cos = 1.0
    for chunk, vec, sv in want:
        if chunk.id not in got:
            problems.append(f"chunk {chunk.id} is missing")
            continue
        c2, v2, s2 = got[chunk.id]
        cos = _cosine(vec, v2)
        min_cos = min(min_cos, cos)
        if cos < MIN_COSINE:
            problems.append(f"chunk {chunk.id}: dense vectors differ (cosine {cos:.6f})")
        if c2 != chunk:
            problems.append(f"chunk {chunk.id}: payload differs")
        a, b = (
            sorted(zip(sv.indices, sv.values, strict=True)),
            sorted(zip(s2.indices, s2.values, strict=True)),
        )
        if [i for i, _ in a] != [i for i, _ in b] or not np.allclose(
            [v for _, v in a], [v for _, v in b], rtol=1e-6
        ):
            problems.append(f"chunk {chunk.id}: BM25 vectors differ")
    return min_cos, problems


def copy_store(
    source: Store,
    target: QdrantServerStore,
    *,
    batch: int = 256,
    sample: int = 64,
    seed: int = 0,
    progress: Progress | None = None,
) -> MigrationReport:
    """Copy every point of ``source`` into ``target``, then verify counts and a random sample.

    The sample (reservoir-drawn while copying, so the source is read once) is compared point by
    point: payload equal, dense cosine >= MIN_COSINE, BM25 vectors equal. Raises StoreError
    saying what differs.
    """
    if not isinstance(source, PointSource):
        raise StoreError(
            f"the store {type(source).__name__} cannot list its points",
            where="arag library migrate",
            fix="migrate from an Edge or Qdrant store",
        )
    t0 = time.perf_counter()
    progress = progress or Progress()
    progress.start(source.count())
    rng = random.Random(seed)
    reservoir: list[_Point] = []
    seen = 0
    for chunks, dense, sparse in source.scroll_points(max(1, batch)):
        target.upsert(chunks, dense, sparse)
        for point in zip(chunks, dense, sparse, strict=True):
            seen += 1
            if len(reservoir) < sample:
                reservoir.append(point)
            elif (j := rng.randrange(seen)) < sample:
                reservoir[j] = point
        progress.advance(len(chunks))
    target.optimize()
    report = MigrationReport(
        target=target.where,
        points=source.count(),
        by_type=source.count_by_type(),
        target_points=target.count(),
        target_by_type=target.count_by_type(),
        sampled=len(reservoir),
        min_cosine=1.0,
        seconds=0.0,
    )
    problems: list[str] = []
    if report.points != seen:
        problems.append(f"the source changed during the copy ({seen} points read, {report.points} now)")
    if report.target_points != report.points:
        problems.append(f"the target holds {report.target_points} points, the source {report.points}")
    if report.target_by_type != report.by_type:
        problems.append(f"chunks by type differ: source {report.by_type}, target {report.target_by_type}")
    report.min_cosine, differ = _compare(reservoir, target)
    problems.extend(differ)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise StoreError(
            f"the copy differs from the source: {shown}",
            where=target.where,
            fix="run `arag library migrate --replace` again with nothing else writing to either store",
        )
    report.seconds = time.perf_counter() - t0
    return report


def migrate_library(
    settings: Settings,
    to: str,
    *,
    collection: str | None = None,
    batch: int = 256,
    replace: bool = False,
    progress: Progress | None = None,
) -> MigrationReport:
    """Copy the configured library's index to ``to`` (a Qdrant URL, ``:memory:`` or ``path:DIR``).

    The target collection (default: the configured one) is created with the configured shards and
    replication factor, using ARAG_QDRANT_API_KEY. A target that already holds points is refused
    unless ``replace``, which deletes it first.
    """
    coll = collection or settings.store.collection
    if store_backend(settings) == "qdrant" and settings.qdrant_url == to and settings.collection == coll:
        raise InputError(
            f"the target is the library's own store ({to}, collection {coll!r})",
            where="arag library migrate --to",
            fix="give another URL or --collection",
        )
    with LibraryState(settings.state_db) as state:
        dim = state.get_meta("embedding_dim")
    if dim is None:
        raise InputError(
            f"there is no library in {settings.data_dir}",
            where="ARAG_DATA_DIR",
            fix="build it first: arag library build",
        )

    def open_target() -> QdrantServerStore:
        return QdrantServerStore.open(
            to,
            int(dim),
            collection=coll,
            api_key=settings.qdrant_key,
            shards=settings.store.shards,
            replication_factor=settings.store.replication_factor,
        )

    source = open_store(settings, int(dim), create=False)
    try:
        target = open_target()
        try:
            if (held := target.count()) and not replace:
                raise StoreError(
                    f"the target collection already holds {held} points",
                    where=target.where,
                    fix="pass --replace to delete it first, or choose another --collection",
                )
            if held:
                log.info("deleting %s before the copy (%d points)", target.where, held)
                target.drop()
                target.close()
                target = open_target()
            return copy_store(source, target, batch=batch, progress=progress)
        finally:
            target.close()
    finally:
        source.close()
