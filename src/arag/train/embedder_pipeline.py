"""The whole ``arag train embedder`` run: mine (question, evidence chunk, hard negative) triples from
the built library, fine-tune (:mod:`arag.train.embedder`), export, re-quantise per output channel as
the default embedder is, measure on the held-out train papers' questions against the library's own
embedder in the same run, and install with a card. Nothing is fit on validation.

The measure is the one the dense list has to meet within a paper: each held-out question's paper's
chunks ranked by cosine to the question, nDCG@10 and Recall@10 against the gold evidence (the
matching rule of :mod:`arag.eval.retrieval`). Whether a trained model is worth a rebuild is decided
library-wide on validation (``arag eval retrieval`` over a library built with it: see the README).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from arag.corpus.qasper_questions import EvalQuestion
from arag.errors import ModelError
from arag.eval.retrieval import hits_per_rank, ndcg_at, recall_at
from arag.index.store import Store
from arag.models.embedder import BaseEmbedder, l2_normalize
from arag.models.onnx_files import MODEL_FILE, file_sha256
from arag.models.onnx_minilm import EmbedderCard, OnnxMiniLMEmbedder, quantize_per_channel
from arag.records import Chunk, SearchFilter
from arag.retrieval.hybrid import HybridRetriever
from arag.settings import Settings
from arag.train.data import PAPER_CHUNKS, cache_key, cached
from arag.train.embedder import (
    EmbedderExample,
    EmbedderTrainConfig,
    export_token_vectors,
    torch_vectors,
    train_bi_encoder,
)
from arag.train.reranker import BASE_MODEL, require_torch
from arag.train.reranker_pipeline import calibration_split
from arag.train.trainer import ProgressFactory, each, in_library, install_model, library_key, quiet

# The fp32 export must give the PyTorch model's vectors up to rounding.
EXPORT_TOLERANCE = 1e-3
WHERE = "arag train embedder"


def paper_chunks(q: EvalQuestion, retriever: HybridRetriever) -> list[Chunk]:
    """Every chunk of the question's paper, in the library embedder's dense order for the question."""
    scope = SearchFilter(paper_ids=[q.paper_id])
    hits = retriever.store.dense_search(retriever.embedder.embed_query(q.question), PAPER_CHUNKS, scope)
    return [h.chunk for h in hits]


def mine_example(q: EvalQuestion, retriever: HybridRetriever, *, negatives: int = 8) -> EmbedderExample:
    """A question's evidence chunks and its hard negatives: the paper's chunks that the hybrid
    search scoped to the paper ranks highest but that hold no evidence (texts as embedded)."""
    chunks = paper_chunks(q, retriever)
    hits = hits_per_rank([c.text for c in chunks], q.evidence)
    gold = {c.id for c, h in zip(chunks, hits, strict=True) if h}
    fused = retriever.search(q.question, SearchFilter(paper_ids=[q.paper_id])).fused
    hard = [h.chunk.texts_to_embed[0] for h in fused if h.chunk.id not in gold][:negatives]
    return EmbedderExample(
        question_id=q.question_id,
        paper_id=q.paper_id,
        question=q.question,
        positives=[c.texts_to_embed[0] for c in chunks if c.id in gold],
        negatives=hard,
    )


@dataclass(frozen=True)
class HeldOut:
    """One held-out question: its paper's chunks (their texts as embedded, in the library
    embedder's order) and which gold paragraphs each holds."""

    question: str
    paper_id: str
    texts: list[list[str]]
    hits: list[set[int]]
    n_gold: int


def held_out_case(q: EvalQuestion, retriever: HybridRetriever) -> HeldOut:
    chunks = paper_chunks(q, retriever)
    return HeldOut(
        question=q.question,
        paper_id=q.paper_id,
        texts=[c.texts_to_embed for c in chunks],
        hits=hits_per_rank([c.text for c in chunks], q.evidence),
        n_gold=len(q.evidence),
    )


def ranking_figures(cases: Sequence[HeldOut], orders: Sequence[Sequence[int]]) -> dict[str, float]:
    """Mean nDCG@10 and Recall@10 of each case's chunks taken in ``orders``' order."""
    ndcg, recall = [], []
    for c, order in zip(cases, orders, strict=True):
        ranked = [c.hits[i] for i in order]
        ndcg.append(ndcg_at(ranked, c.n_gold, 10))
        recall.append(recall_at(ranked, c.n_gold, 10))
    return {"ndcg@10": round(float(np.mean(ndcg)), 4), "recall@10": round(float(np.mean(recall)), 4)}


def dense_orders(
    cases: Sequence[HeldOut], embed: Callable[[Sequence[str]], np.ndarray], advance: Callable[[int], None]
) -> tuple[list[list[int]], float]:
    """Each case's chunks ordered by cosine to its question under ``embed`` (a chunk of several
    parts is their mean vector, as the library stores it), and the median ms per text."""
    # A paper's chunks are embedded once. Keyed by text: each question lists its paper's chunks in
    # its own order.
    vectors: dict[tuple[str, ...], np.ndarray] = {}
    times: list[float] = []
    orders = []
    for c in cases:
        q = embed([c.question])[0]
        rows = []
        for parts in c.texts:
            key = tuple(parts)
            if key not in vectors:
                t0 = time.perf_counter()
                vectors[key] = l2_normalize(embed(parts).mean(axis=0, keepdims=True))[0]
                times.append(1000 * (time.perf_counter() - t0) / len(parts))
            rows.append(vectors[key])
        scores = np.vstack(rows) @ q if rows else np.zeros(0)
        orders.append([int(i) for i in np.argsort(-scores, kind="stable")])
        advance(1)
    return orders, statistics.median(times) if times else 0.0


def train_embedder(
    settings: Settings,
    cfg: EmbedderTrainConfig,
    *,
    train_path: Path,
    val_path: Path | None = None,
    train_limit: int | None = None,
    val_limit: int | None = None,
    progress: ProgressFactory = quiet,
    library: tuple[Store, BaseEmbedder] | None = None,
) -> EmbedderCard:
    """Train, export, re-quantise, measure and install the embedder into
    ``settings.trained_embedder_dir``; measured on ``val_path``, by default on the held-out papers
    of ``train_path``. The library's own embedder is the baseline of the same run."""
    from arag.train.trainer import mining_retrievers

    require_torch()
    t_start = time.perf_counter()
    with mining_retrievers(settings, library) as (store, plain, _):
        papers = store.paper_ids()
        train_raw, val_raw, val_name = calibration_split(train_path, val_path, train_limit, val_limit)
        train_qs = in_library(train_raw, papers, "training", WHERE)
        val_qs = in_library(val_raw, papers, "held-out", WHERE)
        lib = library_key(settings)
        tag = f"{train_limit}-{val_limit}" + ("-held-out" if val_path is None else "")
        examples: list[EmbedderExample] = cached(
            settings.cache_dir / "embedder" / f"train-{cache_key(train_path, lib, tag)}.json",
            EmbedderExample,
            lambda: each(progress, "mining train", "questions", train_qs, lambda q: mine_example(q, plain)),
        )
        held = each(progress, "held-out questions", "questions", val_qs, lambda q: held_out_case(q, plain))
        library_model = plain.embedder.model_id
    baseline = ranking_figures(held, [list(range(len(c.texts))) for c in held])

    with progress("training", "steps") as bar:
        net, stats = train_bi_encoder(examples, cfg, on_start=bar.start, on_step=bar.advance)

    out_dir = settings.trained_embedder_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".embedder-"))
    try:
        export_token_vectors(net, work / "export.onnx")
        # Writes fp32.onnx and int8.onnx, both without the softmax NaN guards.
        quantize_per_channel(work / "export.onnx", work)
        runs: dict[str, dict[str, Any]] = {}
        for name in ("fp32", "int8"):
            model = OnnxMiniLMEmbedder(
                settings.embedding,
                model_path=work / f"{name}.onnx",
                model_id=f"draft-{name}" if name == "int8" else None,
            )
            if name == "fp32":
                _check_export(net, model, held, where=work / "fp32.onnx")
            with progress(f"measuring {name}", "questions") as bar:
                bar.start(len(held))
                orders, ms = dense_orders(held, model.embed_batch, bar.advance)
            runs[name] = {**ranking_figures(held, orders), "median_ms_per_text": round(ms, 2)}
            model.close()
        drop = runs["fp32"]["ndcg@10"] - runs["int8"]["ndcg@10"]
        # int8 keeps the default's speed (one text a run); fp32 only when int8 costs real quality.
        chosen = "int8" if drop <= 0.005 else "fp32"
        shutil.copyfile(work / f"{chosen}.onnx", work / MODEL_FILE)
        for f in ("export.onnx", "fp32.onnx", "int8.onnx"):
            (work / f).unlink(missing_ok=True)
        digest = file_sha256(work / MODEL_FILE)
        card = EmbedderCard(
            model_id=f"minilm-l6-qasper-{digest[:8]}" + ("-dynamic-int8" if chosen == "int8" else "-fp32"),
            base_model=BASE_MODEL,
            quantized=chosen == "int8",
            onnx_sha256=digest,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            seed=cfg.seed,
            data={
                "train": train_path.name,
                "train_questions": len(examples),
                "train_questions_used": sum(1 for e in examples if e.positives and e.negatives),
                "validation": val_name,
                "validation_questions": len(held),
                "query": "the question alone (a named paper's questions are searched within it)",
                "positives": "chunks holding a sentence of a gold evidence paragraph",
                "negatives": "the paper's top hybrid-retrieved chunks that hold no evidence; "
                "in-batch: the other questions' chunks (one question per paper in a batch)",
            },
            training={**cfg.model_dump(), **stats.model_dump()},
            validation={
                "measure": "the question's paper's chunks ranked by cosine (dense, paper-scoped)",
                "library_embedder": {"model_id": library_model, **baseline},
                "fp32": runs["fp32"],
                "int8": runs["int8"],
                "chosen": chosen,
                "int8_ndcg_drop": round(drop, 4),
                "total_seconds": round(time.perf_counter() - t_start, 1),
            },
        )
        install_model(work, out_dir, card)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return card


def _check_export(net: Any, model: OnnxMiniLMEmbedder, held: Sequence[HeldOut], *, where: Path) -> None:
    """A ModelError unless the fp32 export gives the PyTorch model's vectors (a long and a short text)."""
    texts = [t for c in held[:2] for parts in c.texts[:2] for t in parts] + ["A short passage."]
    ref = torch_vectors(net, texts, model.max_length)
    got = np.vstack([model.embed_batch([t]) for t in texts])
    if float(np.max(np.abs(ref - got))) > EXPORT_TOLERANCE:
        raise ModelError(
            f"the ONNX export differs from the PyTorch model by {np.max(np.abs(ref - got)):.4g}",
            where=str(where),
            fix="report this as a bug; the PyTorch model is not installed",
        )
