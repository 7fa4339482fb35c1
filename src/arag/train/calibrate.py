"""Scoring a reranker on labelled candidate lists: ranking metrics, the kept set's evidence F1, the
bars that maximise it, and the score histogram recorded in the model card. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from arag.eval.retrieval import mrr_at, ndcg_at, recall_at
from arag.models.reranker import Bars
from arag.retrieval.rerank import combine, select_kept
from arag.train.data import Candidates

# One score per candidate, per question (lists or numpy arrays).
ScoreLists = Sequence[Sequence[float] | np.ndarray]


def reranked_order(scores: Sequence[float] | np.ndarray) -> list[int]:
    """Candidate indices by score, best first; ties keep the fused order."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def rank_metrics(cands: Sequence[Candidates], scores: ScoreLists) -> dict[str, float]:
    """Mean Recall@5/10, nDCG@10 and MRR@10 of each list reordered by ``scores``."""
    out: dict[str, list[float]] = {"recall@5": [], "recall@10": [], "ndcg@10": [], "mrr@10": []}
    for c, s in zip(cands, scores, strict=True):
        hits = [set(c.hits[i]) for i in reranked_order(s)]
        out["recall@5"].append(recall_at(hits, c.n_gold, 5))
        out["recall@10"].append(recall_at(hits, c.n_gold, 10))
        out["ndcg@10"].append(ndcg_at(hits, c.n_gold, 10))
        out["mrr@10"].append(mrr_at(hits, 10))
    return {k: float(np.mean(v)) if v else 0.0 for k, v in out.items()}


def kept_f1(
    cands: Sequence[Candidates],
    scores: ScoreLists,
    bars: Bars | None,
    *,
    keep: int = 8,
    supported_rank: int = 10,
) -> dict[str, float]:
    """Mean precision, recall and F1 of the kept chunks against the gold paragraphs (QASPER's
    Evidence-F1 on chunks: a kept chunk is right when it holds part of a gold paragraph; an empty
    kept set scores 0, since every question here has evidence), and the mean kept count."""
    p_all, r_all, f_all, n_all = [], [], [], []
    for c, s in zip(cands, scores, strict=True):
        idx = select_kept(list(s), list(range(1, len(s) + 1)), bars, keep=keep, supported_rank=supported_rank)
        n_all.append(len(idx))
        if not idx:
            p_all.append(0.0)
            r_all.append(0.0)
            f_all.append(0.0)
            continue
        good = sum(1 for i in idx if c.hits[i])
        found = set().union(*(set(c.hits[i]) for i in idx))
        p = good / len(idx)
        r = len(found) / c.n_gold if c.n_gold else 0.0
        p_all.append(p)
        r_all.append(r)
        f_all.append(2 * p * r / (p + r) if p + r else 0.0)
    return {
        "precision": float(np.mean(p_all)) if p_all else 0.0,
        "recall": float(np.mean(r_all)) if r_all else 0.0,
        "f1": float(np.mean(f_all)) if f_all else 0.0,
        "kept_mean": float(np.mean(n_all)) if n_all else 0.0,
    }


def calibrate_bars(
    cands: Sequence[Candidates],
    scores: ScoreLists,
    *,
    keep: int = 8,
    supported_rank: int = 10,
    grid: int = 24,
) -> tuple[Bars, dict[str, float]]:
    """The (lower, upper >= lower) pair, from score quantiles, with the best mean kept-set F1."""
    flat = np.concatenate([np.asarray(s, dtype=np.float64) for s in scores if len(s)])
    qs = np.unique(np.round(np.quantile(flat, np.linspace(0.02, 0.98, grid)), 4))
    best: tuple[float, Bars, dict[str, float]] | None = None
    for lo in qs:
        for hi in qs[qs >= lo]:
            bars = Bars(lower=float(lo), upper=float(hi))
            m = kept_f1(cands, scores, bars, keep=keep, supported_rank=supported_rank)
            if best is None or m["f1"] > best[0] + 1e-12:
                best = (m["f1"], bars, m)
    assert best is not None
    return best[1], best[2]


def score_histogram(
    cands: Sequence[Candidates],
    scores: ScoreLists,
    *,
    bins: int = 20,
    supported_rank: int = 10,
) -> dict[str, object]:
    """Counts of evidence / other candidates per score bin, split by fused rank group."""
    flat = np.concatenate([np.asarray(s, dtype=np.float64) for s in scores if len(s)])
    edges = np.linspace(float(flat.min()), float(flat.max()), bins + 1)
    groups: dict[str, list[float]] = {
        "top_evidence": [],
        "top_other": [],
        "rest_evidence": [],
        "rest_other": [],
    }
    for c, s in zip(cands, scores, strict=True):
        for i, x in enumerate(s):
            where = "top" if i + 1 <= supported_rank else "rest"
            what = "evidence" if c.hits[i] else "other"
            groups[f"{where}_{what}"].append(float(x))
    return {
        "edges": [round(float(e), 4) for e in edges],
        **{k: np.histogram(v, bins=edges)[0].tolist() for k, v in groups.items()},
    }


WEIGHT_GRID = tuple(round(0.1 * i, 2) for i in range(0, 41))


def combined_scores(scores: ScoreLists, weight: float) -> list[list[float]]:
    """Each list's model scores plus ``weight * -ln(fused rank)`` (see ``retrieval.rerank.combine``)."""
    return [combine(s, list(range(1, len(s) + 1)), weight) for s in scores]


def fit_fusion_weight(
    cands: Sequence[Candidates], scores: ScoreLists, *, grid: Sequence[float] = WEIGHT_GRID
) -> tuple[float, dict[str, float]]:
    """The weight of the fused rank that maximises mean nDCG@10 over ``cands``, and a two-fold
    cross-fitted nDCG@10 (the weight fit on one half, scored on the other) that says how much of
    the gain survives on questions the weight was not fit on."""

    def best(idx: Sequence[int]) -> tuple[float, float]:
        sub = [cands[i] for i in idx]
        sub_scores = [scores[i] for i in idx]
        top = (-1.0, 0.0)
        for w in grid:
            nd = rank_metrics(sub, combined_scores(sub_scores, w))["ndcg@10"]
            if nd > top[0] + 1e-12:
                top = (nd, w)
        return top[1], top[0]

    n = len(cands)
    weight, ndcg = best(range(n))
    halves = [list(range(0, n, 2)), list(range(1, n, 2))]
    crossed: list[float] = []
    for fit, held in (halves, halves[::-1]):
        w, _ = best(fit)
        sub = [cands[i] for i in held]
        crossed.append(rank_metrics(sub, combined_scores([scores[i] for i in held], w))["ndcg@10"])
    return weight, {"ndcg@10": ndcg, "ndcg@10_two_fold": float(np.mean(crossed)) if crossed else 0.0}
