"""The library build: papers -> chunks -> vectors -> one store write per batch, resumable per paper.

Each batch of papers is chunked, embedded (cached by content hash), encoded for BM25, written
to the store and flushed; only then are its papers recorded in the build state. A killed
build therefore resumes at the first unrecorded paper, and rewriting a paper's points is
idempotent (deterministic ids), so no chunk is ever duplicated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, Field

from arag.errors import ConfigError, IngestError
from arag.index.factory import open_store
from arag.index.sparse import BM25Encoder
from arag.index.store import Store
from arag.ingest.chunker import chunk_paper
from arag.library.map import map_missing, update_map
from arag.library.sources import keep_sources
from arag.library.state import Failure, LibraryState, PaperRow
from arag.library.topics import assign_nearest, kmeans, label_clusters
from arag.models.embedder import BaseEmbedder
from arag.models.factory import library_embedder
from arag.records import Chunk, Paper, SparseVector
from arag.settings import Settings
from arag.text import tokenize

log = logging.getLogger(__name__)

# Bump when chunking or payload layout changes so existing papers are rebuilt, not mixed.
BUILD_FORMAT = 2
# The BM25 length normalisation needs a corpus-level mean; a fresh index measures it on its
# first batch and keeps it (stored in the build state) so later documents are comparable.
_AVG_LEN_KEY = "bm25_avg_len"


class BuildSummary(BaseModel):
    """What a build did: the figures ``arag library build`` prints and benchmarks record."""

    papers_seen: int = 0
    papers_added: int = 0
    # Of papers_added, those the library held under another build key (their text or chunking changed).
    papers_updated: int = 0
    papers_skipped: int = 0
    papers_failed: int = 0
    chunks_added: int = 0
    chunks_by_type: dict[str, int] = {}
    mean_overlap_sentences: float = 0.0
    texts_embedded: int = Field(
        default=0, description="texts the model ran; the rest came from the embedding cache"
    )
    seconds: float = 0.0
    embed_seconds: float = 0.0
    chunks_per_second: float = 0.0
    failures: list[Failure] = []
    topics_updated: bool = False


@dataclass
class Progress:
    """Callbacks the CLI wires to a progress bar; all optional."""

    start: Callable[[int], None] = lambda total: None
    advance: Callable[[int], None] = lambda n: None
    # After each batch is recorded: its papers and chunks (the service's live build figures).
    written: Callable[[int, int], None] = lambda papers, chunks: None


@dataclass
class _Batch:
    papers: list[Paper]
    chunks: list[list[Chunk]]
    failures: list[Failure] = field(default_factory=list)


def build_key(paper: Paper, model_id: str, settings: Settings) -> str:
    """What must match for an indexed paper to count as up to date."""
    blob = json.dumps(
        {
            "content": paper.content_hash(),
            "model": model_id,
            "chunking": settings.chunking.model_dump(),
            "format": BUILD_FORMAT,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def check_model(state: LibraryState, embedder: BaseEmbedder, settings: Settings) -> None:
    """Record the embedding model of a new library; a ConfigError when the settings select another
    model than the one the library was built with."""
    recorded = state.get_meta("embedding_model")
    if recorded is None:
        state.set_meta("embedding_model", embedder.model_id)
        state.set_meta("embedding_dim", embedder.dim)
    elif recorded != embedder.model_id:
        raise ConfigError(
            f"the library was built with embedding model {recorded!r}, "
            f"but the settings now select {embedder.model_id!r}",
            where=str(settings.data_dir),
            fix="rebuild with `arag library build --rebuild`, or set ARAG_EMBEDDING__* back",
        )


class LibraryBuilder:
    """Owns the state, store and embedder for one build or add; use as a context manager."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: BaseEmbedder | None = None,
        store: Store | None = None,
        lock: AbstractContextManager[object] | None = None,
    ) -> None:
        """``store``: write through an index this process already holds open (the service adds
        papers while it answers); it is left open on close. ``lock``: held around each write to the
        store and its record in the state (the owner of ``store`` closes it only under this lock)."""
        self.settings = settings
        self._lock: AbstractContextManager[object] = lock if lock is not None else nullcontext()
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.embedder = embedder or library_embedder(settings)
        self.state = LibraryState(settings.state_db)
        self._owns_store = store is None
        try:
            self._check_model()
            self.store: Store = store if store is not None else open_store(settings, self.embedder.dim)
        except BaseException:
            self.state.close()
            raise

    def __enter__(self) -> LibraryBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_store:
            self.store.close()
        self.state.close()

    def _check_model(self) -> None:
        check_model(self.state, self.embedder, self.settings)

    # the build
    def index_papers(
        self,
        papers: Sequence[Paper],
        *,
        progress: Progress | None = None,
        prior_failures: Sequence[Failure] = (),
    ) -> BuildSummary:
        """Index every paper not already present under the same build key; return the summary."""
        t0 = time.perf_counter()
        progress = progress or Progress()
        summary = BuildSummary(papers_seen=len(papers) + len(prior_failures))
        keys = self.state.build_keys()
        todo = [p for p in papers if keys.get(p.id) != build_key(p, self.embedder.model_id, self.settings)]
        summary.papers_skipped = len(papers) - len(todo)
        failures: list[Failure] = list(prior_failures)
        if prior_failures:
            self.state.record_failures(prior_failures)
        progress.start(len(todo))
        overlaps: list[int] = []
        by_type: Counter[str] = Counter()
        encoder: BM25Encoder | None = None
        run_before = self.embedder.texts_run
        for batch in self._chunked_batches(todo):
            if batch.failures:
                self.state.record_failures(batch.failures)
                failures.extend(batch.failures)
            flat = [c for cs in batch.chunks for c in cs]
            if encoder is None:
                encoder = self._encoder(flat)
            vectors: np.ndarray | None = None
            sparse: list[SparseVector] = []
            if flat:
                t_embed = time.perf_counter()
                vectors = self._chunk_vectors(flat)
                summary.embed_seconds += time.perf_counter() - t_embed
                sparse = [encoder.encode_document(c.text) for c in flat]
            with self._lock:
                if vectors is not None:
                    # New chunks first, then the papers' other chunks (an older build's, or a crashed
                    # one's): a failure in between leaves each paper searchable, never empty.
                    self.store.upsert(flat, vectors, sparse)
                    self.store.delete_stale([p.id for p in batch.papers], [c.id for c in flat])
                self.store.flush()
                keep_sources(self.settings, batch.papers)  # before the record: a rebuild re-adds from them
                self.state.record_papers(
                    [self._row(p, cs) for p, cs in zip(batch.papers, batch.chunks, strict=True)]
                )
            summary.papers_added += len(batch.papers)
            summary.papers_updated += sum(p.id in keys for p in batch.papers)
            summary.chunks_added += len(flat)
            by_type.update(c.type for c in flat)
            overlaps.extend(c.overlap_sentences for c in flat if c.type == "passage")
            progress.written(len(batch.papers), len(flat))
            progress.advance(len(batch.papers) + len(batch.failures))
        summary.papers_failed = len(failures)
        summary.failures = failures
        summary.chunks_by_type = dict(by_type)
        summary.mean_overlap_sentences = float(np.mean(overlaps)) if overlaps else 0.0
        summary.texts_embedded = self.embedder.texts_run - run_before
        with self._lock:
            if summary.papers_added or self._topics_missing() or map_missing(self.state):
                self.update_topics()
                summary.topics_updated = True
            if summary.papers_added:
                # The engine merges segments and builds its vector index only when asked.
                self.store.optimize()
        summary.seconds = time.perf_counter() - t0
        summary.chunks_per_second = (
            summary.chunks_added / summary.embed_seconds if summary.embed_seconds else 0.0
        )
        return summary

    def _chunk_vectors(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """One unit vector per chunk; a chunk embedded in parts gets the mean of its parts."""
        texts = [t for c in chunks for t in c.texts_to_embed]
        flat = self.embedder.embed(texts)
        if len(texts) == len(chunks):
            return flat
        out = np.empty((len(chunks), flat.shape[1]), dtype=np.float32)
        i = 0
        for row, c in enumerate(chunks):
            n = len(c.texts_to_embed)
            mean = flat[i : i + n].mean(axis=0)
            out[row] = mean / max(float(np.linalg.norm(mean)), 1e-12)
            i += n
        return out

    def _encoder(self, first_chunks: Sequence[Chunk]) -> BM25Encoder:
        avg = self.state.get_meta(_AVG_LEN_KEY)
        if avg is None:
            lengths = [len(tokenize(c.text)) for c in first_chunks]
            avg = float(np.mean(lengths)) if lengths else 100.0
            self.state.set_meta(_AVG_LEN_KEY, avg)
        return BM25Encoder(avg_len=float(avg))

    def _chunked_batches(self, papers: Sequence[Paper]) -> Iterator[_Batch]:
        """Chunk batches in a background thread so tokenising overlaps with embedding."""
        size = max(1, self.settings.store.papers_per_batch)
        q: queue.Queue[_Batch | BaseException | None] = queue.Queue(maxsize=2)

        def produce() -> None:
            try:
                for i in range(0, len(papers), size):
                    q.put(self._chunk_batch(papers[i : i + size]))
                q.put(None)
            except BaseException as exc:  # surfaced in the consumer, never swallowed
                q.put(exc)

        worker = threading.Thread(target=produce, name="arag-chunker", daemon=True)
        worker.start()
        while True:
            item = q.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
        worker.join()

    def _chunk_batch(self, papers: Sequence[Paper]) -> _Batch:
        batch = _Batch(papers=[], chunks=[])
        for paper in papers:
            try:
                chunks = chunk_paper(paper, self.embedder.count_tokens, self.settings.chunking)
                if not chunks:
                    raise IngestError(
                        "no chunk survived chunking (no text?)",
                        where=f"paper {paper.id}",
                        fix="check the source document",
                    )
            except Exception as exc:  # one bad paper is logged and skipped, never silently dropped
                log.warning("skipping paper %s: %s", paper.id, exc)
                batch.failures.append(Failure(key=paper.id, source=paper.source, reason=str(exc)))
                continue
            batch.papers.append(paper)
            batch.chunks.append(chunks)
        return batch

    def _row(self, paper: Paper, chunks: Sequence[Chunk]) -> PaperRow:
        abstract = next((c.texts_to_embed[0] for c in chunks if c.type == "abstract"), paper.title)
        return PaperRow(
            id=paper.id,
            title=paper.title,
            source=paper.source,
            source_path=paper.source_path,
            build_key=build_key(paper, self.embedder.model_id, self.settings),
            n_chunks=len(chunks),
            year=paper.year,
            month=paper.month,
            authors=paper.authors,
            topic=None,
            topic_label=None,
            abstract_text=abstract,
        )

    # topics
    def _topics_missing(self) -> bool:
        return any(r.topic is None for r in self.state.papers())

    def update_topics(self, *, recluster: bool = False) -> None:
        """Cluster abstract vectors (or place new papers at the nearest existing centroid)."""
        rows = self.state.papers()
        if not rows:
            return
        vectors = self.embedder.embed([r.abstract_text or r.title for r in rows])
        centroids = self.state.get_meta("topic_centroids")
        clustered_n = self.state.get_meta("topic_clustered_papers") or 0
        grown = len(rows) > 1.1 * clustered_n
        reclustered = recluster or centroids is None or grown
        if reclustered:
            assign, cents = kmeans(vectors, self.settings.topics.k, seed=self.settings.topics.seed)
            labels = label_clusters(
                [r.abstract_text or r.title for r in rows],
                assign.tolist(),
                self.settings.topics.label_terms,
            )
            self.state.set_meta("topic_centroids", cents.tolist())
            self.state.set_meta("topic_labels", {str(k): v for k, v in labels.items()})
            self.state.set_meta("topic_clustered_papers", len(rows))
        else:
            cents = np.asarray(centroids, dtype=np.float32)
            assign = assign_nearest(vectors, cents)
            labels = {int(k): v for k, v in (self.state.get_meta("topic_labels") or {}).items()}
        topics = {
            r.id: (int(a), labels.get(int(a), f"topic {int(a)}")) for r, a in zip(rows, assign, strict=True)
        }
        current = {r.id: (r.topic, r.topic_label) for r in rows}
        changed = {pid: t for pid, t in topics.items() if current[pid] != t}
        if changed:
            self.store.set_topics(changed)
            self.store.flush()
            self.state.set_topics(changed)
        # The map is drawn anew with the topics, otherwise new papers are placed among the mapped ones;
        # after the topics are written, so that a kill during t-SNE (a minute on the full library) leaves
        # the topics whole and only the map missing, which the next build or `arag library topics` draws.
        ts = self.settings.topics
        update_map(self.state, rows, vectors, method=ts.map_method, seed=ts.seed, recompute=reclustered)
