"""How the embedded store scales: build and query cost, memory and disk at growing chunk counts.

Sizes past the real library are synthetic: chunk i copies the text and payload of a real chunk
(cycling through a sample of the built library) under a new id and paper, and its vector is that
chunk's vector plus Gaussian noise (cosine about 0.93 to the original), renormalised; so BM25 sees
real term statistics and the vector index real-looking, not uniform, vectors. The queries are real
QASPER validation questions embedded by the library's model. Each size is built and queried in a
fresh process so its memory figures are its own.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import psutil
from pydantic import BaseModel

from arag.errors import InputError
from arag.index.sparse import BM25Encoder, SparseVector
from arag.records import Chunk

BASE_CHUNKS = 25_000
CHUNKS_PER_PAPER = 40
NOISE = 0.02  # per dimension: |noise| ~ 0.39 for 384 dims
BATCH = 1024


class ScalePoint(BaseModel):
    chunks: int
    upsert_s: float
    optimize_s: float
    disk_mib: float
    open_s: float
    rss_mib: float  # the index's memory once open and queried: RSS after minus RSS before opening
    dense_ms: float
    sparse_ms: float
    hybrid_ms: float
    queries: int


class ScaleBench(BaseModel):
    base_chunks: int
    points: list[ScalePoint]
    per_100k_disk_mib: float
    per_100k_rss_mib: float


def export_base(settings_dir: Path, out: Path, queries: list[str], n: int = BASE_CHUNKS) -> None:
    """A sample of the built library's chunks and vectors, and the embedded queries, into ``out``."""
    from arag.index.qdrant_edge import EdgeStore
    from arag.library.state import LibraryState
    from arag.models.factory import library_embedder
    from arag.settings import get_settings

    # The embedded store itself, whatever backend the settings name: the figures are about it.
    settings = get_settings(data_dir=settings_dir)
    with LibraryState(settings.state_db) as state:
        dim = state.get_meta("embedding_dim")
    if dim is None:
        raise InputError(
            f"there is no library in {settings.data_dir}", where="ARAG_DATA_DIR", fix="arag library build"
        )
    embedder = library_embedder(settings)
    store = EdgeStore.open(settings.index_dir, int(dim), create=False)
    try:
        rows: list[dict] = []
        for payload in store._scroll_payloads(list(Chunk.model_fields)):
            rows.append(payload)
            if len(rows) >= n:
                break
        vectors = np.concatenate(
            [store.get_vectors([r["id"] for r in rows[i : i + 2048]]) for i in range(0, len(rows), 2048)]
        )
    finally:
        store.close()
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "vectors.npy", vectors.astype(np.float32))
    np.save(out / "queries.npy", embedder.embed(queries).astype(np.float32))
    (out / "chunks.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (out / "queries.json").write_text(json.dumps(queries))


def _synthetic(base: list[Chunk], i: int) -> Chunk:
    src = base[i % len(base)]
    pid = f"syn{i // CHUNKS_PER_PAPER:06d}"
    return src.model_copy(update={"id": f"{pid}:{i % CHUNKS_PER_PAPER:04d}:{i:08x}", "paper_id": pid})


def build(size: int, base_dir: Path, work: Path, seed: int = 0) -> dict[str, float]:
    """Build a ``size``-chunk index in ``work`` (a fresh process): upsert and optimize seconds."""
    from arag.index.qdrant_edge import EdgeStore

    base = [Chunk(**json.loads(line)) for line in (base_dir / "chunks.jsonl").read_text().splitlines()]
    vectors = np.load(base_dir / "vectors.npy")
    encoder = BM25Encoder(avg_len=_avg_len(base))
    sparse_base: list[SparseVector] = [encoder.encode_document(c.text) for c in base]
    rng = np.random.default_rng(seed)
    dim = vectors.shape[1]
    store = EdgeStore.open(work, dim)
    t0 = time.perf_counter()
    for start in range(0, size, BATCH):
        idx = np.arange(start, min(size, start + BATCH))
        vecs = vectors[idx % len(base)] + rng.normal(0, NOISE, (len(idx), dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        chunks = [_synthetic(base, int(i)) for i in idx]
        store.upsert(chunks, vecs, [sparse_base[int(i) % len(base)] for i in idx])
    store.flush()
    upsert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.optimize()
    optimize_s = time.perf_counter() - t0
    store.close()
    return {"upsert_s": upsert_s, "optimize_s": optimize_s}


def _avg_len(base: list[Chunk]) -> float:
    return float(np.mean([len(c.text.split()) for c in base]))


def query(base_dir: Path, work: Path, dim: int) -> dict[str, float]:
    """Open the index in ``work`` (a fresh process) and time the queries; RSS before and after."""
    from arag.index.qdrant_edge import EdgeStore
    from arag.retrieval.fusion import fuse_chunks

    queries = json.loads((base_dir / "queries.json").read_text())
    qvecs = np.load(base_dir / "queries.npy")
    encoder = BM25Encoder(avg_len=120.0)
    svecs = [encoder.encode_query(q) for q in queries]
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    store = EdgeStore.open(work, dim, create=False)
    open_s = time.perf_counter() - t0
    dense: list[float] = []
    sparse: list[float] = []
    hybrid: list[float] = []
    for _ in range(2):  # the first round warms the caches; the second is measured
        dense, sparse, hybrid = [], [], []
        for v, sv in zip(qvecs, svecs, strict=True):
            t0 = time.perf_counter()
            d = store.dense_search(v, 15)
            t1 = time.perf_counter()
            s = store.sparse_search(sv, 20)
            t2 = time.perf_counter()
            fuse_chunks([d, s], limit=25)
            t3 = time.perf_counter()
            dense.append(1000 * (t1 - t0))
            sparse.append(1000 * (t2 - t1))
            hybrid.append(1000 * (t3 - t0))
    rss1 = psutil.Process().memory_info().rss
    store.close()
    return {
        "open_s": open_s,
        "rss_mib": (rss1 - rss0) / 2**20,
        "dense_ms": statistics.median(dense),
        "sparse_ms": statistics.median(sparse),
        "hybrid_ms": statistics.median(hybrid),
        "queries": len(queries),
    }


def measure(size: int, base_dir: Path, work: Path) -> ScalePoint:
    """One size: built in one fresh process, queried in another (so memory is the index's own)."""
    ctx = get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        b = pool.submit(build, size, base_dir, work).result()
    disk = sum(p.stat().st_blocks * 512 for p in work.rglob("*") if p.is_file())
    dim = int(np.load(base_dir / "queries.npy").shape[1])
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        q = pool.submit(query, base_dir, work, dim).result()
    return ScalePoint(
        chunks=size,
        upsert_s=round(b["upsert_s"], 1),
        optimize_s=round(b["optimize_s"], 1),
        disk_mib=round(disk / 2**20, 1),
        open_s=round(q["open_s"], 2),
        rss_mib=round(q["rss_mib"], 1),
        dense_ms=round(q["dense_ms"], 2),
        sparse_ms=round(q["sparse_ms"], 2),
        hybrid_ms=round(q["hybrid_ms"], 2),
        queries=int(q["queries"]),
    )


def run_scale_bench(library_dir: Path, work: Path, sizes: list[int], queries: list[str]) -> ScaleBench:
    """Export a base sample from the library in ``library_dir``, then measure each size in turn."""
    base_dir = work / "base"
    export_base(library_dir, base_dir, queries)
    n_base = len((base_dir / "chunks.jsonl").read_text().splitlines())
    points = [measure(size, base_dir, work / f"index-{size}") for size in sizes]
    big, small = points[-1], points[0]
    span = (big.chunks - small.chunks) / 100_000 if len(points) > 1 else big.chunks / 100_000
    return ScaleBench(
        base_chunks=n_base,
        points=points,
        per_100k_disk_mib=round((big.disk_mib - (small.disk_mib if len(points) > 1 else 0)) / span, 1),
        per_100k_rss_mib=round((big.rss_mib - (small.rss_mib if len(points) > 1 else 0)) / span, 1),
    )
