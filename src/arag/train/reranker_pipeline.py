"""The whole ``arag train reranker`` run: mine, then :func:`arag.train.trainer.train_and_install`
(train, export, choose int8 or fp32) with this module's evaluator (ranking metrics of candidate
lists) and card (the fusion weight and bars). By default the model is trained on QASPER train less
one paper in ten, and chosen and calibrated on those held-out papers' questions, so that nothing is
fit on validation, which the evals report on."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from arag.corpus.qasper_questions import (
    HELD_OUT_NAME,
    EvalQuestion,
    default_questions_path,
    load_questions,
    split_held_out,
)
from arag.index.store import Store
from arag.library.build import Progress
from arag.models.embedder import BaseEmbedder
from arag.models.reranker import ModelCard, OnnxReranker, replace_card
from arag.settings import Settings
from arag.train.calibrate import calibrate_reranker
from arag.train.data import Candidates, MinedQuestion, cache_key, cached, candidates_for, mine_question
from arag.train.metrics import rank_metrics
from arag.train.reranker import TrainConfig, require_torch
from arag.train.trainer import (
    ProgressFactory,
    Trained,
    each,
    in_library,
    library_key,
    mining_retrievers,
    quiet,
    train_and_install,
)

log = logging.getLogger(__name__)

RERANK_BUDGET_MS = 150.0


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


@dataclass
class RankingEvaluator:
    """The reranker on validation candidate lists: Recall / nDCG / MRR of the reordered lists."""

    val: list[Candidates]
    max_length: int | None
    unit: str = "questions"
    metric: str = "ndcg@10"
    # One sub-query's retrieval should take at most 150 ms on 2 cores, and reranking its 25
    # candidates is most of it: a model slower than this per list is over that budget.
    budget_ms: float | None = RERANK_BUDGET_MS

    @property
    def size(self) -> int:
        return len(self.val)

    def sample(self) -> tuple[str, list[str]]:
        return self.val[0].query, self.val[0].texts[:4]

    def score(self, model: OnnxReranker, bar: Progress) -> tuple[list[np.ndarray], float]:
        return score_all(model, self.val, bar.advance)

    def metrics(self, scores: Any) -> dict[str, Any]:
        return rank_metrics(self.val, scores)


def calibration_split(
    train_path: Path, val_path: Path | None, train_limit: int | None = None, val_limit: int | None = None
) -> tuple[list[EvalQuestion], list[EvalQuestion], str]:
    """(training questions, questions to choose and calibrate on, the latter's name). Without
    ``val_path`` the second are the held-out train papers' and the first the other train papers';
    with it, every question of ``train_path`` and those of ``val_path``. Limits cut each list."""
    if val_path is None:
        train, held = split_held_out(load_questions(train_path), lambda q: q.paper_id)
        return train[:train_limit], held[:val_limit], f"{train_path.name}: {HELD_OUT_NAME}"
    return (
        load_questions(train_path, limit=train_limit),
        load_questions(val_path, limit=val_limit),
        val_path.name,
    )


def recalibrate(
    settings: Settings,
    val_path: Path | None = None,
    *,
    train_path: Path | None = None,
    progress: ProgressFactory = quiet,
) -> ModelCard:
    """Refit the installed model's fusion weight and bars (the weights are untouched) on ``val_path``,
    or by default on the held-out papers of ``train_path`` (default QASPER train)."""
    model = OnnxReranker(
        settings.reranker_dir, threads=settings.rerank.threads, max_length=settings.rerank.max_length
    )
    if val_path is None:
        _, val_raw, val_name = calibration_split(train_path or default_questions_path("train"), None)
    else:  # no train file to read
        val_raw, val_name = load_questions(val_path), val_path.name
    if val_path is None and HELD_OUT_NAME not in str(model.card.data.get("validation", "")):
        # A model made before the split trained on the held-out papers too.
        log.warning(
            "the installed reranker was trained on every train question, the held-out ones included: "
            "its bars are now fit on questions it has seen; retrain it (arag train reranker --force)"
        )
    with mining_retrievers(settings) as (store, _, resolving):
        val_qs = in_library(val_raw, store.paper_ids(), "calibration")
        val = each(
            progress,
            "calibration candidates",
            "questions",
            val_qs,
            lambda q: candidates_for(q, resolving),
        )
    with progress("scoring", "questions") as bar:
        bar.start(len(val))
        scores, ms = score_all(model, val, bar.advance)
    calib = calibrate_reranker(val, scores, settings)
    card = model.card.model_copy(
        update={
            "bars": calib.bars,
            "fusion_weight": calib.fusion_weight,
            "inference_max_length": model.max_length,
            "data": {**model.card.data, "validation": val_name, "validation_questions": len(val)},
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


def train_reranker(
    settings: Settings,
    cfg: TrainConfig,
    *,
    train_path: Path,
    val_path: Path | None = None,
    train_limit: int | None = None,
    val_limit: int | None = None,
    progress: ProgressFactory = quiet,
    library: tuple[Store, BaseEmbedder] | None = None,
) -> ModelCard:
    """Train, export, calibrate and install the reranker into ``settings.reranker_dir``; chosen and
    calibrated on ``val_path``, by default on the held-out papers of ``train_path``. ``library``: mine
    through a store and embedder this process holds open (the service trains in the background); it
    is left open."""
    require_torch()
    t_start = time.perf_counter()
    with mining_retrievers(settings, library) as (store, plain, resolving):
        papers = store.paper_ids()
        train_raw, val_raw, val_name = calibration_split(train_path, val_path, train_limit, val_limit)
        train_qs = in_library(train_raw, papers, "training")
        val_qs = in_library(val_raw, papers, "calibration")
        lib = library_key(settings)
        cache = settings.cache_dir / "reranker"
        # The held-out split trains on fewer questions than the whole file: its own cache entries.
        tag = f"{train_limit}-{val_limit}" + ("-held-out" if val_path is None else "")
        mined: list[MinedQuestion] = cached(
            cache / f"train-{cache_key(train_path, lib, tag)}.json",
            MinedQuestion,
            lambda: each(
                progress, "mining train", "questions", train_qs, lambda q: mine_question(q, plain, resolving)
            ),
        )
        val: list[Candidates] = cached(
            cache / f"val-{cache_key(val_path or train_path, lib, tag)}.json",
            Candidates,
            lambda: each(
                progress,
                "calibration candidates",
                "questions",
                val_qs,
                lambda q: candidates_for(q, resolving),
            ),
        )

    def card(t: Trained) -> ModelCard:
        calib = calibrate_reranker(val, t.runs[t.chosen].scores, settings)
        baseline = rank_metrics(val, [-np.arange(len(c.texts), dtype=np.float32) for c in val])
        runs = t.runs
        return ModelCard(
            model_id=f"minilm-l{cfg.layers}-qasper-{t.digest[:8]}",
            inference_max_length=cfg.inference_max_length,
            **t.card_fields(),
            data={
                "train": str(train_path.name),
                "train_questions": len(mined),
                "train_questions_with_positive": sum(1 for m in mined if m.positives),
                "validation": val_name,
                "validation_questions": len(val),
                "candidates": "library-wide hybrid + paper resolution, fused top "
                f"{settings.retrieval.fused_k}; query: \"In the paper '<title>': <question>\"",
                "positives": "chunks holding a sentence of a gold evidence paragraph",
                "negatives": "top hybrid-retrieved non-evidence chunks, same paper and other papers",
            },
            validation={
                "fused_order": baseline,
                "fp32": runs["fp32"].metrics,
                "int8": runs["int8"].metrics,
                "chosen": t.chosen,
                "int8_ndcg_drop": round(t.drop, 4),
                "median_ms_per_list": {"fp32": round(runs["fp32"].ms, 1), "int8": round(runs["int8"].ms, 1)},
                # --quantize auto keeps int8 when fp32 is over this, whatever int8's drop.
                "budget_ms_per_list": RERANK_BUDGET_MS,
                **calib.validation,
            },
            bars=calib.bars,
            fusion_weight=calib.fusion_weight,
            calibration={**calib.calibration, "total_seconds": round(time.perf_counter() - t_start, 1)},
        )

    evaluator = RankingEvaluator(val, cfg.inference_max_length)
    return train_and_install(
        mined, cfg, settings.reranker_dir, evaluator, card, prefix=".reranker-", progress=progress
    )
