"""The whole ``arag train reranker`` run: mine, train, export, choose int8 or fp32, calibrate, and
install the model with its card. The model folder is replaced in one rename, so a crash leaves
the previous model (or none), never half of one."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from arag.corpus.qasper_questions import EvalQuestion, load_questions
from arag.errors import ModelError
from arag.index.store import Store
from arag.library.build import Progress
from arag.models.embedder import BaseEmbedder
from arag.models.reranker import (
    CARD_FILE,
    MODEL_FILE,
    Bars,
    ModelCard,
    OnnxReranker,
    file_sha256,
    replace_card,
)
from arag.settings import Settings
from arag.train.calibrate import (
    calibrate_bars,
    combined_scores,
    fit_fusion_weight,
    kept_f1,
    rank_metrics,
    score_histogram,
)
from arag.train.data import Candidates, MinedQuestion, cache_key, cached, candidates_for, mine_question
from arag.train.reranker import (
    BASE_MODEL,
    TrainConfig,
    export_variants,
    require_torch,
    torch_scores,
    train_net,
)

log = logging.getLogger(__name__)

ProgressFactory = Callable[[str, str], AbstractContextManager[Progress]]
# The export must reproduce the PyTorch scores; fp32 ONNX differs from PyTorch by rounding only.
EXPORT_TOLERANCE = 1e-3


@contextlib.contextmanager
def _quiet(label: str, unit: str) -> Iterator[Progress]:
    yield Progress()


def _library_key(settings: Settings) -> str:
    from arag.library.state import LibraryState

    state = LibraryState(settings.state_db)
    try:
        keys = state.build_keys()
        model = state.get_meta("embedding_model")
    finally:
        state.close()
    blob = "\n".join(f"{k}={v}" for k, v in sorted(keys.items())) + f"\n{model}\n{settings.retrieval!r}"
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def score_all(
    reranker: OnnxReranker, cands: Sequence[Candidates], advance: Callable[[int], None]
) -> tuple[list[np.ndarray], float]:
    """Scores for every candidate list, and the median milliseconds per list."""
    out, times = [], []
    for c in cands:
        t0 = time.perf_counter()
        out.append(reranker.score(c.query, c.texts))
        times.append(1000 * (time.perf_counter() - t0))
        advance(1)
    return out, statistics.median(times) if times else 0.0


def check_export(
    net: Any, model: OnnxReranker, query: str, texts: Sequence[str], max_length: int, *, where: Path
) -> None:
    """A ModelError unless the exported ``model`` scores ``texts`` (and a short passage) as ``net`` does."""
    # A long and a short passage in one batch: the check covers truncation and padding.
    texts = [*texts, "A short passage."]
    ref = torch_scores(net, query, texts, max_length)
    got = model.score(query, texts)
    if float(np.max(np.abs(ref - got))) > EXPORT_TOLERANCE:
        raise ModelError(
            f"the ONNX export differs from the PyTorch model by {np.max(np.abs(ref - got)):.4g}",
            where=str(where),
            fix="report this as a bug; the PyTorch model is not installed",
        )


def install_model(work: Path, out_dir: Path, card: ModelCard) -> None:
    """Write ``card`` into ``work`` (which holds model.onnx) and put ``work`` in ``out_dir``'s place:
    renames only, so a crash leaves the previous model (or none), never half of one."""
    (work / CARD_FILE).write_text(card.model_dump_json(indent=2))
    old = out_dir.with_name(out_dir.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if out_dir.exists():
        out_dir.rename(old)
    work.rename(out_dir)
    if old.exists():
        shutil.rmtree(old)


class Calibration(BaseModel):
    """The fusion weight and bars fit on validation, with the figures they give."""

    fusion_weight: float
    bars: Bars
    validation: dict[str, Any]
    calibration: dict[str, Any]


def calibrate(val: Sequence[Candidates], scores: Sequence[np.ndarray], settings: Settings) -> Calibration:
    """Fit the fusion weight (nDCG@10), then the bars on the final scores (kept-set evidence F1)."""
    rs = settings.rerank
    weight, fit = fit_fusion_weight(val, scores)
    final = combined_scores(scores, weight)
    bars, kept = calibrate_bars(val, final, keep=rs.keep, supported_rank=rs.supported_rank)
    return Calibration(
        fusion_weight=weight,
        bars=bars,
        validation={
            "final": rank_metrics(val, final),
            "final_ndcg@10_two_fold": round(fit["ndcg@10_two_fold"], 4),
            "kept_set": kept,
            "kept_set_without_bars": kept_f1(
                val, final, None, keep=rs.keep, supported_rank=rs.supported_rank
            ),
        },
        calibration={
            "method": "fusion weight: the grid value (0..4 by 0.1) of w in score - w * ln(fused rank) "
            "with the best mean nDCG@10 on QASPER validation (two-fold cross-fit figure beside it); "
            "bars: the (lower, upper) pair from quantiles of the final scores with the best mean "
            "kept-set evidence F1",
            "histogram": score_histogram(val, final, supported_rank=rs.supported_rank),
        },
    )


def recalibrate(settings: Settings, val_path: Path, *, progress: ProgressFactory = _quiet) -> ModelCard:
    """Refit the installed model's fusion weight and bars on validation (the weights are untouched)."""
    from arag.library.manage import open_retrieval

    model = OnnxReranker(
        settings.reranker_dir, threads=settings.rerank.threads, max_length=settings.rerank.max_length
    )
    with open_retrieval(settings) as retrieval:
        val_qs = _in_library(load_questions(val_path), retrieval.store.paper_ids(), "validation")
        resolving = retrieval.hybrid
        with progress("validation candidates", "questions") as bar:
            bar.start(len(val_qs))
            val = []
            for q in val_qs:
                val.append(candidates_for(q, resolving))
                bar.advance(1)
    with progress("scoring", "questions") as bar:
        bar.start(len(val))
        scores, ms = score_all(model, val, bar.advance)
    calib = calibrate(val, scores, settings)
    card = model.card.model_copy(
        update={
            "bars": calib.bars,
            "fusion_weight": calib.fusion_weight,
            "inference_max_length": model.max_length,
            "validation": {
                **model.card.validation,
                **calib.validation,
                "median_ms_per_list": {
                    **model.card.validation.get("median_ms_per_list", {}),
                    model.card.validation.get("chosen", "model"): round(ms, 1),
                },
            },
            "calibration": {**model.card.calibration, **calib.calibration},
        }
    )
    replace_card(settings.reranker_dir, card)
    return card


def _in_library(
    qs: list[EvalQuestion], papers: set[str], what: str, where: str = "arag train reranker"
) -> list[EvalQuestion]:
    kept = [q for q in qs if q.paper_id in papers]
    if not kept:
        raise ModelError(
            f"none of the {len(qs)} {what} questions' papers is in the library",
            where=where,
            fix="build the full QASPER library first: arag library build",
        )
    if len(kept) < 0.9 * len(qs):
        log.warning("only %d of %d %s questions have their paper in the library", len(kept), len(qs), what)
    return kept


def train_reranker(
    settings: Settings,
    cfg: TrainConfig,
    *,
    train_path: Path,
    val_path: Path,
    train_limit: int | None = None,
    val_limit: int | None = None,
    progress: ProgressFactory = _quiet,
    library: tuple[Store, BaseEmbedder] | None = None,
) -> ModelCard:
    """Train, export, calibrate and install the reranker into ``settings.reranker_dir``.
    ``library``: mine through a store and embedder this process holds open (the service trains in
    the background); it is left open."""
    from arag.library.manage import load_resolver, open_retrieval
    from arag.retrieval.hybrid import HybridRetriever

    require_torch()
    t_start = time.perf_counter()
    with ExitStack() as stack:
        if library is None:
            retrieval = stack.enter_context(open_retrieval(settings))
            store, plain, resolving = retrieval.store, retrieval.plain, retrieval.hybrid
        else:
            store, embedder = library
            plain = HybridRetriever(store, embedder, settings.retrieval)
            resolving = HybridRetriever(store, embedder, settings.retrieval, load_resolver(settings))
        papers = store.paper_ids()
        train_qs = _in_library(load_questions(train_path, limit=train_limit), papers, "training")
        val_qs = _in_library(load_questions(val_path, limit=val_limit), papers, "validation")
        lib = _library_key(settings)
        cache = settings.cache_dir / "reranker"

        def mine_all() -> list[MinedQuestion]:
            with progress("mining train", "questions") as bar:
                bar.start(len(train_qs))
                out = []
                for q in train_qs:
                    out.append(mine_question(q, plain, resolving))
                    bar.advance(1)
                return out

        def candidates_all() -> list[Candidates]:
            with progress("validation candidates", "questions") as bar:
                bar.start(len(val_qs))
                out = []
                for q in val_qs:
                    out.append(candidates_for(q, resolving))
                    bar.advance(1)
                return out

        tag = f"{train_limit}-{val_limit}"
        mined: list[MinedQuestion] = cached(
            cache / f"train-{cache_key(train_path, lib, tag)}.json", MinedQuestion, mine_all
        )
        val: list[Candidates] = cached(
            cache / f"val-{cache_key(val_path, lib, tag)}.json", Candidates, candidates_all
        )

    with progress("training", "steps") as bar:
        net, stats = train_net(mined, cfg, on_start=bar.start, on_step=bar.advance)

    out_dir = settings.reranker_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".reranker-"))
    try:
        fp32, int8, draft = export_variants(net, cfg, work)
        runs = {}
        for name, path in (("fp32", fp32), ("int8", int8)):
            model = OnnxReranker(
                work, threads=cfg.threads, card=draft, model_file=path, max_length=cfg.inference_max_length
            )
            if name == "fp32":
                check_export(net, model, val[0].query, val[0].texts[:4], model.max_length, where=fp32)
            with progress(f"validating {name}", "questions") as bar:
                bar.start(len(val))
                scores, ms = score_all(model, val, bar.advance)
            runs[name] = (scores, ms, rank_metrics(val, scores))
        baseline = rank_metrics(val, [-np.arange(len(c.texts), dtype=np.float32) for c in val])
        drop = runs["fp32"][2]["ndcg@10"] - runs["int8"][2]["ndcg@10"]
        use_int8 = cfg.quantize == "int8" or (cfg.quantize == "auto" and drop <= cfg.max_int8_ndcg_drop)
        chosen = "int8" if use_int8 else "fp32"
        scores = runs[chosen][0]
        calib = calibrate(val, scores, settings)
        shutil.copyfile(int8 if use_int8 else fp32, work / MODEL_FILE)
        for f in (fp32, int8):
            f.unlink()
        digest = file_sha256(work / MODEL_FILE)
        card = ModelCard(
            model_id=f"minilm-l{cfg.layers}-qasper-{digest[:8]}",
            base_model=BASE_MODEL,
            layers=cfg.layers,
            max_length=cfg.max_length,
            inference_max_length=cfg.inference_max_length,
            quantized=use_int8,
            onnx_sha256=digest,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            seed=cfg.seed,
            data={
                "train": str(train_path.name),
                "train_questions": len(mined),
                "train_questions_with_positive": sum(1 for m in mined if m.positives),
                "validation": str(val_path.name),
                "validation_questions": len(val),
                "candidates": "library-wide hybrid + paper resolution, fused top "
                f"{settings.retrieval.fused_k}; query: \"In the paper '<title>': <question>\"",
                "positives": "chunks holding a sentence of a gold evidence paragraph",
                "negatives": "top hybrid-retrieved non-evidence chunks, same paper and other papers",
            },
            training={**cfg.model_dump(), **stats.model_dump()},
            validation={
                "fused_order": baseline,
                "fp32": runs["fp32"][2],
                "int8": runs["int8"][2],
                "chosen": chosen,
                "int8_ndcg_drop": round(drop, 4),
                "median_ms_per_list": {"fp32": round(runs["fp32"][1], 1), "int8": round(runs["int8"][1], 1)},
                **calib.validation,
            },
            bars=calib.bars,
            fusion_weight=calib.fusion_weight,
            calibration={**calib.calibration, "total_seconds": round(time.perf_counter() - t_start, 1)},
        )
        install_model(work, out_dir, card)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return card
