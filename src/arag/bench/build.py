"""Build benchmark: a from-scratch build of N papers, a no-op rebuild, and embedding throughput
against a baseline in the same run: for the dynamic int8 MiniLM (the default), the packaged model as
it was used before (weights dequantised to fp32, length-sorted batches), and with ``baseline_build``
a whole second build of the same papers with it; for other models, batches in input order (each pads
to its longest text)."""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from arag.library.build import BuildSummary, Progress
from arag.library.manage import build_library, library_status
from arag.models.embedder import BaseEmbedder
from arag.models.factory import get_embedder, library_embedder
from arag.settings import Settings


class EmbedThroughput(BaseModel):
    texts: int
    batch_size: int
    threads: int
    ours_chunks_per_s: float
    baseline_chunks_per_s: float
    speedup: float
    repeats: int
    baseline: str = "input-order batches"


class BuildBench(BaseModel):
    papers: int
    data_dir: str
    build: BuildSummary
    build_seconds: float
    noop_build_seconds: float
    noop_papers_added: int
    chunks: int
    chunks_by_type: dict[str, int]
    index_bytes: int
    peak_rss_mib: float
    embedding: EmbedThroughput | None
    # The same papers built with the baseline model in the same run (``baseline_build``).
    baseline_model: str | None = None
    baseline_build_seconds: float | None = None
    build_speedup: float | None = None


def _peak_rss_mib() -> float:
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def embed_throughput(
    settings: Settings,
    embedder: BaseEmbedder,
    texts: list[str],
    repeats: int = 3,
    baseline_embedder: BaseEmbedder | None = None,
) -> EmbedThroughput:
    """Chunks/s of the configured embedder (length-sorted batches) vs ``baseline_embedder`` doing the
    same, or, without one, vs the same model on input-order batches."""
    bs = settings.embedding.batch_size

    def ours() -> None:
        embedder.embed(texts)

    def baseline() -> None:
        if baseline_embedder is not None:
            baseline_embedder.embed(texts)
            return
        # The naive way: batches in input order, so a short chunk pays for the longest beside it.
        for i in range(0, len(texts), bs):
            embedder.embed_batch(texts[i : i + bs])

    def median_rate(fn: object) -> float:
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            rates.append(len(texts) / (time.perf_counter() - t0))
        return float(np.median(rates))

    ours_rate = median_rate(ours)
    base_rate = median_rate(baseline)
    return EmbedThroughput(
        texts=len(texts),
        batch_size=bs,
        threads=settings.embedding.threads,
        ours_chunks_per_s=ours_rate,
        baseline_chunks_per_s=base_rate,
        speedup=ours_rate / base_rate,
        repeats=repeats,
        baseline=baseline_embedder.model_id if baseline_embedder is not None else "input-order batches",
    )


def run_build_bench(
    settings: Settings,
    papers: int | None,
    *,
    data_dir: Path | None = None,
    embed_sample: int = 512,
    progress: Progress | None = None,
    baseline_build: bool = False,
) -> BuildBench:
    """Build ``papers`` papers into a fresh data directory, rebuild (no-op), measure throughput; with
    ``baseline_build`` (dynamic int8 MiniLM only) then build them again with the packaged weights
    model in another fresh folder."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="arag-bench-")
        data_dir = Path(tmp)
    bench_settings = settings.model_copy(
        update={"data_dir": data_dir, "corpus": settings.corpus.model_copy(update={"max_papers": papers})}
    )
    t0 = time.perf_counter()
    summary = build_library(bench_settings, progress=progress)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    noop = build_library(bench_settings)
    noop_s = time.perf_counter() - t1
    st = library_status(bench_settings)
    throughput = None
    dynamic = settings.embedding.provider == "onnx-minilm" and settings.embedding.int8 == "dynamic"
    weights = settings.embedding.model_copy(update={"int8": "weights"})
    if embed_sample and settings.embedding.provider == "onnx-minilm":
        # No cache: measure the model.
        embedder = library_embedder(bench_settings, cached=False)
        base = get_embedder(weights, None) if dynamic else None
        texts = sample_chunk_texts(bench_settings, embedder, embed_sample)
        if texts:
            throughput = embed_throughput(bench_settings, embedder, texts, baseline_embedder=base)
    baseline_model = baseline_s = None
    if baseline_build and dynamic:
        with tempfile.TemporaryDirectory(prefix="arag-bench-baseline-") as other:
            base_settings = bench_settings.model_copy(update={"data_dir": Path(other), "embedding": weights})
            t2 = time.perf_counter()
            build_library(base_settings, progress=progress)
            baseline_s = time.perf_counter() - t2
            baseline_model = library_status(base_settings).embedding_model
    return BuildBench(
        papers=st.papers,
        data_dir=str(data_dir),
        build=summary,
        build_seconds=build_s,
        noop_build_seconds=noop_s,
        noop_papers_added=noop.papers_added,
        chunks=st.chunks,
        chunks_by_type=st.chunks_by_type,
        index_bytes=st.index_bytes,
        peak_rss_mib=_peak_rss_mib(),
        embedding=throughput,
        baseline_model=baseline_model,
        baseline_build_seconds=baseline_s,
        build_speedup=baseline_s / build_s if baseline_s else None,
    )


def sample_chunk_texts(settings: Settings, embedder: BaseEmbedder, n: int) -> list[str]:
    """Embed texts of real chunks: the first papers' chunks, as the build makes them."""
    from arag.corpus.qasper import load_qasper
    from arag.ingest.chunker import chunk_paper

    texts: list[str] = []
    papers, _ = load_qasper(settings.corpus.qasper_path, max_papers=max(1, n // 20))
    for paper in papers:
        texts.extend(c.embed_text for c in chunk_paper(paper, embedder.count_tokens, settings.chunking))
    return texts[:n]
